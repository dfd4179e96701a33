"""Draft shapes of one trained drafter on SmolLM2-135M, measured side by side in one run: which chain length, cut or
tree pays on this machine.

    .venv/bin/python bench/studies/draft_shapes.py runs/smollm2-135m-instruct/eagle3/best --lengths 1 2 4 --cut 4 \
        --trees 4,4,8 --num-prompts 40

The same HumanEval prompts are decoded at T=0 with our plain loop and with the drafter as chains of each
--lengths, as chains of up to each --cut length cut by the drafter's confidence under the target's measured
verify-cost curve (`draftsmith eval --confidence-cut`), and as each --trees EAGLE-2 tree, every method
interleaved prompt by prompt. Printed per method: tokens/s, τ, per-position acceptance, draft milliseconds per
verify cycle, speedup against our plain loop, outputs identical to it (Medusa-2: to its tuned target's plain loop);
and the verify-cost curve t(n)/t(1) the cut read. Results go to --out as JSON.

Study: which draft shape pays for one trained drafter. Its run on a Medusa-1 drafter trained 420 steps
(alone; its date and machine kind not recorded beside it), `--lengths 1 2 --cut 3 --num-prompts 40`: a chain of 1 head τ 1.27,
1.14x our plain loop; a chain of 2 τ 1.33, 1.08x; chains of up to 3 cut by confidence τ 1.32, 1.08x. The canonical
per-family figures (chains, trees, cuts) are bench/families.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common.py

from common import decode_interleaved, method_rows, whole_chains  # noqa: E402
from draftsmith.drafters import DraftShape, Sampling  # noqa: E402
from draftsmith import small_batch  # noqa: E402
from draftsmith.eval.decoder import eos_ids, plain_generate, speculative_generate  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.eval.runner import environment, load_drafter  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("drafter", help="a trained drafter folder (best/ of a run)")
parser.add_argument("--target", default="smollm2-135m-instruct")
parser.add_argument("--lengths", nargs="*", type=int, default=[1, 2, 4], help="chain lengths drafted in full")
parser.add_argument("--cut", nargs="*", type=int, default=[4],
                    help="longest chains cut by the drafter's confidence under the verify-cost curve")
parser.add_argument("--trees", nargs="*", default=[], metavar="DEPTH,TOPK,TOTAL", help="EAGLE-2 tree shapes")
parser.add_argument("--num-prompts", type=int, default=40, help="HumanEval prompts decoded per method")
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--out", default=None, help="where the JSON goes (default: DRAFTER/../draft_shapes.json)")
args = parser.parse_args()
if any(n < 1 for n in args.lengths + args.cut):
    parser.error("--lengths and --cut take positive chain lengths")

GREEDY = Sampling()
target = load_target(args.target)
prompts = load_prompts("humaneval", target, args.num_prompts)
eos = eos_ids(target)
rows = small_batch.tune_and_install(target.model)["rows"]  # as draftsmith eval does
proposer = load_drafter(args.drafter, target)
small_batch.install_on_proposer(proposer, target, rows)
verifier = getattr(proposer, "verifier", None) or target  # Medusa-2: its tuned target verifies
methods = {"plain": lambda ids: plain_generate(verifier, ids, GREEDY, args.max_new_tokens, eos)}


def speculative(drafter, shape):
    return lambda ids: speculative_generate(verifier, drafter, ids, shape, GREEDY, args.max_new_tokens, eos)


whole = whole_chains(proposer)  # --lengths draft whole chains, whatever the folder says
for length in args.lengths:
    methods[f"chain ({length})"] = speculative(whole, DraftShape(length))
curve = None
if args.cut:
    if not getattr(proposer, "can_cut", False):
        parser.error(f"--cut: this drafter ({proposer.describe()['kind']}) has no confidences to cut its chains by")
    proposer.confidence_cut = True
    curve = proposer.calibrate(target, max(args.cut))
    for length in args.cut:
        methods[f"chain (up to {length}), cut"] = speculative(proposer, DraftShape(length))
for shape in args.trees:
    methods[f"tree ({shape})"] = speculative(whole, DraftShape(tree=tuple(int(v) for v in shape.split(","))))
runs = decode_interleaved(methods, prompts)

results = method_rows(runs, "plain", "plain")
relative = {n: c / curve[1] for n, c in curve.items()} if curve else None
out = Path(args.out) if args.out else Path(args.drafter).resolve().parent / "draft_shapes.json"
out.write_text(json.dumps({"drafter": proposer.describe(), "methods": results, "verify_cost_relative": relative,
                           "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                           "small_batch_linear_rows": rows, "environment": environment(target)}, indent=2, default=str))
if relative:
    print("verify cost t(n)/t(1): " + ", ".join(f"{n}: {c:.2f}" for n, c in relative.items()))
print(f"{'method':<28} {'tok/s':>7} {'τ':>5} {'vs plain':>9} {'ms/cyc':>6} identical  α per position")
for name, row in results.items():
    tau = f"{row['acceptance_length']:.2f}" if "acceptance_length" in row else "-"
    per_cycle = f"{row['draft_ms_per_cycle']:.1f}" if "draft_ms_per_cycle" in row else "-"
    alphas = " ".join(f"{a:.2f}" for a in row.get("acceptance_per_position") or [])
    print(f"{name:<28} {row['tokens_per_s']:7.2f} {tau:>5} {row['speedup_vs_plain']:8.2f}x {per_cycle:>6} "
          f"{row['identical_to_plain']:>4}/{len(prompts)}  {alphas}")
print(f"wrote {out}")
