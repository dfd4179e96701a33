"""How tokens are chosen from logits: the sampling settings and the processed distribution.

Drafters and the decoder share this math (a drafter's q and the target's p must be processed the
same way for lossless sampling), so it sits below both: `drafters` and `eval` import it, never each other
for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. temperature 0 means greedy; top_k 0 and top_p 1.0 mean off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Softmax of `logits` [..., V] after temperature, top-k and top-p (float32)."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Drop a token when the tokens ranked above it already cover top_p (the first always stays).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of `logits` [N, V]: argmax when greedy, else a sample. Returns [N]."""
    if sampling.greedy:
        return logits.argmax(-1)
    return torch.multinomial(target_probs(logits, sampling), 1, generator=generator).squeeze(-1)
