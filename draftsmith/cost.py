"""What a target pass costs: the verify-cost curve t(n) that draft lengths are chosen from.

Measured on the real target (never assumed), and used below the decoder: prompt lookup picks each
draft's length from it, and drafters that cut their drafts short read it too.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache


@torch.no_grad()
def verify_cost_curve(target, sizes, context: torch.Tensor, repeats: int = 5) -> dict[int, float]:
    """Median seconds of one target pass over n new tokens after `context` [1, C], for each n in `sizes`.

    The sizes are interleaved (reversed every other round) so that drift hits them alike; the
    cache is cropped back to the context after every pass."""
    sizes = sorted(set(sizes))
    cache = DynamicCache(config=target.config)
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
