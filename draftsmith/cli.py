"""The `draftsmith` command line: one subcommand per pipeline step.

Each subcommand lives in its own module with `register(subparsers)` and `run(args)`; adding one
means adding a line to COMMANDS. Errors the user can fix are printed as one paragraph without a
traceback; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys

from draftsmith.errors import DraftsmithError

# subcommand -> module that defines register(subparsers) and run(args)
COMMANDS = {
    "info": "draftsmith.cli",
    "prepare": "draftsmith.data.commands",
    "capture": "draftsmith.data.commands",
    "import-features": "draftsmith.data.engine_import",
    "train": "draftsmith.train.command",
    "eval": "draftsmith.eval.command",
    "export": "draftsmith.export",
    "serve-sim": "draftsmith.serving.command",
}


# --------------------------------------------------------------------------- info
def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `info` subcommand."""
    parser = subparsers.add_parser(
        "info",
        help="Describe a target model: layers, sizes, dtype, chat template, default EAGLE-3 layers.",
        description="Load a target (hub id, local folder, .gguf file, or built-in alias such as "
        "smollm2-135m-instruct) and print what drafters need to know about it.",
    )
    parser.add_argument("target", help="hub id, local model folder, .gguf file, or built-in alias")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--dtype", default="float32", help="dtype to load the weights in (default float32)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow custom modeling code from the model folder (off by default)")


def run(args: argparse.Namespace) -> int:
    """Print the facts about a target."""
    from draftsmith.target import load_target

    target = load_target(args.target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    facts = {
        "target": args.target,
        "architecture": type(target.model).__name__,
        "num_layers": target.num_layers,
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "dtype": str(target.dtype).removeprefix("torch."),
        "chat_template": target.has_chat_template,
        "eagle3_layers": target.default_eagle3_layers() if target.num_layers >= 7 else None,
        "parameters": sum(p.numel() for p in target.model.parameters()),
    }
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        width = max(len(k) for k in facts)
        for key, value in facts.items():
            print(f"{key:<{width}}  {value}")
    return 0


# --------------------------------------------------------------------------- entry point
def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="draftsmith",
        description="Train drafters for speculative decoding, measure them, and ship them.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    registered = set()
    for module_name in COMMANDS.values():
        if module_name in registered:
            continue
        registered.add(module_name)
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, dispatch to the subcommand, turn user errors into one paragraph."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("DRAFTSMITH_DEBUG") == "1"
    if not debug:
        _quiet_libraries()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        from draftsmith.target import flush_denormals

        flush_denormals()  # before any torch thread starts, so that every one inherits it
        module = importlib.import_module(COMMANDS[args.command])
        return module.run(args) or 0
    except DraftsmithError as err:
        if debug:
            raise
        print(f"draftsmith: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftsmith: interrupted", file=sys.stderr)
        return 130


def _quiet_libraries() -> None:
    """Keep library chatter (weight-loading bars, deprecation notes) out of the user's way."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
