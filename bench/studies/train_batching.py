"""Training throughput with and without batching by length, as a ratio measured in one run.

    .venv/bin/python bench/studies/train_batching.py --steps 16 --rounds 2

Trains the default recipe (recipes/smollm2-135m/eagle3.yaml, online capture) for --steps optimizer
steps (after 2 warm-up steps that are not counted) with data.group_by_length=true and =false,
alternating over --rounds rounds in one process, and prints real (non-padding) tokens per second of
each, their ratio, and the share of every batch that was padding. Validation, checkpoints and the
final report are off; the runs go to a temporary folder.

Study, settled: batching samples of similar length pays, so `data.group_by_length` is on by default. Measured
on 2026-11-29 (commit 7fa5bb3; the machine kind was not recorded) with `--steps 10 --rounds 2`: 120 against 76 real
tokens/s, 1.57x, as padding fell from 34% to 4% of every batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from draftsmith.config import load  # noqa: E402
from draftsmith.train import pipeline  # noqa: E402
from draftsmith.train.config import TrainConfig  # noqa: E402
from draftsmith.train.recipe import TrainRecipe  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m" / "eagle3.yaml"
WARM_UP = 2

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=int, default=16, help="counted optimizer steps per run")
parser.add_argument("--rounds", type=int, default=2, help="runs per setting, alternating")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE", help="extra recipe overrides")
args = parser.parse_args()

scratch = Path(tempfile.mkdtemp(prefix="draftsmith-bench-batching-"))
target = None
totals = {True: {"tokens": 0.0, "seconds": 0.0, "padded": 0.0}, False: {"tokens": 0.0, "seconds": 0.0, "padded": 0.0}}
for round_ in range(args.rounds):
    for grouped in ((True, False) if round_ % 2 == 0 else (False, True)):
        folder = scratch / f"run-{round_}-{'grouped' if grouped else 'shuffled'}"
        config = load(TrainConfig, RECIPE, [
            f"output_dir={folder}", f"train.max_steps={WARM_UP + args.steps}", "train.eval_every=0",
            "train.checkpoint_every=0", "eval.num_prompts=0", "eval.batches=1", "report.num_prompts=0",
            "tracking.report_to=[]", f"data.group_by_length={str(grouped).lower()}", *args.set])
        recipe = TrainRecipe(config, target=target)
        target = recipe.load_target()
        pipeline.ensure_prepared(config, target)
        recipe.setup()
        try:
            recipe.train()
        finally:
            recipe.cleanup()
        log = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
        counted = [r for r in log if r.get("split") == "train" and r["step"] > WARM_UP]
        totals[grouped]["tokens"] += sum(r["tokens"] for r in counted)
        totals[grouped]["seconds"] += sum(r["tokens"] / r["tokens_per_s"] for r in counted)
        lengths = recipe.data.train.lengths()
        accum = config.train.grad_accum
        for record in counted:  # padded size of that step's micro-batches: batch size x the longest sample
            for index in range((record["step"] - 1) * accum, record["step"] * accum):
                batch = recipe.order.micro_batch(index)
                totals[grouped]["padded"] += len(batch) * max(min(lengths[i], config.data.max_length) for i in batch)
        print(f"round {round_ + 1}, group_by_length={grouped}: {sum(r['tokens'] for r in counted):.0f} tokens in "
              f"{sum(r['tokens'] / r['tokens_per_s'] for r in counted):.1f} s", flush=True)

rate = {g: t["tokens"] / t["seconds"] for g, t in totals.items()}
print(f"\n{args.rounds} rounds x {args.steps} steps per setting, batch size {config.data.batch_size}, max length "
      f"{config.data.max_length}, online capture")
for grouped in (True, False):
    print(f"  group_by_length={str(grouped):<5}  {rate[grouped]:7.1f} real tokens/s   padding "
          f"{1 - totals[grouped]['tokens'] / totals[grouped]['padded']:.0%} of every batch")
print(f"grouped / shuffled: {rate[True] / rate[False]:.2f}x real tokens per second")
