"""Serving under load: the `draftsmith serve-sim` experiment end to end, as one bench with one record.

    .venv/bin/python bench/serving.py --drafter runs/bench-families/eagle3/best   

The steps are the CLI's own commands, run one after another (each is printed before it runs):
  1. a mixed prompt file, 8 HumanEval stubs and 8 chat questions (bench/serving_prompts.py);
  2. acceptance traces of prompt lookup, suffix matching, each --drafter and each drafter's hybrid with suffix
     matching (`draftsmith eval --save-traces` at draft lengths 1, 2 and 4, T=0, no small-batch linear layers,
     --threads); --no-suffix leaves out the suffix and hybrid traces;
  3. the target's cost model (`draftsmith serve-sim profile`: batched forwards over b, n and c);
  4. the simulation (`draftsmith serve-sim run`: Poisson arrivals at each --rates, every policy and speculation
     mode, seeded), which writes OUT/sim/results.json, report.md and report.html.
Its results.json is the record's result. --reuse skips the steps whose output is already in --out (a run
stopped part-way); the record's command says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import records

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--drafter", nargs="*", default=[], help="trained drafter folders traced beside prompt lookup")
parser.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.4],
                    help="Poisson arrival rates, requests per second")
parser.add_argument("--num-requests", type=int, default=200, help="requests per simulation")
parser.add_argument("--max-batch", type=int, default=8, help="continuous batching: most requests in one pass")
parser.add_argument("--rounds", type=int, default=5, help="rounds of the cost profile's grid")
parser.add_argument("--reuse", action="store_true", help="skip the steps whose output is already in --out")
parser.add_argument("--suffix", action=argparse.BooleanOptionalAction, default=True,
                    help="also trace suffix matching alone and each --drafter's hybrid with it (hybrid:DRAFTER)")
records.add_shared_options(parser, target="smollm2-135m-instruct", num_prompts=16, max_new_tokens=96, threads=1,
                           out="runs/serving", helps={"num_prompts": "prompts traced per drafter (code and chat)",
                                                      "out": "folder of the prompts, traces, profile and simulation"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
out = Path(args.out)
DRAFTSMITH = [sys.executable, "-m", "draftsmith"]


def step(output: Path, command: list[str]) -> None:
    """Run one command unless --reuse and its output exists."""
    records.step(output, command, args.reuse)


step(out / "prompts.jsonl", [sys.executable, str(Path(__file__).with_name("serving_prompts.py")), "--code", "8",
                             "--out", str(out / "prompts.jsonl")])
common = ["--target", args.target, "--prompts", str(out / "prompts.jsonl"), "--num-prompts", str(args.num_prompts),
          "--max-new-tokens", str(args.max_new_tokens), "--draft-length", "4", "--save-traces", "--draft-lengths",
          "1,2,4", "--no-transformers-baseline", "--no-small-batch-linear", "--threads", str(args.threads)]
traces = {"pld": ["--drafter", "prompt-lookup", "--no-adaptive-lookup"]}
if args.suffix:
    traces["suffix"] = ["--drafter", "suffix"]
for index, folder in enumerate(args.drafter):
    name = f"{index}-{Path(folder).parent.name or Path(folder).name}"
    traces[f"drafter-{name}"] = ["--drafter", folder]
    if args.suffix:
        traces[f"hybrid-{name}"] = ["--drafter", f"hybrid:{folder}"]
drafters = {folder: records.drafter_sha256(folder) for folder in args.drafter}  # each drafter traced, by content
for name, drafter in traces.items():
    step(out / name / "traces.json", [*DRAFTSMITH, "eval", *drafter, *common, "--out", str(out / name)])
step(out / "profile.json", [*DRAFTSMITH, "serve-sim", "profile", "--target", args.target, "--threads", str(args.threads),
                            "--no-small-batch-linear", "--rounds", str(args.rounds), "--out", str(out / "profile.json")])
step(out / "sim" / "results.json", [
    *DRAFTSMITH, "serve-sim", "run", "--profile", str(out / "profile.json"),
    "--traces", *(str(out / name / "traces.json") for name in traces),
    "--rates", *map(str, args.rates), "--num-requests", str(args.num_requests), "--max-batch", str(args.max_batch),
    "--out", str(out / "sim")])
records.apply_threads(args)  # the record's torch threads: what the steps ran with
records.write("serving", {**json.loads((out / "sim" / "results.json").read_text()), "drafters": drafters}, args)
