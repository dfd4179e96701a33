"""P-EAGLE against EAGLE-3 chains of the same length: same data, same training budget, decoded side by side.

    .venv/bin/python bench/parallel_drafting.py --length 4 --minutes 4 --num-prompts 20

Runs bench/families.py on the two recipes (recipes/smollm2-135m/eagle3.yaml and peagle.yaml), both trained for
--length steps (drafter.ttt_steps) at the same wall-time budget on the default recipe's data and both decoding
chains of --length on the same HumanEval prompts, interleaved prompt by prompt with the plain loop. Then it adds
what parallel drafting is for: P-EAGLE's drafter milliseconds per verify pass over EAGLE-3's (one forward for the
whole chain against one per drafted token), its τ over EAGLE-3's, and both speedups over the plain loop. The
record goes to results/parallel_drafting/ (families.py itself records nothing here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--length", type=int, default=4, help="chain length both drafters are trained for and draft")
parser.add_argument("--minutes", type=float, default=10.0, help="training wall-time budget per drafter")
parser.add_argument("--tree", default=None, metavar="DEPTH,TOPK,TOTAL",
                    help="also decode both as this EAGLE-2 tree (P-EAGLE's from its per-position top-k)")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="overrides of both recipes (passed to families.py --set)")
parser.add_argument("--peagle-set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="overrides of the P-EAGLE recipe alone (e.g. drafter.num_layers=2)")
records.add_shared_options(parser, num_prompts=20, max_new_tokens=128, out="runs/bench-parallel-drafting", threads=0,
                           helps={"out": "where families.py puts its runs and bench.json"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything

command = [sys.executable, str(ROOT / "bench" / "families.py"), "--families", "eagle3", "--family", "peagle", "peagle",
           *args.peagle_set,
           "--minutes", str(args.minutes), "--num-prompts", str(args.num_prompts),
           "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
           "--draft-length", str(args.length), "--without", "generate", "lookup", "--out", args.out, "--no-record",
           "--set", f"drafter.ttt_steps={args.length}", *args.set]
command += ["--tree", args.tree, "--trees", "eagle3", "peagle"] if args.tree else ["--trees"]
print("running:", " ".join(command), flush=True)
subprocess.run(command, check=True, cwd=ROOT)
result = json.loads((Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out).joinpath("bench.json").read_text())

chain = f"chain ({args.length})"
eagle3, peagle = result["methods"][f"eagle3 {chain}"], result["methods"][f"peagle {chain}"]
result["parallel_drafting"] = {
    "length": args.length,
    "peagle_overrides": args.peagle_set,
    "draft_ms_per_pass": {"eagle3": eagle3["draft_ms_per_cycle"], "peagle": peagle["draft_ms_per_cycle"]},
    "draft_ms_ratio": peagle["draft_ms_per_cycle"] / eagle3["draft_ms_per_cycle"],
    "tau": {"eagle3": eagle3["acceptance_length"], "peagle": peagle["acceptance_length"]},
    "tau_ratio": peagle["acceptance_length"] / eagle3["acceptance_length"],
    "speedup_vs_plain": {"eagle3": eagle3["speedup_vs_plain"], "peagle": peagle["speedup_vs_plain"]},
    "identical_to_plain": {"eagle3": eagle3["identical_to_plain"], "peagle": peagle["identical_to_plain"]},
}
summary = result["parallel_drafting"]
print(f"chains of {args.length}: P-EAGLE drafts in {summary['draft_ms_per_pass']['peagle']:.1f} ms per verify pass, "
      f"EAGLE-3 in {summary['draft_ms_per_pass']['eagle3']:.1f} ms ({summary['draft_ms_ratio']:.2f}x); "
      f"τ {summary['tau']['peagle']:.2f} against {summary['tau']['eagle3']:.2f} ({summary['tau_ratio']:.2f}x); "
      f"speedup vs plain {summary['speedup_vs_plain']['peagle']:.2f}x against "
      f"{summary['speedup_vs_plain']['eagle3']:.2f}x")
records.write("parallel_drafting", result, args)
