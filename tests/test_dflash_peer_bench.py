"""bench/dflash_peer.py: the speculators model it trains starts as our drafter (same block logits) and learns from
the same targets; its batches are ours packed as the library's collate packs them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from speculators_parity import ours_dflash_logits, speculators_dflash_logits
from test_export_support import draft_vocab
from tiny import save_target, tiny_target

from draftsmith.drafters import dflash

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("dflash_peer_bench", ROOT / "bench" / "dflash_peer.py")
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)

ANCHORS = [2, 7, 11]


@pytest.fixture(scope="module", params=[None, 64], ids=["full-vocab", "draft-vocab"])
def started(request, tmp_path_factory):
    pytest.importorskip("speculators")
    root = tmp_path_factory.mktemp("peer")
    target = tiny_target("qwen3")
    target.name = save_target(target, root / "target")
    target.model.requires_grad_(False)
    vocab = draft_vocab(size=request.param) if request.param else None
    drafter = dflash.create(dflash.Config(block_size=4, num_layers=1), target, draft_vocab=vocab)
    with torch.no_grad():  # off the initialisation, so a weight left behind shows
        generator = torch.Generator().manual_seed(0)
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return target, drafter, peer.peer_model(drafter, target, root / "peer")


def test_the_peer_starts_as_our_drafter(started):
    target, drafter, model = started
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    ours, theirs = ours_dflash_logits(drafter, target, ids, ANCHORS), speculators_dflash_logits(model, target, ids,
                                                                                                ANCHORS)
    assert float((ours["logits"] - theirs["logits"]).abs().max()) < 1e-3
    assert torch.equal(ours["logits"].argmax(-1), theirs["logits"].argmax(-1))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(name.startswith(("embed_tokens", "lm_head", "verifier_")) for name in trainable)


def test_the_peer_learns_from_the_targets_distribution_we_learn_from(started):
    """Its targets at block position k of anchor a are the target's logits at a+k-1 over the head's rows (the verifier's
    final norm and head rows, which the bench copies in); a head without the final norm would differ."""
    target, drafter, model = started
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(2))
    mask = torch.zeros_like(ids)
    mask[0, ANCHORS] = 1
    module = importlib.import_module(type(model).__module__)
    scored = []
    with torch.no_grad(), mock.patch.object(module, "compute_metrics",
                                            lambda *args, **_: scored.append(args) or (torch.zeros(()), {})):
        out = target.model(ids, output_hidden_states=True)
        features = target.forward(ids, layers=drafter.required_layers, logits=False).features
        batch = peer.packed({"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids),
                             "features": features}, drafter.layer_ids, target.num_layers - 1)
        model(**batch, max_anchors=len(ANCHORS))
    targets = scored[0][1].view(len(ANCHORS), 4, -1)[:, 1:].float()
    rows = drafter.draft_ids if drafter.draft_ids is not None else torch.arange(target.vocab_size)
    expected = torch.stack([out.logits[0, a:a + 3][:, rows] for a in ANCHORS]).float()
    torch.testing.assert_close(targets, expected, rtol=1e-4, atol=1e-4)


def test_a_padded_micro_batch_packs_into_one_row_of_documents():
    features = {3: torch.arange(12.0).view(2, 3, 2), 5: -torch.arange(12.0).view(2, 3, 2)}
    batch = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]), "loss_mask": torch.tensor([[0, 1, 1], [1, 1, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]), "features": features}
    out = peer.packed(batch, [3], 5)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9]] and out["loss_mask"].tolist() == [[0, 1, 1, 1, 1]]
    assert out["document_ids"].tolist() == [[0, 0, 0, 1, 1]] and out["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert out["hidden_states"][0, :, 0].tolist() == [0, 2, 4, 6, 8]
    assert out["verifier_last_hidden_states"][0, :, 1].tolist() == [-1, -3, -5, -7, -9]
