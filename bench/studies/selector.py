"""Does `best/`'s selector agree with a real decode? Rank a run's saved checkpoints both ways, in one run.

    .venv/bin/python bench/studies/selector.py runs/smollm2-135m-instruct/eagle3 --num-prompts 40 --length 2

Every checkpoint-<step>/drafter of the run (keep as many as train.keep_checkpoints allowed) decodes the same
HumanEval prompts at T=0 as a chain of --length, interleaved prompt by prompt with our plain loop. Printed per
checkpoint: the held-out figures the trainer logged at that step (per-step accuracy and the implied τ that
eval.select_by=implied keeps best/ by), the decoded τ and speedup, and whether both orders rank the checkpoints
alike (Kendall's τ between them: 1 = the same order). Results go to RUN/selector.json.

Study, settled: `best/` is kept by the implied τ of the held-out per-step accuracies (`eval.select_by: implied`).
Measured on the demo run of commit f7a300e (committed 2026-12-01; alone, the machine kind not recorded): its 5 checkpoints
decoded on 40 prompts ranked as the implied τ ranks them but for the last pair (Kendall's τ 0.80), the implied τ about
0.15 above the decoded one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common.py

from common import chains_beside_plain, decode_interleaved, method_rows, read_log  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("run", help="a training run's output_dir (with checkpoint-<step>/ folders and metrics.jsonl)")
parser.add_argument("--target", default="smollm2-135m-instruct")
parser.add_argument("--length", type=int, default=2, help="chain length every checkpoint drafts")
parser.add_argument("--num-prompts", type=int, default=40, help="HumanEval prompts decoded per checkpoint")
parser.add_argument("--max-new-tokens", type=int, default=128)
args = parser.parse_args()
run = Path(args.run)
folders = sorted(run.glob("checkpoint-*/drafter"), key=lambda p: int(p.parent.name.split("-")[1]))
if len(folders) < 2:
    parser.error(f"{run} holds {len(folders)} checkpoint(s); ranking needs at least 2 (raise train.keep_checkpoints)")
held_out = {r["step"]: r for r in read_log(run) if r.get("split") == "eval"}

target = load_target(args.target)
prompts = load_prompts("humaneval", target, args.num_prompts)
methods = chains_beside_plain(target, {folder.parent.name: folder for folder in folders}, args.length,
                              args.max_new_tokens)
results = method_rows(decode_interleaved(methods, prompts), "plain", "plain")

names = [f.parent.name for f in folders]
implied = [held_out[int(n.split("-")[1])]["implied_acceptance_length"] for n in names]
decoded = [results[n]["acceptance_length"] for n in names]
pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
concordance = sum((implied[i] - implied[j]) * (decoded[i] - decoded[j]) > 0 for i, j in pairs)
discordance = sum((implied[i] - implied[j]) * (decoded[i] - decoded[j]) < 0 for i, j in pairs)
kendall = (concordance - discordance) / len(pairs)
(run / "selector.json").write_text(json.dumps({
    "length": args.length, "prompts": len(prompts), "kendall_tau": kendall,
    "checkpoints": {n: {"held_out": held_out[int(n.split("-")[1])], "decoded": results[n]} for n in names},
    "plain": results["plain"]}, indent=2, default=str))
print(f"{'checkpoint':<18} {'acc_0':>6} {'acc_1':>6} {'implied τ':>9} {'decoded τ':>9} {'vs plain':>9} identical")
for name, tau in zip(names, implied):
    logged, row = held_out[int(name.split("-")[1])], results[name]
    print(f"{name:<18} {logged.get('acc_0', 0):6.3f} {logged.get('acc_1', 0):6.3f} {tau:9.3f} "
          f"{row['acceptance_length']:9.3f} {row['speedup_vs_plain']:8.2f}x {row['identical_to_plain']:>4}/{len(prompts)}")
best = max(range(len(names)), key=lambda i: implied[i])
print(f"plain {results['plain']['tokens_per_s']:.2f} tok/s; the selector keeps {names[best]}, the decode ranks it "
      f"{sorted(decoded, reverse=True).index(decoded[best]) + 1} of {len(names)}; Kendall's τ between the two orders "
      f"{kendall:.2f}; wrote {run / 'selector.json'}")
