"""Denormal floats and a trained drafter's step time: one EAGLE training step (forward, loss, backward) of a saved
drafter timed with the CPU's flush-to-zero mode off and on, each in its own process (the mode must be set before
torch's threads start; `flush_denormals`). Run it alone.

    .venv/bin/python bench/studies/denormals.py runs/bench-eagle3/eagle3-v2048/checkpoint-2916/drafter \
        runs/bench-eagle3/probe/best --features runs/bench-eagle3/features

Each drafter folder is timed on the same batch of 4 captured conversations; printed: the median step in ms with
the mode off and on, and their ratio. A drafter early in training has few denormals (ratio near 1); the
sharper distributions of a trained one make ever more.

Study, settled: every CLI command (and TrainRecipe.setup) sets the CPU's flush-to-zero mode before torch starts its
threads (`flush_denormals`). Measured on 2026-12-01 on a 2-core Xeon (AVX512-BF16, no AMX), alone: 662 -> 427 ms
(1.55x) per step for the drafter of step 2916, 763 -> 530 ms (1.44x) in a second run; the barely trained drafter of
step 16 had next to nothing to flush.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("drafters", nargs="+", help="EAGLE drafter folders (a run's best/ or checkpoint-N/drafter)")
parser.add_argument("--features", required=True, help="a capture folder the drafters' layers are in")
parser.add_argument("--target", default="smollm2-135m-instruct")
parser.add_argument("--repeats", type=int, default=6, help="timed steps per process; the median counts (default 6)")
parser.add_argument("--first", type=int, default=40, help="index of the batch's first conversation (default 40)")
parser.add_argument("--time-one", nargs=2, metavar=("FOLDER", "FLUSH"), help=argparse.SUPPRESS)  # the child process
args = parser.parse_args()

if args.time_one:
    import time

    sys.path.insert(0, str(ROOT))
    from draftsmith.target import flush_denormals, load_target

    if args.time_one[1] == "1":
        flush_denormals()  # before anything starts torch's threads
    from draftsmith.data.capture import FeatureShards, collate
    from draftsmith.drafters import eagle

    target = load_target(args.target)
    target.model.requires_grad_(False)
    drafter = eagle.Drafter.from_pretrained(args.time_one[0], target)
    shards = FeatureShards(args.features)
    batch = collate([shards[i] for i in range(args.first, args.first + 4)])
    batch["features"] = {layer: value.float() for layer, value in batch["features"].items()}

    def step():
        drafter.zero_grad()
        drafter.loss(batch, target.head)[0].backward()

    step()
    times = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - began))
    print(statistics.median(times))
    sys.exit(0)

print(f"{'drafter':<70} {'off, ms':>8} {'on, ms':>8} {'off/on':>7}")
for folder in args.drafters:
    ms = {}
    for flush in ("0", "1"):
        command = [sys.executable, __file__, folder, "--features", args.features, "--target", args.target,
                   "--repeats", str(args.repeats), "--first", str(args.first), "--time-one", folder, flush]
        ms[flush] = float(subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()[-1])
    print(f"{folder:<70} {ms['0']:8.0f} {ms['1']:8.0f} {ms['0'] / ms['1']:6.2f}x")
