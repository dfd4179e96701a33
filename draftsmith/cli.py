"""The `draftsmith` command line: one subcommand per pipeline step.

Each subcommand lives in its own module with `register(subparsers)` and `run(args)`; adding one
means adding a line to COMMANDS. Errors the user can fix are printed as one paragraph without a
traceback; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from draftsmith.config import add_command
from draftsmith.errors import DraftsmithError, quiet_libraries

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
    parser = add_command(
        subparsers, "info",
        summary="Describe a target model (layers, sizes, default EAGLE-3 layers) or a drafter folder in any layout.",
        description="Load a target (hub id, local folder, .gguf file, or built-in alias such as "
        "smollm2-135m-instruct) and print what drafters need to know about it. Given a drafter folder (draftsmith's "
        "own or any layout `draftsmith export` writes), print its kind, layout, the target it expects and its size, "
        "from config.json and the safetensors headers alone; with --target, whether that target fits (checked "
        "before any drafter weight is read) and how much of a prompt set its draft vocabulary covers.",
    )
    parser.add_argument("subject", metavar="TARGET_OR_DRAFTER",
                        help="hub id, local model folder, .gguf file or built-in alias of a target; or a drafter folder")
    parser.add_argument("--target", help="drafters: the target to check the drafter against (any form a target takes)")
    parser.add_argument("--prompts", default="humaneval",
                        help="drafters with --target: prompts whose tokens the draft vocabulary's coverage is measured "
                        "on ('humaneval' or a .jsonl file; default humaneval)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--dtype", default="float32", help="dtype to load the weights in (default float32)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow custom modeling code from the model folder (off by default)")


def run(args: argparse.Namespace) -> int:
    """Print the facts about a target, or about a drafter folder (and whether --target fits it)."""
    from draftsmith.target import load_target

    folder = _drafter_folder(args.subject, args.target is not None)
    if folder is not None:
        facts = _drafter_facts(args, folder)
    else:
        if args.target is not None:
            raise DraftsmithError(f"--target is for drafter folders; '{args.subject}' is a target model.")
        target = load_target(args.subject, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
        facts = {
            "target": args.subject,
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


def _drafter_folder(subject: str, asked: bool):
    """The folder of `subject` when it is a drafter (a folder or a hub id), else None. A plain model is a target,
    unless --target makes it a draft model; with --target every subject must be a drafter (detection errors name
    what was found)."""
    from draftsmith.export import readers
    from draftsmith.hub import drafter_folder, is_hub_id

    try:
        folder = drafter_folder(subject)
    except DraftsmithError:
        if asked:
            raise
        return None  # a hub id that is not at hand: a target's loader says why in its own words
    if not (folder / "config.json").is_file():
        if asked and is_hub_id(subject):
            raise DraftsmithError(f"'{subject}' has no config.json: not a drafter this command can describe.")
        return None
    try:
        layout = readers.detect(readers.read_config(folder), folder)
    except DraftsmithError:
        if asked:
            raise
        return None
    return folder if asked or layout != "hf" else None


def _drafter_facts(args: argparse.Namespace, folder) -> dict:
    """kind, layout, the target a drafter folder expects, its size; with --target whether it fits and the coverage."""
    from draftsmith.export import readers

    expected = readers.expectations(folder)
    vocab = expected.vocab_size
    facts = {
        "drafter": args.subject, "layout": expected.layout, "kind": expected.kind, "variant": expected.variant,
        "expects_target": expected.target_name or "not recorded",
        "hidden_size": expected.hidden_size, "vocab_size": vocab,
        "num_layers": expected.num_layers if expected.num_layers is not None else "not recorded (any)",
        "layers_read": expected.layers if expected.layers is not None else "the last",
        "draft_vocab_size": expected.draft_vocab_size or "the whole vocabulary",
        "parameters": expected.parameters,
    }
    if expected.model_type:
        facts["architecture"] = expected.model_type
    if args.target is None:
        return facts
    from draftsmith.target import load_target

    target = load_target(args.target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    readers.check_fit(folder, expected, target)  # refuses here, before any drafter weight is read
    if expected.kind == "draft_lm":
        from transformers import AutoTokenizer

        from draftsmith.drafters.draft_lm import check_same_tokenizer

        check_same_tokenizer(AutoTokenizer.from_pretrained(folder), target.tokenizer, args.subject, target.name)
    facts["target"] = f"{args.target}: fits (hidden size {target.hidden_size}, vocabulary {target.vocab_size}, " \
                      f"{target.num_layers} layers)"
    facts["coverage"] = _coverage(readers.draft_token_ids(folder, expected), target, args.prompts)
    return facts


def _coverage(draft_ids, target, prompts: str) -> str:
    """The share of a prompt set's tokens (as the target tokenizes them) inside the draft vocabulary."""
    import torch

    from draftsmith.eval.prompts import load_prompts

    if draft_ids is None:
        return "100% (drafts over the whole vocabulary)"
    try:
        tokens = [i for prompt in load_prompts(prompts, target) for i in prompt.token_ids]
    except DraftsmithError as err:
        return f"not measured ({err})"
    inside = torch.zeros(target.vocab_size, dtype=torch.bool)
    inside[draft_ids] = True
    share = float(inside[torch.tensor(tokens, dtype=torch.long)].float().mean()) if tokens else 0.0
    return f"{100 * share:.1f}% of the {len(tokens)} tokens of {prompts}'s prompts are in its {len(draft_ids)}-token " \
           "draft vocabulary"


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
        quiet_libraries()
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
