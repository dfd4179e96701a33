"""The engine load bench's bookkeeping: one serving scenario replayed by vLLM (`load_worker.py` in the engine's venv)
and by `draftsmith serve-sim`, and the two side by side.

The scenario: a set of prompts (token ids, each with its number of new tokens), requests arriving as a Poisson
process at each rate, at most `cap` requests in flight (the simulator's --max-batch, FCFS). Every rate uses the same
seed, so its arrival times are the same exponential draws scaled by 1/rate, and the same prompt sequence (a seeded
permutation of the prompts, cycled). The simulator gets exactly these arrivals (`--arrivals`, with prompt names).

Per request: TTFT = first token − arrival, TPOT = (finish − first token) / (tokens − 1), end-to-end = finish − arrival;
a request waiting for a slot waits inside all three, as in the simulator. A rate is **saturated** when the queue grows
across the run: the mean end-to-end latency of the last third of the requests (by arrival) is at least SATURATION
times that of the first third. Such rates are shown but not judged: their latencies measure the run's length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from draftsmith.engine_process import run_json_worker
from draftsmith.errors import DraftsmithError
from draftsmith.eval.metrics import stats
from draftsmith.serving.simulator import poisson_arrivals

WORKER = Path(__file__).with_name("load_worker.py")
TOLERANCE = 0.15
"""serve-sim's TTFT and TPOT p50 count as matching the engine's within 15%"""
SATURATION = 1.5
"""a rate is saturated when the last third's mean end-to-end latency is this many times the first third's"""
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
JUDGED = ("ttft_ms", "tpot_ms")


# --------------------------------------------------------------------------- the scenario
def schedule(rate: float, count: int, seed: int, prompt_names: list[str]) -> list[dict]:
    """`count` arrivals of a Poisson process at `rate` (serve-sim's own draw) with the prompt each replays:
    [{"time": seconds, "prompt": name}], the same prompt sequence at every rate."""
    if not prompt_names:
        raise DraftsmithError("The load scenario has no prompts.")
    times = poisson_arrivals(rate, count, np.random.default_rng(seed))
    order = np.random.default_rng(seed + 1).permutation(len(prompt_names))
    return [{"time": float(t), "prompt": prompt_names[int(order[i % len(order)])]} for i, t in enumerate(times)]


def engine_request(target: str, prompts: list[dict], schedules: dict, cap: int, speculative_config: dict | None,
                   dtype: str = "float32", seed: int = 0, enforce_eager: bool = False) -> dict:
    """The worker's request: `prompts` [{name, token_ids, max_tokens}], `schedules` {label: schedule(...)}."""
    index = {p["name"]: i for i, p in enumerate(prompts)}
    longest = max(len(p["token_ids"]) + p["max_tokens"] for p in prompts)
    return {"target": target, "dtype": dtype, "seed": seed, "enforce_eager": enforce_eager, "cap": cap,
            "max_model_len": longest + 64, "speculative_config": speculative_config, "prompts": prompts,
            "schedules": [{"label": label, "arrivals": [{"time": row["time"], "prompt": index[row["prompt"]]}
                                                        for row in rows]} for label, rows in schedules.items()]}


def run_engine(python: Path, request: dict, workdir: Path, name: str) -> dict:
    """One method through the load worker in the engine venv: request file in, result file out, log beside."""
    return run_json_worker(python, WORKER, request, workdir, name)


# --------------------------------------------------------------------------- per-request figures
def request_times(request: dict) -> dict:
    """TTFT, TPOT and end-to-end (ms) of one served request (TPOT None for a single token)."""
    ttft, e2e = request["first_token"] - request["arrival"], request["finish"] - request["arrival"]
    tpot = (request["finish"] - request["first_token"]) / (request["tokens"] - 1) if request["tokens"] > 1 else None
    return {"ttft_ms": ttft * 1e3, "tpot_ms": None if tpot is None else tpot * 1e3, "e2e_ms": e2e * 1e3}


def check_requests(requests: list[dict], asked: dict[str, int]) -> list[str]:
    """What is wrong with a served schedule: a request short of its tokens, or times out of order."""
    wrong = []
    for i, r in enumerate(requests):
        if r["tokens"] != asked[r["prompt"]]:
            wrong.append(f"request {i} ({r['prompt']}): {r['tokens']} tokens, asked {asked[r['prompt']]}")
        if r["first_token"] is None or not r["arrival"] <= r["submitted"] <= r["first_token"] <= r["finish"]:
            wrong.append(f"request {i}: times out of order (arrival {r['arrival']}, submitted {r['submitted']}, "
                         f"first token {r['first_token']}, finish {r['finish']})")
    return wrong


def saturation(arrivals: list[float], e2e_ms: list[float]) -> dict:
    """Whether end-to-end latency grows across the run: last third's mean / first third's (by arrival)."""
    order = np.argsort(arrivals, kind="stable")
    latencies = np.asarray(e2e_ms, dtype=float)[order]
    third = len(latencies) // 3
    if third == 0:
        return {"growth": None, "saturated": None}
    growth = float(latencies[-third:].mean() / latencies[:third].mean())
    return {"growth": growth, "saturated": growth >= SATURATION}


def summarize_engine(requests: list[dict]) -> dict:
    """Mean, p50, p90 of TTFT, TPOT, end-to-end (ms), the wait for a slot, and the saturation flag."""
    times = [request_times(r) for r in requests]
    summary = {m: stats(t[m] for t in times if t[m] is not None) for m in METRICS}
    summary["slot_wait_ms"] = stats((r["submitted"] - r["arrival"]) * 1e3 for r in requests)
    return {**summary, **saturation([r["arrival"] for r in requests], [t["e2e_ms"] for t in times]),
            "requests": len(requests)}


# --------------------------------------------------------------------------- side by side
def side_by_side(engine: dict, simulated: dict) -> list[dict]:
    """One row per (rate, method) present in both: {rate, method, engine, sim, ratio, judged, within}.

    `engine` and `simulated`: {method: {rate: summary}} with mean/p50/p90 per metric (simulator summaries too). The
    ratio is sim / engine of each p50; a saturated engine rate is not judged."""
    rows = []
    for method, by_rate in engine.items():
        for rate, ours in by_rate.items():
            sim = simulated.get(method, {}).get(rate)
            if sim is None:
                continue
            ratio = {m: (sim[m]["p50"] / ours[m]["p50"] if ours[m]["p50"] and sim[m]["p50"] is not None else None)
                     for m in METRICS}
            judged = ours.get("saturated") is False
            within = all(ratio[m] is not None and abs(ratio[m] - 1) <= TOLERANCE for m in JUDGED) if judged else None
            rows.append({"rate": rate, "method": method, "engine": ours, "sim": sim, "ratio": ratio,
                         "judged": judged, "within": within})
    return sorted(rows, key=lambda row: (row["method"], float(row["rate"])))


def table_lines(rows: list[dict]) -> list[str]:
    """The side-by-side table as text: p50 / p90 (ms) of engine and sim per metric, sim/engine of the p50s."""
    header = ["method", "rate", "sat.", *(f"{m[:-3]} eng p50/p90" for m in METRICS),
              *(f"{m[:-3]} sim p50/p90" for m in METRICS), *(f"{m[:-3]} sim/eng" for m in METRICS), "within 15%"]
    body = []
    for row in rows:
        cells = [row["method"], f"{float(row['rate']):g}", _flag(row["engine"].get("saturated"))]
        for side in ("engine", "sim"):
            cells += [f"{_ms(row[side][m]['p50'])}/{_ms(row[side][m]['p90'])}" for m in METRICS]
        cells += [f"{row['ratio'][m]:.2f}" if row["ratio"][m] is not None else "–" for m in METRICS]
        cells.append("not judged" if not row["judged"] else "yes" if row["within"] else "NO")
        body.append(cells)
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    return ["  ".join(str(cell).rjust(width) for cell, width in zip(line, widths)) for line in [header, *body]]


def _ms(value) -> str:
    return "–" if value is None else f"{value:.0f}"


def _flag(value) -> str:
    return "–" if value is None else "yes" if value else "no"
