"""Medusa-1 heads: the loss by hand, what a chain drafts, lossless greedy decoding, frozen target, errors."""

import hashlib

import pytest
import torch

from draftsmith.config import build
from draftsmith.drafters import DecodeState, DraftShape, Sampling, kind_module, medusa
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate
from tiny import tiny_target


def frozen(target):
    target.model.requires_grad_(False)
    return target


def make(target, **options):
    drafter = medusa.create(medusa.Config(**options), target)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # unlike the initialisation (W = 0, head = lm_head), so a wrong index shows
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return drafter


def batch_for(target, length=16):
    ids = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    features = target.forward(ids, layers=[target.num_layers - 1], logits=False).features
    return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids), "features": features}


def by_hand(drafter, i, normed):
    """Head i written out: n ResBlocks x + SiLU(Wx + b), then the projection."""
    x = normed
    for layer in drafter.blocks[i].layers:
        x = x + torch.nn.functional.silu(x @ layer.linear.weight.T + layer.linear.bias)
    return x @ drafter.lm_heads[i].weight.T


def test_loss_equals_the_definition_computed_by_hand(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=3, num_layers=2)
    batch = batch_for(target)
    value, metrics = drafter.loss(batch, target.head)
    with torch.no_grad():
        out = target.model(batch["input_ids"], output_hidden_states=True)
        normed, p = out.hidden_states[-1], torch.softmax(out.logits.float(), -1)  # after the final norm
        total = 0.0
        for i in range(3):
            log_q = torch.log_softmax(by_hand(drafter, i, normed), -1)
            n = 16 - 2 - i  # index t predicts x_{t+2+i}, learned from position 4 on: t >= 2 - i
            ce = -(p[:, 1 + i : 1 + i + n] * log_q[:, :n]).sum(-1)[:, 2 - i :]
            total = total + 0.8**i * ce.mean()
            hits = (log_q[:, :n].argmax(-1) == p[:, 1 + i : 1 + i + n].argmax(-1))[:, 2 - i :]
            assert metrics[f"acc_{i}"] == pytest.approx(float(hits.float().mean()))
            assert metrics[f"top5_{i}"] >= metrics[f"acc_{i}"]
    torch.testing.assert_close(value, total, rtol=1e-4, atol=1e-5)


def test_a_chain_is_each_heads_choice_at_the_feature_before_the_last_token(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=4)
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    features = target.forward(tokens[None, :-1], layers=[target.num_layers - 1], logits=False).features
    draft = drafter.proposer(target).propose(DecodeState(tokens[None], features), DraftShape(length=3), Sampling())
    with torch.no_grad():
        normed = target.model(tokens[None], output_hidden_states=True).hidden_states[-1][0, -2]
        expected = [int(by_hand(drafter, i, normed).argmax()) for i in range(3)]
    assert draft.tokens.tolist() == expected


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_decoding_is_token_identical_to_the_plain_loop(arch):
    target = frozen(tiny_target(arch))
    drafter = make(target, num_heads=4)
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 32, eos=set()).tokens
    spec = speculative_generate(target, drafter.proposer(target), prompt, DraftShape(length=4), Sampling(), 32, eos=set())
    assert spec.tokens == plain


def test_training_moves_the_heads_only_and_the_folder_round_trips(tiny_qwen3, tmp_path):
    target = frozen(tiny_qwen3)
    before = hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sorted(target.model.state_dict().items())))
    drafter = medusa.create(medusa.Config(num_heads=2), target)
    assert torch.equal(drafter.lm_heads[1].weight, target.model.lm_head.weight)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    batch = batch_for(target)
    for _ in range(3):
        loss, _ = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sorted(target.model.state_dict().items())))
    assert after.hexdigest() == before.hexdigest()
    assert not torch.equal(drafter.lm_heads[1].weight, target.model.lm_head.weight)
    drafter.save_pretrained(tmp_path / "d")
    loaded = kind_module("medusa").Drafter.from_pretrained(tmp_path / "d", target)
    assert sorted(loaded.state_dict()) == sorted(drafter.state_dict())  # heads only: no target parts stored
    torch.testing.assert_close(loaded.loss(batch, target.head)[0], drafter.loss(batch, target.head)[0])


def test_bad_options_name_the_key(tiny_qwen3):
    with pytest.raises(DraftsmithError, match="drafter.num_heads must be at least 1"):
        build(medusa.Config, {"num_heads": 0}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.top_k"):
        build(medusa.Config, {"top_k": 0}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="data.draft_vocab: null"):
        medusa.create(medusa.Config(), tiny_qwen3, draft_vocab=object())


def test_trees_hold_each_heads_top_choices_and_decode_losslessly(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=3)
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    features = target.forward(tokens[None, :-1], layers=[target.num_layers - 1], logits=False).features
    draft = drafter.proposer(target).propose(DecodeState(tokens[None], features), DraftShape(tree=(3, 2, 6)), Sampling())
    assert len(draft) == 6 and bool((draft.parents < torch.arange(6)).all())
    feature = features[target.num_layers - 1][0, -1]
    for node in range(len(draft)):
        depth, at = 0, node
        while at >= 0:
            depth, at = depth + 1, int(draft.parents[at])
        top = drafter.head(depth - 1, feature).topk(2).indices.tolist()  # a depth-d node is head d-1's pick
        assert int(draft.tokens[node]) in top
    prompt = tokens[None]
    plain = plain_generate(target, prompt, Sampling(), 24, eos=set()).tokens
    spec = speculative_generate(target, drafter.proposer(target), prompt, DraftShape(tree=(3, 2, 6)), Sampling(), 24,
                                eos=set())
    assert spec.tokens == plain


def test_the_medusa_export_is_vllms_layout_and_round_trips(tiny_qwen3, tmp_path):
    import json

    from safetensors.torch import load_file

    from draftsmith.export import export, medusa as medusa_export

    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=2, num_layers=2)
    drafter.save_pretrained(tmp_path / "best")
    out = export(tmp_path / "best", "medusa", tmp_path / "out", verifier="Qwen/Qwen3-0.6B")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert (config["num_heads"], config["num_hidden_layers"], config["medusa_fc_bias"]) == (2, 2, True)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["blocks.1.layers.1.bias"].shape == (64,) and tensors["lm_heads.0.weight"].shape == (320, 64)
    ours = drafter.state_dict()
    assert torch.equal(tensors["blocks.1.layers.0.weight"], ours["blocks.1.layers.0.linear.weight"])
    assert '"method": "medusa"' in (out / "README.md").read_text()
    # what vLLM would build differently fails the validator: a bias it would not load
    config["medusa_fc_bias"] = False
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="blocks.0.layers.0.bias: not a parameter"):
        medusa_export.validate(out)
