"""Trained drafters decoded side by side: each drafts chains of --length on the same HumanEval prompts at T=0,
interleaved prompt by prompt with our plain loop, in one run. Run it alone.

    .venv/bin/python bench/studies/decode_drafters.py v2048=runs/levers/offline-ttt2-v2048/best \
        v8192=runs/levers/offline-ttt2-v8192/best --num-prompts 20 --length 2

Prints per drafter: the held-out figures of the step best/ was kept from (when the folder is a run's best/), the decoded τ, tokens/s and speedup over our plain loop, the draft-time fraction and how many
outputs equal the plain loop's. Results go to --out (JSON) when given.

Study, settled (with bench/studies/train_levers.py): the head size's held-out ranking holds when decoded. Measured
on 2026-12-01 on a 2-core Xeon (AVX512-BF16, no AMX), alone, 20 prompts, chains of 2: v2048 / v4096 / v8192 gave τ
1.473 / 1.452 / 1.446, 1.15x / 1.13x / 1.11x our plain loop, every output identical.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common.py

from common import chains_beside_plain, decode_interleaved, kept_as_best, method_rows  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("drafters", nargs="+", metavar="NAME=FOLDER", help="a name for the table and a drafter folder")
parser.add_argument("--target", default="smollm2-135m-instruct")
parser.add_argument("--length", type=int, default=2, help="chain length every drafter drafts (default 2)")
parser.add_argument("--num-prompts", type=int, default=20, help="HumanEval prompts (default 20)")
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--out", default=None, help="a JSON file for the results")
args = parser.parse_args()
folders = {}
for spec in args.drafters:
    name, _, folder = spec.partition("=")
    if not folder or not Path(folder).is_dir():
        parser.error(f"'{spec}' is not NAME=FOLDER with an existing folder")
    folders[name] = Path(folder)
held_out = {name: kept_as_best(folder.parent) if folder.name == "best" else {} for name, folder in folders.items()}

target = load_target(args.target)
prompts = load_prompts("humaneval", target, args.num_prompts)
results = method_rows(decode_interleaved(chains_beside_plain(target, folders, args.length, args.max_new_tokens), prompts),
                      "plain", "plain")
print(f"{'drafter':<14} {'acc_0':>6} {'acc_1':>6} {'decoded τ':>9} {'tok/s':>7} {'vs plain':>9} {'draft frac':>10} identical")
for name in folders:
    logged, row = held_out[name], results[name]
    print(f"{name:<14} {logged.get('acc_0', float('nan')):6.3f} {logged.get('acc_1', float('nan')):6.3f} "
          f"{row['acceptance_length']:9.3f} {row['tokens_per_s']:7.2f} {row['speedup_vs_plain']:8.2f}x "
          f"{row['draft_time_fraction']:10.3f} {row['identical_to_plain']:>4}/{len(prompts)}")
print(f"plain {results['plain']['tokens_per_s']:.2f} tok/s; chains of {args.length}, {len(prompts)} prompts, "
      f"{args.max_new_tokens} new tokens")
if args.out:
    Path(args.out).write_text(json.dumps({"length": args.length, "prompts": len(prompts), "results": results,
                                          "held_out": held_out}, indent=2, default=str))
