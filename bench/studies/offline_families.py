"""Study: training steps per minute of each family read from captured features (offline) against the same family
with the target run inside every step (online), at its shipped recipe's settings, on the same data. Run it alone.

    .venv/bin/python bench/studies/offline_families.py --rows 40 --steps 12 --skip 3

The recipes' data (builtin:stdlib, prepared with the recipes' prepare options) is prepared twice under --out:
whole, for the draft vocabulary the recipes read, and its first --rows conversations, which both modes train on
(the rate of a step does not depend on how many samples there are, and a small set keeps the capture short). One
capture of the layers the recipes share (their data.capture_layers: DFlash's five and the last) is made once and
timed; then each family trains --steps steps offline and --steps online, in turn (offline first for every other
family), from the same seed: the same batches in the same order. A step's time is what the trainer logs (tokens /
tokens_per_s: forward, backward and optimizer step; online also the target's forward); the first --skip steps of
each run are left out. Prints steps/min per mode and their ratio (issue 66 asks for >= 4x), and writes
OUT/offline_families.json. Study, not measured: no record is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/

from common import read_log, train  # noqa: E402
from draftsmith.config import load  # noqa: E402
from draftsmith.data.prepared import load_prepared, prepare  # noqa: E402
from draftsmith.target import load_target  # noqa: E402
from draftsmith.train.config import TrainConfig, prepare_config  # noqa: E402
from draftsmith.train.data import capture_once  # noqa: E402

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m"
FAMILIES = ["eagle1", "medusa1", "mtp", "mtp-shared", "dflash", "dspark", "draft-lm"]

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--families", nargs="+", default=FAMILIES, help="recipes of recipes/smollm2-135m/ (no .yaml)")
parser.add_argument("--rows", type=int, default=40, help="conversations both modes train on (default 40)")
parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run (default 12)")
parser.add_argument("--skip", type=int, default=3, help="first steps of a run left out of its rate (default 3)")
parser.add_argument("--out", default="runs/offline-families", help="folder for data, capture, runs and the JSON")
parser.add_argument("--target", default="smollm2-135m-instruct", help="the recipes' target")
args = parser.parse_args()
out = Path(args.out)


def recipe(family: str, mode: str, data: Path, vocab: Path) -> TrainConfig:
    """The family's shipped recipe at its own settings, on the study's data, for `steps` steps, nothing else run."""
    config = load(TrainConfig, RECIPES / f"{family}.yaml", [
        f"target.name={args.target}", f"data.prepared={data}", f"data.features={out / 'features'}",
        f"data.online={'true' if mode == 'online' else 'false'}", f"train.max_steps={args.steps}",
        "train.max_minutes=0", "train.eval_every=0", "train.checkpoint_every=0", "eval.num_prompts=0",
        "eval.batches=1", "report.num_prompts=0", "tracking.report_to=[]",
        f"output_dir={out / 'runs' / family / mode}"])
    if config.data.draft_vocab:
        config.data.draft_vocab = str(vocab)
    return config


def steps_per_minute(run: Path) -> tuple[float, int]:
    """(steps/min over the logged steps after --skip, steps counted) from a run's metrics.jsonl."""
    steps = [r for r in read_log(run) if r.get("split") == "train"][args.skip:]
    seconds = sum(r["tokens"] / r["tokens_per_s"] for r in steps)
    return 60 * len(steps) / seconds, len(steps)


target = load_target(args.target, dtype="float32")
target.model.requires_grad_(False)
first = load(TrainConfig, RECIPES / f"{args.families[0]}.yaml", [f"target.name={args.target}"])
whole, data = out / "data-whole", out / "data"
for folder, rows in ((whole, 0), (data, args.rows)):
    if not (folder / "prepare_report.json").is_file():
        options = prepare_config(first)
        options.out, options.max_rows_per_input = str(folder), rows
        prepare(options, target=target)

split = load_prepared(data, target)["train"]
results = {"families": {}, "rows": args.rows, "steps": args.steps, "skip": args.skip, "target": args.target,
           "train_samples": len(split), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_average_at_start": os.getloadavg()[0]}  # other work on the machine slows both modes
# the shared capture: every recipe's data.capture_layers (the last layer among them), made once before any run
began = time.perf_counter()
capture_once(recipe(args.families[0], "offline", data, whole).data, target, [target.num_layers - 1], split)
results["capture_minutes"] = (time.perf_counter() - began) / 60
for number, family in enumerate(args.families):
    modes = ("offline", "online") if number % 2 == 0 else ("online", "offline")
    figures = {}
    for mode in modes:
        config = recipe(family, mode, data, whole)
        shutil.rmtree(config.output_dir, ignore_errors=True)  # a run of an earlier study would be resumed or refused
        train(config, target)
        figures[mode], counted = steps_per_minute(Path(config.output_dir))
    figures["ratio"] = figures["offline"] / figures["online"]
    results["families"][family] = {**figures, "steps_counted": counted}
    print(f"{family}: offline {figures['offline']:.1f} steps/min, online {figures['online']:.1f}, "
          f"{figures['ratio']:.2f}x", flush=True)

results["load_average_at_end"] = os.getloadavg()[0]
print(f"\nload average {results['load_average_at_start']:.2f} at the start, "
      f"{results['load_average_at_end']:.2f} at the end")
print(f"shared capture of {results['train_samples']} samples: {results.get('capture_minutes', 0):.2f} min")
print("| family | offline steps/min | online steps/min | offline / online |\n|---|---|---|---|")
for family, row in results["families"].items():
    print(f"| {family} | {row['offline']:.1f} | {row['online']:.1f} | {row['ratio']:.2f}x |")
(out / "offline_families.json").write_text(json.dumps(results, indent=2))
