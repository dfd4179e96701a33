"""Serving under load in a real engine beside `draftsmith serve-sim`: one scenario, both sides, per rate and method.

    .venv/bin/python bench/serving_engine.py --drafter runs/smollm2-135m-instruct/eagle3/best \\
        --rates 0.25 0.5 1 2 --num-requests 40 --cap 4

The scenario: prompts of bench/serving_prompts.py (code and chat), each answered with exactly the number of new tokens
our plain greedy decoding gave it; requests arriving as a Poisson process at each --rates (one seed for all rates), at
most --cap in flight, first come first served. The methods: plain decoding, the --drafter and suffix matching.
  1. the prompt file, then acceptance traces of the drafter and of suffix matching (`draftsmith eval --save-traces`,
     T=0, full chains of --draft-length, --threads = this process's cores, no small-batch linear layers);
  2. the cost model measured on this machine (`draftsmith serve-sim profile`, same threads and setting);
  3. the engine: vLLM (`make engine`'s .venv-engine) through draftsmith/serving/load_worker.py, one engine per method
     (plain, the drafter exported as eval --engine exports it, vLLM's suffix method with no cross-request cache),
     every rate replayed in turn (draftsmith/serving/engine_load.py);
  4. the simulator: `draftsmith serve-sim run` per rate with the same arrivals and prompts (--arrivals), FCFS,
     --max-batch = --cap, speculation off (plain) and fixed (drafter, suffix);
  5. side by side: TTFT / TPOT / end-to-end p50 and p90 of both, sim / engine of each p50, the rates where the engine
     saturates (not judged), whether TTFT and TPOT p50 are within 15%, and what the engine's own steps cost beside
     the cost model's forwards (where a gap comes from).
The record's result holds both sides' summaries, the table's rows and the engine's per-request times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import records

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--drafter", default="runs/smollm2-135m-instruct/eagle3/best",
                    help="a trained draftsmith drafter (exported into the layout vLLM loads, as eval --engine does)")
parser.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0],
                    help="Poisson arrival rates, requests per second (at least four for the issue's check)")
parser.add_argument("--num-requests", type=int, default=40, help="requests per rate")
parser.add_argument("--cap", type=int, default=4, help="most requests in flight (the simulator's --max-batch)")
parser.add_argument("--draft-length", type=int, default=3, help="tokens drafted per verify pass (both sides)")
parser.add_argument("--methods", nargs="+", default=["plain", "drafter", "suffix"], choices=["plain", "drafter", "suffix"])
parser.add_argument("--seed", type=int, default=0, help="seed of the arrivals and the prompt order (every rate)")
parser.add_argument("--rounds", type=int, default=3, help="rounds of the cost profile's grid")
parser.add_argument("--engine-eager", action="store_true", help="vLLM without torch.compile (loads faster)")
parser.add_argument("--reuse", action="store_true", help="skip the steps whose output is already in --out")
parser.add_argument("--contended", action="store_true",
                    help="the machine is shared with other work: the output and the record say so (a smoke run)")
records.add_shared_options(parser, target="smollm2-135m-instruct", num_prompts=16, max_new_tokens=64,
                           threads=len(os.sched_getaffinity(0)), out="runs/serving-engine",
                           helps={"num_prompts": "prompts in the scenario (code and chat)",
                                  "threads": "torch threads of the traces and the profile (default: this process's "
                                             "cores, what vLLM's CPU build gives the model)",
                                  "out": "folder of the prompts, traces, profile, engine results and simulations"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
sys.path.insert(0, str(records.ROOT))
from draftsmith.serving import engine_load  # noqa: E402  (after start(): nothing measured before it)

out = Path(args.out)
DRAFTSMITH = [sys.executable, "-m", "draftsmith"]


def step(output: Path, command: list[str]) -> None:
    """Run one command unless --reuse and its output exists."""
    records.step(output, command, args.reuse)


# --------------------------------------------------------------------------- 1-2. prompts, traces, cost model
step(out / "prompts.jsonl", [sys.executable, str(Path(__file__).with_name("serving_prompts.py")), "--code", "8",
                             "--out", str(out / "prompts.jsonl")])
common = ["--target", args.target, "--prompts", str(out / "prompts.jsonl"), "--num-prompts", str(args.num_prompts),
          "--max-new-tokens", str(args.max_new_tokens), "--draft-length", str(args.draft_length), "--save-traces",
          "--no-transformers-baseline", "--no-small-batch-linear", "--threads", str(args.threads)]
traced = {"drafter": ["--drafter", args.drafter, "--confidence-cut", "false"], "suffix": ["--drafter", "suffix"]}
for name, drafter in traced.items():
    step(out / name / "traces.json", [*DRAFTSMITH, "eval", *drafter, *common, "--out", str(out / name)])
batch_sizes = sorted({*(b for b in (1, 2, 4, 8) if b < args.cap), args.cap})
step(out / "profile.json", [*DRAFTSMITH, "serve-sim", "profile", "--target", args.target, "--threads",
                            str(args.threads), "--no-small-batch-linear", "--rounds", str(args.rounds),
                            "--batch-sizes", *map(str, batch_sizes), "--out", str(out / "profile.json")])

# --------------------------------------------------------------------------- the scenario, as token ids
from draftsmith.engine_process import engine_python, target_folder  # noqa: E402
from draftsmith.eval.engine import served_drafter  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.serving.costmodel import load_profile  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

traces = {name: json.loads((out / name / "traces.json").read_text()) for name in traced}
lengths = {row["name"]: row["new_tokens"] for row in traces["drafter"]["prompts"]}
target = load_target(args.target)
prompts = [{"name": p.name, "token_ids": list(p.token_ids), "max_tokens": lengths[p.name]}
           for p in load_prompts(out / "prompts.jsonl", target, args.num_prompts)]
for p, row in zip(prompts, traces["drafter"]["prompts"]):  # the ids the eval traced, by count
    assert (p["name"], len(p["token_ids"])) == (row["name"], row["prompt_tokens"]), (p["name"], row["name"])
names = [p["name"] for p in prompts]
schedules = {rate: engine_load.schedule(rate, args.num_requests, args.seed, names) for rate in args.rates}

# --------------------------------------------------------------------------- 3. the engine
speculative = {"plain": None, "suffix": {"method": "suffix", "num_speculative_tokens": args.draft_length,
                                         "suffix_decoding_max_cached_requests": 0}}
if "drafter" in args.methods:
    speculative["drafter"], served = served_drafter(args.drafter, out / "engine", args.draft_length)
    if speculative["drafter"] is None:
        sys.exit(f"the engine cannot serve {args.drafter}: {served}")
engine_results, engine_summaries, problems = {}, {}, {}
for method in args.methods:
    saved = out / "engine" / f"{method}.result.json"
    if args.reuse and saved.is_file():
        print(f"reusing {saved}", flush=True)
        result = json.loads(saved.read_text())
    else:
        print(f"engine: vLLM {method} {json.dumps(speculative[method])}", flush=True)
        request = engine_load.engine_request(target_folder(args.target), prompts, schedules, args.cap,
                                             speculative[method], seed=args.seed, enforce_eager=args.engine_eager)
        result = engine_load.run_engine(engine_python(), request, out / "engine", method)
    if not result.get("ok"):
        sys.exit(f"engine {method} failed: {result.get('error')} (log: {result.get('log')})")
    engine_results[method] = result
    engine_summaries[method] = {}
    for served_schedule in result["schedules"]:
        wrong = engine_load.check_requests(served_schedule["requests"], lengths)
        if wrong:
            problems[f"{method} @ {served_schedule['label']}"] = wrong
        engine_summaries[method][served_schedule["label"]] = engine_load.summarize_engine(served_schedule["requests"])

# --------------------------------------------------------------------------- 4. the simulator, same arrivals
sim_summaries = {method: {} for method in args.methods}
for rate, rows in schedules.items():
    folder = out / "sim" / f"rate-{rate:g}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "arrivals.json").write_text(json.dumps(rows) + "\n")
    step(folder / "results.json", [
        *DRAFTSMITH, "serve-sim", "run", "--profile", str(out / "profile.json"),
        "--traces", *(str(out / name / "traces.json") for name in traced), "--arrivals", str(folder / "arrivals.json"),
        "--policies", "fcfs", "--speculation", "off", "fixed", "--max-batch", str(args.cap), "--seed", str(args.seed),
        "--out", str(folder)])
    simulated = json.loads((folder / "results.json").read_text())
    method_of = {label: Path(info["path"]).parent.name for label, info in simulated["traces"].items()}
    for run in simulated["runs"]:
        method = "plain" if run["speculation"] == "off" else method_of[run["traces"]]
        if method in sim_summaries and (method != "plain" or method_of[run["traces"]] == "drafter"):
            sim_summaries[method][rate] = run["summary"]

# --------------------------------------------------------------------------- 5. side by side, and where gaps come from
rows = engine_load.side_by_side(engine_summaries, sim_summaries)
cost = load_profile(out / "profile.json")
contexts = sorted(len(p["token_ids"]) + p["max_tokens"] // 2 for p in prompts)
prompt_tokens = sorted(len(p["token_ids"]) for p in prompts)
lowest = min(args.rates)
alone = {"cost_model_prefill_ms": cost.prefill(1, prompt_tokens[len(prompt_tokens) // 2]) * 1e3,
         "cost_model_step_ms": cost.step(1, 1, contexts[len(contexts) // 2]) * 1e3,
         "cost_model_verify_ms": cost.step(1, args.draft_length + 1, contexts[len(contexts) // 2]) * 1e3}
if "plain" in engine_summaries:
    alone.update(engine_plain_ttft_p50_ms=engine_summaries["plain"][lowest]["ttft_ms"]["p50"],
                 engine_plain_tpot_p50_ms=engine_summaries["plain"][lowest]["tpot_ms"]["p50"])
scheduler = next(iter(engine_results.values()))["scheduler"]
judged = [row for row in rows if row["judged"]]
print("\nengine (vLLM) against serve-sim, same arrivals and prompts; ms, p50/p90 per side, sim/eng of the p50s"
      + (" [CONTENDED: the machine was shared; figures are not measurements]" if args.contended else ""))
print("\n".join(engine_load.table_lines(rows)))
saturated = ", ".join(f"{row['method']}@{float(row['rate']):g}" for row in rows if not row["judged"]) or "none"
print(f"\nwithin 15% (TTFT and TPOT p50) at {sum(bool(r['within']) for r in judged)} of {len(judged)} unsaturated "
      f"(rate, method) pairs; saturated, not judged: {saturated}")
print(f"where gaps come from, at rate {lowest:g}: engine plain TTFT p50 {alone.get('engine_plain_ttft_p50_ms', 0):.0f} ms "
      f"vs the cost model's prefill {alone['cost_model_prefill_ms']:.0f} ms (b=1, median prompt); engine plain TPOT "
      f"p50 {alone.get('engine_plain_tpot_p50_ms', 0):.1f} ms vs its decode pass {alone['cost_model_step_ms']:.1f} ms "
      f"(b=1, median context); vLLM scheduler: {json.dumps(scheduler)} (chunked prefill mixes prompts into decode "
      "steps; serve-sim runs each admission's prefill as a pass of its own)")
for where, wrong in problems.items():
    print(f"PROBLEM {where}: " + "; ".join(wrong[:3]))

result = {"rates": args.rates, "num_requests": args.num_requests, "cap": args.cap, "draft_length": args.draft_length,
          "methods": args.methods, "seed": args.seed, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
          "engine_eager": args.engine_eager, "vllm_version": next(iter(engine_results.values())).get("vllm_version"),
          "speculative_configs": {m: speculative[m] for m in args.methods}, "scheduler": scheduler,
          "tolerance": engine_load.TOLERANCE, "saturation_growth": engine_load.SATURATION, "rows": rows,
          "within": sum(bool(r["within"]) for r in judged), "judged": len(judged), "alone": alone,
          "problems": problems, "contended": args.contended,
          "drafter": {"path": args.drafter, "sha256": records.drafter_sha256(args.drafter)},
          "engine_requests": {m: r["schedules"] for m, r in engine_results.items()},
          "engine_load_s": {m: r.get("load_s") for m, r in engine_results.items()}}
records.apply_threads(args)
records.write("serving_engine", result, args)
sys.exit(1 if problems else 0)
