"""The default recipe trained on code alone and on the general mix, for the same budgets, judged by category.

    .venv/bin/python bench/general_mix.py --num-prompts 20 --humaneval-prompts 10

Both arms are recipes/smollm2-135m/eagle3.yaml with its time budgets (prepare.max_minutes of regeneration,
train.max_minutes of training): the mix arm is the recipe as it ships (builtin:exercises + builtin:general, in
the recipe's own folders, so a finished `make demo` is reused as it is), the code arm the same recipe with
builtin:exercises alone, in folders of its own. Each arm's best/ then decodes the built-in suite (ten categories,
HumanEval as code) and HumanEval, drafter alone (its chain with the recipe's fallback), each method against its own
plain loop interleaved prompt by prompt. Printed and recorded: per category τ and speedup of both arms side by side,
HumanEval's, and the two checks the mix must pass: HumanEval speedup at least 90% of the code arm's, and a higher
speedup than the code arm in every category but code.
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

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--humaneval-prompts", type=int, default=10, help="HumanEval prompts each arm decodes")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="overrides of both arms' recipe (e.g. train.max_minutes=5)")
records.add_shared_options(parser, num_prompts=20, max_new_tokens=96, out="runs/bench-general-mix",
                           helps={"num_prompts": "prompts of builtin:suite each arm decodes (the first N: N/10 per "
                                                 "category)", "out": "where the code arm's runs and the evaluations go"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
out = Path(args.out)

ARMS = {  # name -> the recipe overrides of that arm
    "code": [f"data.prepared={out}/data-code", f"data.features={out}/features-code-top8",
             f"data.draft_vocab={out}/data-code", "prepare.input=[builtin:exercises]", f"output_dir={out}/code"],
    "mix": [],  # the recipe as it ships
}


def run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def evaluate(arm: str, best: Path, prompts: str, count: int) -> dict:
    """`draftsmith eval` of an arm's best/ on `prompts`; its results.json."""
    folder = out / "eval" / f"{arm}-{prompts.replace(':', '-')}"
    run([*DRAFTSMITH, "eval", "--target", "smollm2-135m-instruct", "--drafter", str(best), "--prompts", prompts,
         "--num-prompts", str(count), "--max-new-tokens", str(args.max_new_tokens), "--draft-length",
         str(draft_length), "--no-transformers-baseline", "--out", str(folder)])
    return json.loads((folder / "results.json").read_text())


def summary(results: dict) -> dict:
    keep = ("acceptance_length", "speedup", "draft_time_fraction", "lossless")
    categories = {name: {key: row.get(key) for key in ("prompts", "acceptance_length", "speedup",
                                                         "draft_time_fraction")}
                  for name, row in (results.get("per_category") or {}).items()}
    return {**{key: results.get(key) for key in keep}, "per_category": categories}


sys.path.insert(0, str(ROOT))
from draftsmith.config import load
from draftsmith.train.config import TrainConfig

arms = {}
for arm, overrides in ARMS.items():
    options = ["resume=true", "report.num_prompts=0", "tracking.report_to=[]", *args.set, *overrides]
    config = load(TrainConfig, RECIPE, options)  # the folders and report options `draftsmith train` gets
    draft_length = config.report.draft_length
    run([*DRAFTSMITH, "train", str(RECIPE), *options])
    prepared = json.loads((Path(config.data.prepared) / "prepare_report.json").read_text())
    training = json.loads((Path(config.output_dir) / "training.json").read_text())
    best = Path(config.output_dir) / "best"
    arms[arm] = {"rows": prepared.get("rows_kept"), "tokens": prepared.get("tokens"), "steps": training.get("steps"),
                 "implied_acceptance_length": training.get("best_acceptance_length"),
                 "suite": summary(evaluate(arm, best, "builtin:suite", args.num_prompts)),
                 "humaneval": summary(evaluate(arm, best, "humaneval", args.humaneval_prompts))}

code, mix = arms["code"], arms["mix"]
categories = sorted(set(code["suite"]["per_category"]) | set(mix["suite"]["per_category"]))
print(f"\n{'category':<14} {'code τ':>7} {'code ×':>7} {'mix τ':>7} {'mix ×':>7}")
for name in categories:
    a, b = code["suite"]["per_category"].get(name, {}), mix["suite"]["per_category"].get(name, {})
    print(f"{name:<14} {a.get('acceptance_length', 0):7.2f} {a.get('speedup', 0):7.2f} "
          f"{b.get('acceptance_length', 0):7.2f} {b.get('speedup', 0):7.2f}")
for label, key in (("suite", "suite"), ("HumanEval", "humaneval")):
    print(f"{label:<14} {code[key]['acceptance_length']:7.2f} {code[key]['speedup']:7.2f} "
          f"{mix[key]['acceptance_length']:7.2f} {mix[key]['speedup']:7.2f}")
checks = {
    "humaneval_kept_90_percent": mix["humaneval"]["speedup"] >= 0.9 * code["humaneval"]["speedup"],
    "mix_wins_every_non_code_category": all(
        mix["suite"]["per_category"][name]["speedup"] > code["suite"]["per_category"][name]["speedup"]
        for name in categories if name != "code"),
}
print("checks:", json.dumps(checks))
records.write("general_mix", {"num_prompts": args.num_prompts, "humaneval_prompts": args.humaneval_prompts,
                              "max_new_tokens": args.max_new_tokens, "draft_length": draft_length,
                              "overrides": args.set, "arms": arms, "checks": checks}, args)
