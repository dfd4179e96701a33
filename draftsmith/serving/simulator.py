"""A discrete-event simulation of one accelerator serving a workload with continuous batching.

Time advances one model pass at a time (iteration-level scheduling, as vLLM and Orca do). Before
every pass the policy picks up to `max_batch` live requests. If any of them has not been prefilled,
the pass is their prefill (padded to the longest prompt) and ends with their first token; otherwise
it is one decode/verify pass over the batch: each request drafts with the chosen length, the batch is
verified in one padded forward, and each request emits what its measured trace accepted plus one.
A pass costs what the measured cost model says, plus the measured draft time of every request in it
(our drafters draft one request at a time). Preempted requests keep their KV cache (no recompute or
swap is charged), so preemption only changes who is in the next batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from draftsmith.errors import DraftsmithError
from draftsmith.serving.traces import TracedPrompt


@dataclass
class Request:
    """One request of the workload and what happened to it."""

    id: int
    arrival: float
    prompt: TracedPrompt
    emitted: int = 0  # output tokens so far (the prefill gives the first)
    prefilled: bool = False
    in_batch: bool = False  # holds a batch slot (non-preemptive policies keep it until done)
    first_token: float | None = None
    finish: float | None = None
    attained: float = 0.0  # seconds of passes it took part in (least-attained-service)
    drafted: int = 0
    offered: int = 0  # draft positions reached: min(drafted, accepted + 1) per pass
    accepted: int = 0
    passes: int = 0
    preemptions: int = 0
    token_count: list[int] = field(default_factory=list)  # tokens credited per pass (conservation check)

    @property
    def remaining(self) -> int:
        """Output tokens still to come (the true count, from the trace: only oracles may read it)."""
        return self.prompt.new_tokens - self.emitted

    @property
    def context(self) -> int:
        """Tokens in this request's KV cache."""
        return self.prompt.prompt_tokens + self.emitted

    def acceptance(self, prior: float, weight: float = 2.0) -> float:
        """Running per-position acceptance α̂, shrunk toward the traces' overall α with `weight` pseudo-positions."""
        return (self.accepted + prior * weight) / (self.offered + weight)

    def tokens_per_pass(self, prior: float) -> float:
        """Running tokens emitted per verify pass (τ̂); the prior α's chain value before any pass."""
        if self.passes:
            return (self.accepted + self.passes) / self.passes
        return 1.0 + prior / max(1e-9, 1.0 - prior) if prior < 1 else 2.0


@dataclass
class View:
    """What a policy may look at when ranking: the time, the cost model, the predictor and the traces' prior α."""

    now: float
    cost: object
    predictor: object
    prior_acceptance: float
    draft_length: int


def simulate(requests: list[Request], cost, policy, speculation, max_batch: int, predictor=None,
             prior_acceptance: float = 0.5) -> list[Request]:
    """Serve `requests` to completion; returns them with first-token and finish times filled in.

    `policy` is (priority function, preemptive); `speculation(batch, cost, view)` gives the draft length of a pass."""
    if not requests:
        raise DraftsmithError("The workload is empty: there is no request to simulate.")
    priority, preemptive = policy
    pending = sorted(requests, key=lambda r: (r.arrival, r.id))
    live: list[Request] = []
    now, next_arrival, done = 0.0, 0, 0
    while done < len(requests):
        while next_arrival < len(pending) and pending[next_arrival].arrival <= now:
            live.append(pending[next_arrival])
            next_arrival += 1
        if not live:
            now = pending[next_arrival].arrival  # idle until the next request comes
            continue
        view = View(now, cost, predictor, prior_acceptance, getattr(speculation, "nominal", 0))
        batch = _choose(live, priority, preemptive, max_batch, view)
        new = [r for r in batch if not r.prefilled]
        if new:
            now += cost.prefill(len(new), max(r.prompt.prompt_tokens for r in new))
            for r in new:
                r.prefilled, r.emitted, r.first_token = True, 1, now
                r.token_count.append(1)
        else:
            now = _decode_pass(batch, cost, speculation, view, now)
        for r in batch:
            r.attained += now - view.now
            if r.remaining <= 0:
                r.finish, r.in_batch = now, False
                live.remove(r)
                done += 1
    return requests


def _choose(live: list[Request], priority, preemptive: bool, max_batch: int, view: View) -> list[Request]:
    """The next batch: the best-ranked live requests; a non-preemptive policy keeps whoever holds a slot."""
    ranked = sorted(live, key=lambda r: (priority(r, view), r.id))
    if preemptive:
        chosen = ranked[:max_batch]
        for r in live:
            if r.in_batch and r not in chosen:
                r.preemptions += 1
            r.in_batch = r in chosen
        return chosen
    holding = [r for r in ranked if r.in_batch]
    for r in ranked:
        if len(holding) >= max_batch:
            break
        if not r.in_batch:
            r.in_batch = True
            holding.append(r)
    return holding


def _decode_pass(batch: list[Request], cost, speculation, view: View, now: float) -> float:
    """One verify pass over `batch`: replay each request's traced cycle at its position, charge the batch."""
    length = speculation(batch, cost, view)
    cycles = [r.prompt.cycle_at(length, r.emitted) for r in batch]
    width = max(drafted for drafted, _, _ in cycles) + 1
    now += cost.step(len(batch), width, max(r.context for r in batch)) + sum(s for _, _, s in cycles)
    for r, (drafted, accepted, _) in zip(batch, cycles):
        emitted = min(accepted + 1, r.remaining)
        r.emitted += emitted
        r.token_count.append(emitted)
        r.passes += 1
        r.drafted += drafted
        r.accepted += accepted
        r.offered += min(drafted, accepted + 1)
    return now


# --------------------------------------------------------------------------- workloads
def poisson_arrivals(rate: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process of `rate` requests/s: cumulative exponential gaps."""
    if not rate > 0 or not math.isfinite(rate):
        raise DraftsmithError(f"The arrival rate must be a positive number of requests per second, got {rate}.")
    return np.cumsum(rng.exponential(1.0 / rate, size=count))


def workload(prompts: list[TracedPrompt], arrivals, seed: int, names: list[str | None] | None = None) -> list[Request]:
    """Requests at `arrivals`, each replaying a traced prompt: the named one, or one drawn uniformly (seeded)."""
    if not prompts or len(arrivals) == 0:
        raise DraftsmithError("The workload is empty: no traced prompts or no arrivals.")
    rng = np.random.default_rng(seed + 1)
    by_name = {p.name: p for p in prompts}
    requests = []
    for index, time in enumerate(arrivals):
        name = names[index] if names else None
        if name is not None and name not in by_name:
            raise DraftsmithError(f"Replayed arrival {index} names prompt '{name}', which the traces do not hold.")
        prompt = by_name[name] if name is not None else prompts[int(rng.integers(len(prompts)))]
        requests.append(Request(index, float(time), prompt))
    return requests


def summarize(requests: list[Request]) -> dict:
    """TTFT, TPOT and E2E (ms: mean, p50, p90, p99), goodput and request counts of a finished simulation."""
    ttft = [(r.first_token - r.arrival) * 1e3 for r in requests]
    e2e = [(r.finish - r.arrival) * 1e3 for r in requests]
    tpot = [(r.finish - r.first_token) * 1e3 / (r.emitted - 1) for r in requests if r.emitted > 1]
    span = max(r.finish for r in requests) - min(r.arrival for r in requests)

    def dist(values):
        values = np.asarray(values, dtype=float)
        if values.size == 0:
            return {"mean": None, "p50": None, "p90": None, "p99": None}
        return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
                "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99))}

    return {"requests": len(requests), "output_tokens": int(sum(r.emitted for r in requests)),
            "ttft_ms": dist(ttft), "tpot_ms": dist(tpot), "e2e_ms": dist(e2e),
            "goodput_tokens_per_s": sum(r.emitted for r in requests) / span if span > 0 else None,
            "preemptions": int(sum(r.preemptions for r in requests)),
            "mean_tokens_per_pass": float(sum(r.emitted - 1 for r in requests) / max(1, sum(r.passes for r in requests)))}
