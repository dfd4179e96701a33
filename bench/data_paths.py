"""The default recipe's data paths A/B'd: trainable tokens per data minute, and the drafter on unseen prompts.

    .venv/bin/python bench/data_paths.py --num-prompts 20 --set prepare.max_minutes=3 train.max_minutes=5 \
        --arm templates \
        --arm real prepare.input=[builtin:real] \
        --arm real-text prepare.input=[builtin:real-text] prepare.regenerate=false prepare.max_rows_per_input=600

Every arm is recipes/smollm2-135m/eagle3.yaml with the --set overrides, then its own (an arm with none is the recipe
as it ships), in folders of its own under --out: prepare (regeneration for prepare.max_minutes, or the text as it is
with the target's soft labels from the capture), capture, training for train.max_minutes. The data minutes (the
prepare report's and the capture manifest's own seconds) and the trainable tokens they gave are the data rate; each arm's best/ then decodes the
first --num-prompts of builtin:handwritten (hand-written prompts: the out-of-distribution check) and of
builtin:suite, drafter alone with the recipe's report chains and fallback, each against its own plain loop. Printed
and recorded per arm: data minutes, trainable tokens and tokens per data minute, training steps, and per prompt set
τ, first-position acceptance and speedup, overall and by category. One run is one seed: a recipe default changes on
repeated runs that agree, not on one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # bench/: the shared command line and the run's record

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-135m" / "eagle3.yaml"
DRAFTSMITH = [sys.executable, "-m", "draftsmith"]
PROMPT_SETS = ("builtin:handwritten", "builtin:suite")

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "SECTION.FIELD=VALUE"),
                    help="an arm: its name, then its recipe overrides (none: the recipe as it ships); repeatable")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="overrides of every arm (e.g. prepare.max_minutes=3 train.max_minutes=5)")
records.add_shared_options(parser, num_prompts=20, max_new_tokens=96, out="runs/bench-data-paths",
                           helps={"num_prompts": "prompts of each prompt set every arm decodes (the first N)",
                                  "out": "where every arm's data, features, runs and evaluations go"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
out = Path(args.out)

sys.path.insert(0, str(ROOT))
from draftsmith.config import load  # noqa: E402
from draftsmith.train.config import TrainConfig  # noqa: E402


def run(command: list[str]) -> None:
    """Run a draftsmith command from the repository root."""
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def arm_options(name: str, overrides: list[str]) -> list[str]:
    """The `draftsmith train` overrides of an arm: its own folders, no report, then --set, then its own."""
    folders = [f"data.prepared={out}/data-{name}", f"data.features={out}/features-{name}",
               f"data.draft_vocab={out}/data-{name}", f"output_dir={out}/{name}"]
    return ["resume=true", "report.num_prompts=0", "tracking.report_to=[]", *folders, *args.set, *overrides]


def evaluate(name: str, best: Path, prompts: str, draft_length: int, fallback: bool | None) -> dict:
    """`draftsmith eval` of an arm's best/ on `prompts`, drafter alone; the figures this bench keeps."""
    folder = out / "eval" / f"{name}-{prompts.replace(':', '-')}"
    command = [*DRAFTSMITH, "eval", "--target", "smollm2-135m-instruct", "--drafter", str(best), "--prompts",
               prompts, "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--draft-length", str(draft_length), "--no-transformers-baseline", "--out", str(folder)]
    if fallback is not None:
        command += ["--fallback", str(fallback).lower()]
    run(command)
    results = json.loads((folder / "results.json").read_text())
    return {"acceptance_length": results["acceptance_length"], "speedup": results["speedup"],
            "first_position_acceptance": (results.get("acceptance_per_position") or [None])[0],
            "lossless": results["lossless"],
            "per_category": {category: {key: row.get(key) for key in ("prompts", "acceptance_length", "speedup")}
                             for category, row in (results.get("per_category") or {}).items()}}


arms = {}
for name, *overrides in args.arm:
    options = arm_options(name, overrides)
    config = load(TrainConfig, RECIPE, options)  # the folders and options `draftsmith train` gets
    run([*DRAFTSMITH, "train", str(RECIPE), *options])
    prepared = json.loads((Path(config.data.prepared) / "prepare_report.json").read_text())
    manifest = json.loads((Path(config.data.features) / "manifest.json").read_text())
    data_seconds = prepared["seconds"] + manifest["seconds"]  # each step's own wall time, the target's load included
    training = json.loads((Path(config.output_dir) / "training.json").read_text())
    best = Path(config.output_dir) / "best"
    trainable = prepared.get("trainable_tokens")
    arms[name] = {"overrides": overrides, "inputs": (config.prepare or {}).get("input"),
                  "regenerate": (config.prepare or {}).get("regenerate"), "rows": prepared.get("rows_kept"),
                  "trainable_tokens": trainable, "data_minutes": round(data_seconds / 60, 2),
                  "tokens_per_data_minute": round(trainable / (data_seconds / 60)) if trainable and data_seconds else None,
                  "diversity": (prepared.get("diversity") or {}).get("overall"), "steps": training.get("steps"),
                  "drafter": str(best), "drafter_sha256": records.drafter_sha256(best),
                  "prompt_sets": {prompts: evaluate(name, best, prompts, config.report.draft_length,
                                                    config.report.fallback) for prompts in PROMPT_SETS}}

print(f"\n{'arm':<12} {'data min':>8} {'tokens':>9} {'tok/min':>8} {'steps':>6}  "
      + "  ".join(f"{p.split(':')[1]:>26}" for p in PROMPT_SETS))
for name, arm in arms.items():
    cells = [f"τ {s['acceptance_length']:.2f} α1 {s['first_position_acceptance'] or 0:.2f} {s['speedup']:.2f}x"
             for s in arm["prompt_sets"].values()]
    print(f"{name:<12} {arm['data_minutes']:8.1f} {arm['trainable_tokens'] or 0:9d} "
          f"{arm['tokens_per_data_minute'] or 0:8d} {arm['steps'] or 0:6d}  " + "  ".join(f"{c:>26}" for c in cells))
records.write("data_paths", {"num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                             "overrides": args.set, "arms": arms}, args)
