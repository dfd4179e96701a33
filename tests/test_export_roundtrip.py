"""An exported folder loads back as a drafter and decodes exactly like the checkpoint it came from."""

from __future__ import annotations

import pytest
import torch
from test_export_support import load_exported, make_checkpoint, rewrite, target

from draftsmith import export as ex
from draftsmith.export import eagle3
from draftsmith.drafters import DecodeState, DraftShape, Sampling, kind_module
from draftsmith.errors import DraftsmithError
from draftsmith.eval import metrics
from draftsmith.eval.decoder import speculative_generate

PROMPTS = [[257, 72, 101, 108, 108, 111, 258], [257, 1, 2, 3, 1, 2, 3, 1, 2], [40, 41, 42, 43, 44, 45]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("roundtrip")
    checkpoint = make_checkpoint(root / "run", seed=3)
    return checkpoint, {fmt: ex.export(checkpoint, fmt, root / fmt) for fmt in eagle3.FORMATS}


def decode(proposer, shape, sampling):
    torch.manual_seed(0)  # the EAGLE proposer samples drafts from the global generator
    runs = [speculative_generate(target(), proposer, torch.tensor([p]), shape, sampling, max_new_tokens=24,
                                 generator=torch.Generator().manual_seed(i)) for i, p in enumerate(PROMPTS)]
    return [g.tokens for g in runs], metrics.acceptance(runs)


@pytest.mark.parametrize("fmt", eagle3.FORMATS)
def test_draft_logits_are_identical(folders, fmt):
    checkpoint, exported = folders
    original = kind_module("eagle").load_proposer(checkpoint, target())
    loaded = load_exported(exported[fmt], target())
    tokens = torch.tensor([PROMPTS[0]])
    layers = original.required_layers
    assert loaded.required_layers == layers
    features = target().forward(tokens, layers=layers, logits=False).features
    state = DecodeState(tokens, {i: f[:, :-1] for i, f in features.items()}, prompt_length=tokens.shape[1])
    for proposer in (original, loaded):
        proposer.reset()
    _, logits_a, _ = original._catch_up(state)
    _, logits_b, _ = loaded._catch_up(state)
    assert torch.equal(logits_a, logits_b)


@pytest.mark.parametrize("fmt", eagle3.FORMATS)
@pytest.mark.parametrize("shape,sampling", [
    (DraftShape(length=4), Sampling()),
    (DraftShape(tree=(3, 2, 6)), Sampling()),
    (DraftShape(length=3), Sampling(temperature=1.0)),
], ids=["greedy-chain", "greedy-tree", "sampled-chain"])
def test_same_tokens_and_acceptance_as_the_checkpoint(folders, fmt, shape, sampling):
    checkpoint, exported = folders
    tokens_a, acceptance_a = decode(kind_module("eagle").load_proposer(checkpoint, target()), shape, sampling)
    tokens_b, acceptance_b = decode(load_exported(exported[fmt], target()), shape, sampling)
    assert tokens_a == tokens_b
    assert acceptance_a == acceptance_b
    assert acceptance_a["verify_passes"] > 0


def test_a_broken_export_does_not_load(folders, tmp_path):
    import shutil

    _, exported = folders
    broken = tmp_path / "broken"
    shutil.copytree(exported["speculators"], broken)
    rewrite(broken, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))
    with pytest.raises(DraftsmithError, match="aux hidden-state layer ids"):
        load_exported(broken, target())


def test_an_export_for_another_target_does_not_load(folders):
    from tiny import tiny_target

    _, exported = folders
    with pytest.raises(DraftsmithError, match="fc input width|vocab_size|out of range"):
        load_exported(exported["sglang"], tiny_target("llama", hidden_size=32))


def test_round_trip_keeps_a_high_acceptance(tmp_path):
    from test_export_support import always_accepted_target

    rigged = always_accepted_target()
    checkpoint = make_checkpoint(tmp_path / "run", for_target=rigged, perturb=False, init_head_from_target=True)
    shape, sampling = DraftShape(length=4), Sampling()
    runs = {}
    for name, proposer in [("checkpoint", kind_module("eagle").load_proposer(checkpoint, rigged))] + [
            (fmt, load_exported(ex.export(checkpoint, fmt, tmp_path / fmt), rigged)) for fmt in eagle3.FORMATS]:
        generations = [speculative_generate(rigged, proposer, torch.tensor([p]), shape, sampling, 21) for p in PROMPTS]
        runs[name] = ([g.tokens for g in generations], metrics.acceptance(generations))
    assert runs["checkpoint"][1]["acceptance_length"] == 5.0  # every draft accepted: 4 drafted + 1 bonus
    assert runs["speculators"] == runs["checkpoint"] == runs["sglang"]
