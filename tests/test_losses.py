"""drafter.loss: every distribution loss against its definition written out by hand, the top-k (sparse) form
against the dense one, lk_hybrid's blend weight held constant in the gradient, and the options refused where
they cannot work."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.drafters.losses import LOSSES, LossOptions, distribution_loss
from draftsmith.errors import DraftsmithError


def by_hand(kind: str, p: torch.Tensor, log_q: torch.Tensor, eta: float = 3.0) -> torch.Tensor:
    """Each loss per row straight from its definition (p > 0 everywhere), for the kinds' own tests too."""
    q = log_q.exp()
    kl = (p * (p.log() - log_q)).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    accepted = torch.minimum(p, q).sum(-1)
    if kind == "forward_kl":
        return kl
    if kind == "reverse_kl":
        return (q * (log_q - p.log())).sum(-1)
    if kind == "jsd":
        m = (p + q) / 2
        return 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
    if kind == "tv":
        return tv
    if kind == "lk":
        return -accepted.log()
    weight = torch.exp(-eta * accepted.detach())  # α held constant in the blend
    return weight * kl + (1 - weight) * tv


def test_three_tokens_by_arithmetic():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.5, 0.3]
    log_q = torch.tensor([q]).log()
    value = {kind: float(distribution_loss(kind, log_q, torch.tensor([p]))[0]) for kind in LOSSES}
    accepted = 0.2 + 0.3 + 0.2
    kl = sum(a * math.log(a / b) for a, b in zip(p, q))
    assert value["forward_kl"] == pytest.approx(kl, rel=1e-5)
    assert value["reverse_kl"] == pytest.approx(sum(b * math.log(b / a) for a, b in zip(p, q)), rel=1e-6)
    m = [(a + b) / 2 for a, b in zip(p, q)]
    jsd = 0.5 * sum(a * math.log(a / c) for a, c in zip(p, m)) + 0.5 * sum(b * math.log(b / c) for b, c in zip(q, m))
    assert value["jsd"] == pytest.approx(jsd, rel=1e-5)
    assert value["tv"] == pytest.approx(1 - accepted, rel=1e-6)
    assert value["lk"] == pytest.approx(-math.log(accepted), rel=1e-6)
    weight = math.exp(-3.0 * accepted)
    assert value["lk_hybrid"] == pytest.approx(weight * kl + (1 - weight) * (1 - accepted), rel=1e-5)


@pytest.mark.parametrize("kind", LOSSES)
def test_every_loss_equals_its_definition(kind):
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, 11, generator=generator) * 2, -1)
    log_q = torch.log_softmax(torch.randn(6, 11, generator=generator) * 2, -1)
    torch.testing.assert_close(distribution_loss(kind, log_q, p, eta=1.5), by_hand(kind, p, log_q, eta=1.5))


@pytest.mark.parametrize("kind", [kind for kind in LOSSES if kind != "reverse_kl"])
def test_a_top_k_label_equals_the_dense_label_with_zeros(kind):
    generator = torch.Generator().manual_seed(1)
    log_q = torch.log_softmax(torch.randn(5, 12, generator=generator), -1)
    values, indices = torch.randn(5, 12, generator=generator).topk(4, -1)
    p = torch.softmax(values, -1)
    dense = torch.zeros(5, 12).scatter(1, indices, p)
    torch.testing.assert_close(distribution_loss(kind, log_q, p, indices), distribution_loss(kind, log_q, dense))
    with pytest.raises(DraftsmithError, match="reverse_kl"):
        distribution_loss("reverse_kl", log_q, p, indices)


def test_lk_hybrid_holds_the_blend_weight_constant_in_the_gradient():
    generator = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(3, 7, generator=generator), -1)
    logits = torch.randn(3, 7, generator=generator, requires_grad=True)
    distribution_loss("lk_hybrid", torch.log_softmax(logits, -1), p, eta=2.0).sum().backward()
    blended = logits.grad.clone()
    logits.grad = None
    with torch.no_grad():
        weight = torch.exp(-2.0 * torch.minimum(p, torch.softmax(logits, -1)).sum(-1, keepdim=True))
    log_q = torch.log_softmax(logits, -1)
    (weight * by_hand("forward_kl", p, log_q)[:, None] + (1 - weight) * by_hand("tv", p, log_q)[:, None]).sum().backward()
    torch.testing.assert_close(blended, logits.grad)


def test_a_cold_drafter_keeps_a_finite_lk_gradient():
    p = torch.tensor([[1.0, 0.0, 0.0]])
    logits = torch.tensor([[-40.0, 20.0, 20.0]], requires_grad=True)  # no overlap with p at all (in float32)
    loss = distribution_loss("lk", torch.log_softmax(logits, -1), p)
    loss.backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logits.grad).all()


def test_bad_options_are_refused_naming_the_key():
    with pytest.raises(DraftsmithError, match="drafter.loss must be one of"):
        LossOptions(loss="kl").validate_loss()
    with pytest.raises(DraftsmithError, match="loss_eta"):
        LossOptions(loss="lk_hybrid", loss_eta=-1).validate_loss()
    with pytest.raises(DraftsmithError, match="top-k"):
        LossOptions(loss="reverse_kl").validate_loss(sparse_labels=True)
