"""`draftsmith train RECIPE.yaml [section.field=value ...]` (also under `accelerate launch -m draftsmith`)."""

from __future__ import annotations

import argparse

from draftsmith.config import add_command, describe, load
from draftsmith.train.config import TrainConfig


def _help_text() -> str:
    lines = ["recipe keys (set in the YAML or override as section.field=value):", *describe(TrainConfig)]
    from draftsmith.drafters import KINDS, kind_module

    for kind in KINDS:
        try:
            options = describe(kind_module(kind).Config, prefix="drafter.")
        except ImportError:
            continue
        lines += [f"drafter options for kind: {kind}", *options]
    return "\n".join(lines)


EPILOG = "recipe keys"  # placeholder; the formatter expands it only when help is shown


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Builds the recipe-key list only for --help (it imports the drafter kinds, which is slow)."""

    def add_text(self, text):
        super().add_text(_help_text() if text is EPILOG else text)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `train` subcommand."""
    parser = add_command(
        subparsers, "train",
        summary="Train a drafter from a YAML recipe (single process, or DDP/DeepSpeed/FSDP via accelerate launch).",
        description="Train a drafter against a frozen target. Run it plainly for one process, or as "
        "`accelerate launch --config_file recipes/accelerate/NAME.yaml -m draftsmith train ...` for DDP, "
        "DeepSpeed ZeRO-2/3 or FSDP. Writes OUTPUT_DIR/checkpoint-<step>/, latest, best/ (the drafter with "
        "the best validation acceptance length) and metrics.jsonl. resume=true continues exactly.",
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("recipe", help="YAML recipe, e.g. recipes/smollm2-135m/eagle3.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.field=value",
                        help="recipe overrides, e.g. train.max_steps=100 output_dir=runs/x resume=true")


def run(args: argparse.Namespace) -> int:
    """Prepare the data if the recipe asks, train, then report on best/ (the whole pipeline)."""
    import os
    import time

    from draftsmith.train import pipeline
    from draftsmith.train.builders import share_cpu_threads
    from draftsmith.train.recipe import TrainRecipe

    config = load(TrainConfig, args.recipe, args.overrides)
    threads = share_cpu_threads()  # before any torch work: oversubscribed CPU processes crawl
    if threads and os.environ.get("RANK", "0") == "0":
        print(threads, flush=True)
    start = time.monotonic()
    recipe = TrainRecipe(config)
    pipeline.ensure_prepared(config, recipe.load_target())
    prepared = time.monotonic()
    recipe.setup()
    try:
        recipe.train()
    finally:
        recipe.cleanup()
    if not recipe.main:
        return 0
    trained = time.monotonic()
    score = f"{recipe.best_score:.3f}" if recipe.best_score is not None else "n/a"
    print(f"best drafter: {recipe.output_dir / 'best'} ({recipe.config.eval.select_by} acceptance length {score} at "
          f"step {recipe.best_step})")
    pipeline.write_training_facts(config, recipe, args.recipe, trained - start)
    if recipe.target.sharded and config.report.num_prompts:
        print("final report skipped: the target is sharded over the processes and the decoder needs it whole in "
              f"one; run `draftsmith eval --drafter {recipe.output_dir / 'best'}` where it fits, or serve the export")
    else:
        pipeline.final_report(config, recipe.target)
    done = time.monotonic()
    print(f"time: target and data {(prepared - start) / 60:.1f} min, training {(trained - prepared) / 60:.1f} min, "
          f"report {(done - trained) / 60:.1f} min; {(done - start) / 60:.1f} min in all", flush=True)
    return 0
