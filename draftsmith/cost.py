"""What a target pass costs: the verify-cost curve t(n) that draft lengths are chosen from.

Measured on the real target (never assumed), and used below the decoder: prompt lookup picks each
draft's length from it, and drafters that cut their drafts short read it too.
"""

from __future__ import annotations

import time

import torch

from draftsmith.kv_cache import rollback_cache


CALIBRATION_REPEATS = 15
"""passes per size when a verify-cost curve is measured. Whether to add one draft token to a pass turns on t(2) / t(1),
a few percent from 1 on a CPU: with 5 repeats three calibrations on one machine gave 0.94 to 1.07 (a token that seems
free or dear by chance), with 15, 0.98 to 1.00 (5 s for the hybrid bench's 11 sizes on a Zen 4 CPU). On a host whose speed
drops for seconds at a time, 5 repeats gave one calibration t(n)/t(1) of 0.47 to 0.52 for six of eight sizes."""


@torch.no_grad()
def verify_cost_curve(target, sizes, context: torch.Tensor, repeats: int = CALIBRATION_REPEATS) -> dict[int, float]:
    """Median seconds of one target pass over n new tokens after `context` [1, C], for each n in `sizes`.

    The sizes are interleaved (reversed every other round) so that drift hits them alike; the
    cache is cropped back to the context after every pass."""
    sizes = sorted(set(sizes))
    cache = rollback_cache(target.config)  # the decoder's own kind of cache, which a crop cannot break
    target.forward(context[:, : context.shape[1] - max(sizes)], cache=cache, logits_to_keep=1)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for round_ in range(repeats):
        for n in sizes if round_ % 2 == 0 else reversed(sizes):
            chunk = context[:, context.shape[1] - max(sizes) : context.shape[1] - max(sizes) + n]
            start = time.perf_counter()
            target.forward(chunk, cache=cache)
            if target.device.type == "cuda":
                torch.cuda.synchronize(target.device)
            times[n].append(time.perf_counter() - start)
            cache.crop(-n)
    return {n: sorted(t)[len(t) // 2] for n, t in times.items()}


def best_length(accept_through: list[float], cost: dict[int, float]) -> int:
    """The draft length L in [0, len(accept_through)] with the most expected tokens per unit of verify cost,
    (1 + accept_through[0] + ... + accept_through[L-1]) / t(L+1), where accept_through[k] is the chance that
    draft tokens 1..k+1 are all accepted. L = 0 is a plain step (one token for t(1))."""
    best, best_value, expected = 0, 1 / cost[1], 1.0
    for length, accepted in enumerate(accept_through, start=1):
        expected += accepted
        if expected / cost[length + 1] > best_value:
            best, best_value = length, expected / cost[length + 1]
    return best


def calibrated(cost: dict[int, float] | None, longest: int) -> bool:
    """Whether `cost` has t(n) for every pass a draft of up to `longest` tokens needs (n = 1 .. longest + 1)."""
    return cost is not None and all(n in cost for n in range(1, longest + 2))


def measure(target, longest: int, context_tokens: int = 256) -> dict[int, float]:
    """t(n) for n = 1 .. longest + 1 on `target` after a random context (a few seconds): what drafts of up to
    `longest` tokens cost to verify."""
    context = torch.randint(0, target.vocab_size, (1, context_tokens), generator=torch.Generator().manual_seed(0))
    return verify_cost_curve(target, range(1, longest + 2), context)


def measure_sizes(target, sizes, context_tokens: int = 256) -> dict[int, float]:
    """t(n) for each of `sizes` on `target` after a random context of at least `context_tokens` tokens and twice the
    largest size: the verify-cost curve of drafts of any shape (trees, hybrids' merged drafts)."""
    sizes = sorted(set(sizes))
    context = torch.randint(0, target.vocab_size, (1, max(context_tokens, 2 * sizes[-1])),
                            generator=torch.Generator().manual_seed(0))
    return verify_cost_curve(target, sizes, context)


class StoppingRule:
    """Cut a chain draft where it stops paying for its verify cost, deciding each position before it is drafted.

    `keep(c)` is asked for draft positions 1, 2, ... in turn with c, the drafter's estimate that position k is
    accepted if the ones before it were (its confidence). It projects c onto the positions after k, and keeps k
    only if some length >= k then gives more expected tokens per unit of verify cost (`best_length`) than stopping
    before k. A drafter that asks before sampling position k's token, from what it drafted before k, never lets a
    token decide its own drafting, so sampling stays lossless."""

    def __init__(self, cost: dict[int, float], longest: int):
        self.cost, self.longest = cost, longest
        self.accept_through: list[float] = []

    def keep(self, confidence: float) -> bool:
        kept = len(self.accept_through)
        running = (self.accept_through[-1] if kept else 1.0) * confidence
        projected = self.accept_through + [running * confidence**j for j in range(self.longest - kept)]
        if best_length(projected, self.cost) <= kept:
            return False
        self.accept_through.append(running)
        return True

    def keep_step(self, logits: torch.Tensor) -> bool:
        """`keep` with a chain step's confidence taken as the top probability of its draft distribution (`logits`
        [V]): what EAGLE, MTP and Medusa chains are cut by."""
        return self.keep(float(torch.softmax(logits.float(), -1).max()))
