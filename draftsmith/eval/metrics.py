"""The metrics of DESIGN §3, one definition each, computed from decoded `Generation`s.

- acceptance_length τ: tokens emitted per verify pass, bonus/correction token included
  (Σ emitted / Σ passes, so τ ≥ 1). The first new token comes from the prefill, not from a
  verify pass, and is counted in neither sum.
- acceptance_per_position α_i: among passes whose walk reached draft position (depth) i, the
  fraction that accepted it. For chains τ = 1 + Σ_i Π_{j≤i} α_j (up to max-new-tokens cuts).
- tokens_per_s: Σ new tokens / Σ end-to-end seconds over all prompts.
- ttft (prefill to first token), tpot ((e2e − ttft) / (new tokens − 1)), e2e: mean, p50, p90.
- draft_time_fraction: Σ time spent in `propose` / Σ end-to-end time.
"""

from __future__ import annotations

import numpy as np

from draftsmith.eval.decoder import Generation

DEFINITIONS = {
    "acceptance_length": "tau = tokens emitted per target verify pass, including the bonus/correction token "
    "(sum emitted / sum passes; the prefill's first token is in neither sum)",
    "acceptance_per_position": "alpha_i = among verify passes that reached draft position i, the fraction that accepted it",
    "accept_length_histogram": "number of verify passes that accepted 0, 1, 2, ... drafted tokens",
    "speedup": "tokens/s of speculative decoding / tokens/s of plain decoding, same prompts, runs interleaved prompt by prompt",
    "tokens_per_s": "sum of new tokens / sum of end-to-end seconds over all prompts",
    "ttft_ms": "time from the start of the request to the first new token (prefill)",
    "tpot_ms": "(end-to-end - ttft) / (new tokens - 1), per request",
    "e2e_ms": "end-to-end latency of a request",
    "draft_time_fraction": "sum of time spent proposing / sum of end-to-end time",
    "tuned_target": "Medusa-2: the tuned target verifies; identical_to_original counts prompts whose plain output equals "
    "the original target's, token_agreement is the mean share of tokens before the first difference",
}


def stats(values) -> dict:
    """Mean, p50 and p90 of a list of numbers (None for an empty list)."""
    values = np.asarray(list(values), dtype=float)
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None}
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90))}


def acceptance(generations: list[Generation]) -> dict:
    """τ, per-position acceptance and the accepted-length histogram over every verify pass."""
    cycles = [c for g in generations for c in g.cycles]
    if not cycles:
        return {"acceptance_length": None, "acceptance_per_position": [], "accept_length_histogram": [], "verify_passes": 0}
    accepted = np.array([c.accepted for c in cycles])
    offered = np.array([c.offered for c in cycles])
    emitted = np.array([c.emitted for c in cycles])
    per_position = []
    for i in range(1, int(offered.max(initial=0)) + 1):
        reached = int((offered >= i).sum())
        per_position.append(float((accepted >= i).sum() / reached))
    return {
        "acceptance_length": float(emitted.sum() / len(cycles)),
        "acceptance_per_position": per_position,
        "accept_length_histogram": np.bincount(accepted).tolist(),
        "verify_passes": len(cycles),
        "mean_draft_size": float(np.mean([c.drafted for c in cycles])),
    }


def timing(generations: list[Generation]) -> dict:
    """Throughput and latency distributions of one decoding method."""
    tokens = sum(len(g.tokens) for g in generations)
    seconds = sum(g.total_s for g in generations)
    timed = [g for g in generations if g.ttft_s is not None]
    tpot = [(g.total_s - g.ttft_s) / (len(g.tokens) - 1) * 1e3 for g in timed if len(g.tokens) > 1]
    return {
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "new_tokens": tokens,
        "ttft_ms": stats(g.ttft_s * 1e3 for g in timed),
        "tpot_ms": stats(tpot),
        "e2e_ms": stats(g.total_s * 1e3 for g in generations),
        "draft_time_fraction": sum(g.draft_s for g in generations) / seconds if seconds > 0 else 0.0,
    }


def speedup(fast: list[Generation], slow: list[Generation]) -> float | None:
    """Ratio of tokens/s, fast over slow (same prompts)."""
    a, b = timing(fast)["tokens_per_s"], timing(slow)["tokens_per_s"]
    return a / b if a and b else None


def prefix_agreement(ours: list[Generation], theirs: list[Generation]) -> float | None:
    """Mean over prompts of (tokens before the first difference) / (the longer output's length): how far two
    models' outputs run together (1.0 = identical)."""
    shares = []
    for a, b in zip(ours, theirs):
        longest = max(len(a.tokens), len(b.tokens))
        common = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), min(len(a.tokens), len(b.tokens)))
        shares.append(common / longest if longest else 1.0)
    return float(np.mean(shares)) if shares else None
