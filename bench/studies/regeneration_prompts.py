"""What the regeneration benchmarks share: their command line and their prompts (builtin:stdlib-complete, the stub
half of the default recipe's regeneration input, in the order `prepare --regenerate` answers it).

Study helper: used by bench/studies/regenerate.py and bench/studies/data_dtype.py only.
"""

from __future__ import annotations

import argparse
import itertools

from draftsmith.data.regenerate import _size
from draftsmith.data.sources import read_rows


def parser(doc: str) -> argparse.ArgumentParser:
    """--rows, --batch-size, --max-new-tokens and --target, with `doc` as the help text."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="conversations to answer (default 64)")
    parser.add_argument("--batch-size", type=int, default=32, help="conversations per batch, as prepare.batch_size")
    parser.add_argument("--max-new-tokens", type=int, default=128,
                        help="longest response, as the default recipe's prepare.max_new_tokens (the README's runs: 192)")
    parser.add_argument("--target", default="smollm2-135m-instruct", help="target name, hub id, folder or .gguf")
    return parser


def prompts(rows: int) -> list[list[dict]]:
    """The first `rows` conversations of builtin:stdlib-complete up to their assistant turn, sorted by size."""
    records = [record["messages"] for _, _, record in itertools.islice(read_rows("builtin:stdlib-complete"), rows)]
    records.sort(key=_size)
    return [messages[: [m["role"] for m in messages].index("assistant")] for messages in records]
