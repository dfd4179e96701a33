"""What a drafter minimises against the target's next-token distribution (`drafter.loss`), for every kind that
learns one (EAGLE, MTP, Medusa heads, DFlash/DSpark, draft LMs).

Speculative sampling accepts a drafted token with probability α = Σ_v min(p_v, q_v) (p the target's distribution,
q the drafter's), so 1 - α is the total variation between them: TV and the LK losses (Samarin et al., "LK Losses:
Direct Acceptance Rate Optimization for Speculative Decoding", 2026) aim at acceptance itself, KL and JSD at the
distribution around it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from draftsmith.errors import DraftsmithError

LOSSES = ("forward_kl", "reverse_kl", "jsd", "tv", "lk", "lk_hybrid")
LK_FLOOR = 1e-5  # lk: -log of an overlap below this counts as this (a cold drafter's gradient stays finite)


@dataclass
class LossOptions:
    """The distribution loss, one option of every kind that learns the target's distribution."""

    loss: Literal["forward_kl", "reverse_kl", "jsd", "tv", "lk", "lk_hybrid"] = "forward_kl"
    """what each drafted position minimises between the target's distribution p and the drafter's q:
    forward_kl = KL(p‖q) = Σ p log(p/q) (what every kind trained with before the option), reverse_kl = KL(q‖p),
    jsd = Jensen-Shannon divergence, tv = 1 - Σ min(p, q) (one minus the acceptance rate α),
    lk = -log α, lk_hybrid = λ KL(p‖q) + (1 - λ) TV with λ = exp(-loss_eta · α), α held constant"""
    loss_eta: float = 3.0
    """lk_hybrid: how fast the blend moves from KL to TV as α grows (λ = exp(-loss_eta · α))"""

    def validate_loss(self, sparse_labels: bool = False) -> None:
        """`sparse_labels`: the labels are a top-k of the target's distribution (zero elsewhere), which
        reverse_kl cannot use (q's mass outside the k would cost log 0)."""
        if self.loss not in LOSSES:
            raise DraftsmithError(f"drafter.loss must be one of {', '.join(LOSSES)}; got {self.loss!r}.")
        if self.loss_eta < 0:
            raise DraftsmithError(f"drafter.loss_eta must be >= 0, got {self.loss_eta}.")
        if sparse_labels and self.loss == "reverse_kl":
            raise DraftsmithError("drafter.loss=reverse_kl needs the target's whole distribution (log p of every token "
                                  "the drafter puts mass on), not a top-k of it; use another loss or full labels.")


def distribution_loss(kind: str, log_q: torch.Tensor, p: torch.Tensor, indices: torch.Tensor | None = None,
                      eta: float = 3.0) -> torch.Tensor:
    """Per row [n]: `kind`'s loss between the drafter's log-probabilities `log_q` [n, N] and the target's
    probabilities `p`, given over all N entries ([n, N], `indices` None) or over `indices` [n, K] of them ([n, K],
    zero on the rest). Rows of p sum to 1 (or are all zero: a position with no label, which costs 0 in KL terms)."""
    log_q_on = log_q if indices is None else log_q.gather(-1, indices)
    if kind == "forward_kl":
        return (torch.xlogy(p, p) - p * log_q_on).sum(-1)
    if kind == "reverse_kl":
        if indices is not None:
            raise DraftsmithError("reverse_kl needs p over every entry of q, not a top-k of it.")
        log_p = torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))  # a p that underflowed to 0 counts as the tiniest
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    q_on = log_q_on.exp()
    if kind == "jsd":  # ½ KL(p‖m) + ½ KL(q‖m), m = (p + q) / 2; off `indices` p = 0, so there q log(q/m) = q log 2
        m = (p + q_on) / 2
        to_p = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)
        to_q = (q_on * log_q_on - torch.xlogy(q_on, m)).sum(-1)
        if indices is not None:
            to_q = to_q + math.log(2.0) * (1 - q_on.sum(-1)).clamp(min=0)
        return 0.5 * (to_p + to_q)
    overlap = torch.minimum(p, q_on).sum(-1)  # α, the acceptance rate of a token drafted from q
    if kind == "tv":
        return 1 - overlap
    if kind == "lk":
        return -torch.log(overlap.clamp_min(LK_FLOOR))
    if kind == "lk_hybrid":
        kl = distribution_loss("forward_kl", log_q, p, indices)
        weight = torch.exp(-eta * overlap.detach())
        return weight * kl + (1 - weight) * (1 - overlap)
    raise DraftsmithError(f"Unknown loss {kind!r}; one of {', '.join(LOSSES)}.")
