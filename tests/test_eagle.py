"""EAGLE-3 / EAGLE-1 drafter: training-time test equals autoregressive decoding, loss, saving, vocab, decoding."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_losses import by_hand as by_hand_loss

from draftsmith.drafters import DecodeState, DraftShape, Sampling, kind_module
from draftsmith.drafters import eagle
from draftsmith.drafters.eagle_training import _indices_leading_to
from draftsmith.errors import DraftsmithError
from draftsmith.target import Target


def frozen(target):
    for p in target.model.parameters():
        p.requires_grad_(False)
    return target


def make_batch(target, drafter, batch=2, length=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (batch, length), generator=generator)
    features = target.forward(ids, layers=drafter.required_layers, logits=False).features
    ones = torch.ones_like(ids)
    return {"input_ids": ids, "loss_mask": ones, "attention_mask": ones, "features": features}


def draft_vocab(target, size, seed=0):
    used = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    t2d = torch.zeros(target.vocab_size, dtype=torch.bool)
    t2d[used] = True
    return SimpleNamespace(d2t=used - torch.arange(size), t2d=t2d)


def autoregressive_logits(drafter, head, ids, features, t, steps):
    """Decode-time run: the drafter over indices 0..t with its cache, then `steps - 1` steps that feed
    its own output hidden and the next true token (teacher forcing) at positions t+1, t+2, ..."""
    fused = drafter.fuse({layer: f[:, : t + 1] for layer, f in features.items()})
    mask = torch.ones(t + 1, t + 1, dtype=torch.bool).tril()
    hidden, past = drafter.step(ids[:, 1 : t + 2], fused, torch.arange(t + 1)[None], None, mask)
    hidden = hidden[:, -1:]
    logits = [drafter.logits(hidden, head)[0, 0]]
    for j in range(1, steps):
        token = ids[:, t + 1 + j : t + 2 + j]
        hidden, past = drafter.step(token, hidden, torch.tensor([[t + j]]), past)
        logits.append(drafter.logits(hidden, head)[0, 0])
    return logits


@pytest.mark.parametrize("arch,variant,options", [("llama", "eagle3", {}), ("qwen3", "eagle3", {}), ("llama", "eagle1", {}),
                                                  ("llama", "eagle3", {"fc_norm": True, "norm_output": True}),
                                                  ("qwen3", "eagle3", {"num_layers": 3})])
def test_training_time_test_equals_autoregressive_decoding(arch, variant, options):
    """(EAGLE 3.1: a norm per feature layer before fc and final-normed outputs fed forward; num_layers=3: two plain
    layers after the first, whose step-0 keys come from the layer below at every index)"""
    from tiny import tiny_target

    target = frozen(tiny_target(arch))
    torch.manual_seed(1)
    drafter = eagle.create(eagle.Config(variant=variant, ttt_steps=4, **options), target).eval()
    with torch.no_grad():  # make the norms non-trivial so every piece matters
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    batch = make_batch(target, drafter, batch=1, length=14)
    ids, features = batch["input_ids"], batch["features"]
    with torch.no_grad():
        outputs = drafter.ttt_forward(ids, features)
        for t in (0, 3, 8):
            reference = autoregressive_logits(drafter, target.head, ids, features, t, steps=4)
            for j, expected in enumerate(reference):
                trained = drafter.logits(outputs[j][:, t], target.head)[0]
                torch.testing.assert_close(trained, expected, atol=2e-5, rtol=1e-4, msg=f"step {j}, index {t}")
        # Steps really differ: step 1 is not step 0 again.
        assert not torch.allclose(outputs[0][:, 3], outputs[1][:, 3], atol=1e-3)


def test_padding_does_not_change_real_positions(tiny_llama):
    """A left-padded copy gives the same TTT outputs at the real positions (RoPE is relative)."""
    target = frozen(tiny_llama)
    drafter = eagle.create(eagle.Config(ttt_steps=3), target).eval()
    batch = make_batch(target, drafter, batch=1, length=12)
    pad = 4
    ids = torch.cat([torch.zeros(1, pad, dtype=torch.long), batch["input_ids"]], 1)
    padded = {k: torch.cat([torch.randn(1, pad, v.shape[-1]), v], 1) for k, v in batch["features"].items()}
    attention_mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], 1)
    with torch.no_grad():
        plain = drafter.ttt_forward(batch["input_ids"], batch["features"])
        shifted = drafter.ttt_forward(ids, padded, attention_mask)
    for j in range(3):
        real = 12 - 1 - j  # indices whose step-j token is inside the sequence
        torch.testing.assert_close(shifted[j][:, pad : pad + real], plain[j][:, :real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", ["eagle3", "eagle1"])
def test_loss_decreases_when_overfitting(tiny_llama, variant):
    target = frozen(tiny_llama)
    with torch.no_grad():  # a random tiny target is nearly uniform; sharpen it so there is something to learn
        target.model.get_output_embeddings().weight.mul_(30)
    torch.manual_seed(0)
    drafter = eagle.create(eagle.Config(variant=variant, ttt_steps=3), target).train()
    batch = make_batch(target, drafter)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    assert all(not p.requires_grad for p in target.model.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    history = []
    for _ in range(40):
        loss, metrics = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(metrics)
    assert target.model.get_input_embeddings().weight.grad is None  # the target's embedding stays frozen
    assert not any("embed" in name for name in drafter.state_dict())  # and is never part of the drafter
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    assert {"acc_0", "acc_1", "acc_2", "loss_2"} <= set(history[-1])
    assert history[-1]["acc_0"] > history[0]["acc_0"] + 0.3


def test_eagle1_noise_only_in_training(tiny_llama):
    target = frozen(tiny_llama)
    drafter = eagle.create(eagle.Config(variant="eagle1"), target)
    assert drafter.config.ttt_steps == 1 and drafter.config.layers == [7]
    assert drafter.fc.bias is not None and drafter.fc.in_features == 128
    assert not hasattr(drafter.layers[0], "input_layernorm") and not hasattr(drafter, "lm_head")
    batch = make_batch(target, drafter, batch=1, length=10)
    run = lambda: drafter.ttt_forward(batch["input_ids"], batch["features"])[0]  # noqa: E731
    drafter.eval()
    torch.testing.assert_close(run(), run())
    drafter.train()
    assert not torch.allclose(run(), run())


def test_save_and_load_round_trip(tiny_llama, tmp_path):
    target = frozen(tiny_llama)
    vocab = draft_vocab(target, 64)
    drafter = eagle.create(eagle.Config(ttt_steps=3), target, vocab).eval()
    with torch.no_grad():
        drafter.fc.weight.normal_()  # differ from any fresh initialisation
    drafter.save_pretrained(tmp_path / "d")
    loaded = kind_module("eagle").Drafter.from_pretrained(tmp_path / "d", target).eval()
    assert loaded.config == drafter.config and loaded.config.ttt_steps == 3
    assert loaded.target_info == {"target_name": "tiny-llama", "target_architectures": ["LlamaForCausalLM"],
                                  "target_fingerprint": target.fingerprint()}
    meta = json.loads((tmp_path / "d" / "config.json").read_text())
    assert meta["draftsmith_kind"] == "eagle" and meta["transformer_layer_config"]["draft_vocab_size"] == 64
    assert set(load_file(str(tmp_path / "d" / "model.safetensors"))) == set(drafter.state_dict())
    batch = make_batch(target, drafter)
    torch.testing.assert_close(loaded.loss(batch, target.head)[0], drafter.loss(batch, target.head)[0], rtol=0, atol=0)
    assert torch.equal(loaded.d2t, vocab.d2t) and torch.equal(loaded.t2d, vocab.t2d)
    state = DecodeState(batch["input_ids"][:1, :9], {k: v[:1, :8] for k, v in batch["features"].items()})
    fresh = eagle.load_proposer(tmp_path / "d", target).propose(state, DraftShape(4), Sampling())
    assert torch.equal(fresh.tokens, drafter.proposer(target).propose(state, DraftShape(4), Sampling()).tokens)


def test_bf16_target_decodes_with_a_bf16_drafter(tiny_llama, tmp_path):
    target = frozen(tiny_llama)
    eagle.create(eagle.Config(), target).save_pretrained(tmp_path / "d")
    target.model.to(torch.bfloat16)
    proposer = eagle.load_proposer(tmp_path / "d", target)
    assert proposer.drafter.fc.weight.dtype == torch.bfloat16 and proposer.drafter.d2t.dtype == torch.long
    state = DecodeState(torch.randint(0, 320, (1, 9)), {})
    state.features = target.forward(state.tokens[:, :-1], layers=proposer.required_layers, logits=False).features
    assert len(proposer.propose(state, DraftShape(3), Sampling())) == 3
    assert len(proposer.propose(state, DraftShape(tree=(3, 2, 5)), Sampling(temperature=1.0))) == 5


def test_load_rejects_other_folders(tiny_llama, tmp_path):
    from tiny import tiny_target

    with pytest.raises(DraftsmithError, match="not a drafter folder"):
        eagle.Drafter.from_pretrained(tmp_path)
    drafter = eagle.create(eagle.Config(), frozen(tiny_llama))
    drafter.save_pretrained(tmp_path / "d")
    with pytest.raises(DraftsmithError, match="hidden size"):
        eagle.load_proposer(tmp_path / "d", tiny_target("llama", hidden_size=32))


def test_restricted_draft_vocabulary(tiny_llama):
    target = frozen(tiny_llama)
    vocab = draft_vocab(target, 48)
    drafter = eagle.create(eagle.Config(ttt_steps=2, init_head_from_target=True), target, vocab)
    assert drafter.lm_head.weight.shape == (48, 64) and drafter.d2t.shape == (48,) and drafter.t2d.shape == (320,)
    batch = make_batch(target, drafter)
    outputs = drafter.ttt_forward(batch["input_ids"], batch["features"])
    assert drafter.logits(outputs[0], target.head).shape == (2, 20, 48)
    # The head starts as the target's own head restricted to the draft vocabulary.
    last = batch["features"][7]
    expected = target.head(last)[..., drafter.draft_ids]
    torch.testing.assert_close(drafter.logits(last, None), expected, atol=1e-5, rtol=1e-4)
    loss, metrics = drafter.loss(batch, target.head)
    assert torch.isfinite(loss) and 0 <= metrics["acc_1"] <= 1
    proposer = drafter.proposer(target, generator=torch.Generator().manual_seed(0))
    state = DecodeState(batch["input_ids"][:1, :9], {k: v[:1, :8] for k, v in batch["features"].items()})
    assert vocab.t2d[proposer.propose(state, DraftShape(5), Sampling()).tokens].all()
    sampled = proposer.propose(state, DraftShape(3), Sampling(temperature=1.0, top_p=0.9))
    assert sampled.probs.shape == (3, 320) and vocab.t2d[sampled.tokens].all()
    assert sampled.probs[:, ~vocab.t2d].sum() == 0
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(3))
    tree = proposer.propose(state, DraftShape(tree=(3, 3, 8)), Sampling())
    assert vocab.t2d[tree.tokens].all()


def test_narrowed_head_keeps_the_most_frequent_tokens(tiny_llama, tmp_path):
    target = frozen(tiny_llama)
    drafter = eagle.create(eagle.Config(ttt_steps=2), target, draft_vocab(target, 48)).eval()
    with torch.no_grad():
        drafter.lm_head.weight.normal_()
    old_ids, counts = drafter.draft_ids.clone(), torch.zeros(320, dtype=torch.long)
    counts[old_ids[::3]] = torch.arange(16) + 1  # 16 seen tokens; the 16 most frequent are exactly these
    counts[5 if not drafter.t2d[5] else 6] = 1000  # outside the head: can never be kept
    batch = make_batch(target, drafter)
    hidden = drafter.ttt_forward(batch["input_ids"], batch["features"])[1]
    before = drafter.logits(hidden, None)
    drafter.narrow_vocab(counts, 16)
    assert torch.equal(drafter.draft_ids, old_ids[::3]) and drafter.lm_head.weight.shape == (16, 64)
    assert torch.equal(drafter.t2d.nonzero().flatten(), old_ids[::3])
    torch.testing.assert_close(drafter.logits(hidden, None), before[..., ::3], rtol=0, atol=0)
    drafter.narrow_vocab(counts, 4)  # ties are impossible here: keeps counts 13..16
    assert torch.equal(drafter.draft_ids, old_ids[::3][-4:])
    drafter.save_pretrained(tmp_path / "d")
    loaded = eagle.Drafter.from_pretrained(tmp_path / "d")
    assert torch.equal(loaded.draft_ids, drafter.draft_ids) and loaded.layer_config.draft_vocab_size == 4
    with pytest.raises(DraftsmithError, match="narrow"):
        drafter.narrow_vocab(counts, 5)


def test_out_of_vocabulary_positions_are_masked(tiny_llama):
    """Positions whose target argmax is outside the draft vocabulary carry no loss."""
    target = frozen(tiny_llama)
    drafter = eagle.create(eagle.Config(ttt_steps=1), target, draft_vocab(target, 48))
    batch = make_batch(target, drafter)
    argmax = target.head(batch["features"][7]).argmax(-1)
    outside = ~drafter.t2d[argmax]
    assert outside.any()
    only_outside = dict(batch, loss_mask=torch.zeros_like(batch["loss_mask"]))
    only_outside["loss_mask"][:, 2:] = outside[:, 1:-1].long()  # predicted token t+2 <- target at t+1
    assert drafter.loss(only_outside, target.head)[0] == 0
    assert drafter.loss(batch, target.head)[0] > 0


def dense_reference_loss(drafter, batch, head):
    """The EAGLE loss written the long way: the head at every index, the mask applied afterwards."""
    features = {int(k): v for k, v in batch["features"].items()}
    outputs = drafter.ttt_forward(batch["input_ids"], features, batch["attention_mask"])
    last, mask = features[drafter.last_layer], batch["loss_mask"].bool()
    full = head(last).float()
    target_ids, target_p = full.argmax(-1), torch.softmax(full[..., drafter.draft_ids], -1)
    total, accuracies = 0.0, []
    for j, hidden in enumerate(outputs):
        n = mask.shape[1] - 2 - j
        counted = mask[:, 2 + j : 2 + j + n]
        logits = drafter.logits(hidden[:, :n], head).float()
        step = by_hand_loss(drafter.config.loss, target_p[:, 1 + j : 1 + j + n], torch.log_softmax(logits, -1),
                            drafter.config.loss_eta)
        if not drafter.eagle3:
            regression = torch.nn.functional.smooth_l1_loss(
                hidden[:, :n], last[:, 1 + j : 1 + j + n], reduction="none").mean(-1)
            step = regression + drafter.config.token_loss_weight * step
        learned = (counted & drafter.t2d[target_ids[:, 1 + j : 1 + j + n]]).float()
        total = total + drafter.config.step_weight**j * (step * learned).sum() / learned.sum().clamp(min=1)
        right = drafter.draft_ids[logits.argmax(-1)] == target_ids[:, 1 + j : 1 + j + n]
        accuracies.append(float(right[counted].float().mean()))
    return total, accuracies


@pytest.mark.parametrize("loss", ["forward_kl", "tv", "lk_hybrid"])
def test_loss_at_learned_indices_equals_the_dense_masked_loss(tiny_llama, loss):
    """The head and loss run only where the predicted token is learned; loss, gradients and per-step accuracy
    equal the dense computation over every index with the mask applied afterwards (each written by hand), for
    each drafter.loss."""
    target = frozen(tiny_llama)
    scattered = (torch.rand(3, 24, generator=torch.Generator().manual_seed(1)) < 0.5).long()
    answers = torch.zeros(3, 24, dtype=torch.long)
    answers[0, 15:], answers[1, 9:20] = 1, 1  # a prompt, then an answer (row 1: then a second prompt)
    for drafter, mask in ((eagle.create(eagle.Config(ttt_steps=3, loss=loss), target, draft_vocab(target, 48)), scattered),
                          (eagle.create(eagle.Config(ttt_steps=3, loss=loss), target, draft_vocab(target, 48)), answers),
                          (eagle.create(eagle.Config(variant="eagle1", loss=loss), target), answers)):
        drafter.eval()
        batch = make_batch(target, drafter, batch=3, length=24)
        batch["loss_mask"] = mask.clone()
        batch["loss_mask"][2] = 0  # a row with nothing to learn
        ours, metrics = drafter.loss(batch, target.head)
        ours.backward()
        grads = [p.grad.clone() for p in drafter.parameters() if p.requires_grad]
        drafter.zero_grad()
        reference, accuracies = dense_reference_loss(drafter, batch, target.head)
        reference.backward()
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
        for grad, p in zip(grads, (p for p in drafter.parameters() if p.requires_grad)):
            torch.testing.assert_close(grad, p.grad, rtol=1e-4, atol=1e-6)
        assert [metrics[f"acc_{j}"] for j in range(len(accuracies))] == pytest.approx(accuracies)


def test_bad_inputs_are_clear_errors(tiny_llama):
    target = frozen(tiny_llama)
    broken = draft_vocab(target, 10)
    broken.d2t = torch.zeros(10, dtype=torch.long)
    with pytest.raises(DraftsmithError, match="draft vocabulary is inconsistent"):
        eagle.create(eagle.Config(), target, broken)
    with pytest.raises(DraftsmithError, match="three feature layers"):
        eagle.create(eagle.Config(layers=[1, 2]), target)
    with pytest.raises(DraftsmithError, match="last layer"):
        eagle.create(eagle.Config(variant="eagle1", layers=[3]), target)
    with pytest.raises(DraftsmithError, match="num_layers must be at least 1 \\(exactly 1 for eagle1\\)"):
        eagle.create(eagle.Config(variant="eagle1", num_layers=2), target)


def test_training_targets_from_draft_rows_equal_the_full_head(tiny_llama):
    """The loss computed from the draft rows of the head (plus a chunked full-vocabulary argmax) equals the
    loss from full [positions, V] logits, for EAGLE-3 with a draft vocabulary and EAGLE-1."""
    target = frozen(tiny_llama)
    for drafter in (eagle.create(eagle.Config(ttt_steps=2), target, draft_vocab(target, 48)),
                    eagle.create(eagle.Config(variant="eagle1"), target)):
        drafter.eval()  # EAGLE-1 adds feature noise in training mode
        batch = make_batch(target, drafter)
        full_head = lambda last: target.head(last)  # noqa: E731  (a plain function: the full-logits path)
        ours, ours_metrics = drafter.loss(batch, target.head)
        reference, reference_metrics = drafter.loss(batch, full_head)
        torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-6)
        assert ours_metrics == pytest.approx(reference_metrics, rel=1e-5, abs=1e-6)
    last = batch["features"][7][0]
    ids = torch.tensor([3, 17, 200, 5])
    old_chunk = type(target.head).CHUNK
    type(target.head).CHUNK = 7  # many chunks over the vocabulary, the last one short
    try:
        logits, argmax = target.head.draft_targets(last, ids)
        rows_only, none = target.head.draft_targets(last, ids, argmax=False)
    finally:
        type(target.head).CHUNK = old_chunk
    torch.testing.assert_close(logits, target.head(last)[..., ids])
    assert torch.equal(argmax, target.head(last).argmax(-1))
    torch.testing.assert_close(rows_only, logits) and none is None


def test_stored_top_k_gives_the_argmax_and_with_labels_topk_the_distribution(tiny_llama):
    """Top-k logits stored at capture: their first index replaces the head's pass over the whole vocabulary
    (same loss), and with labels=topk they are the distribution (the head's when k covers the vocabulary)."""
    from draftsmith.drafters import stored_soft_labels

    target = frozen(tiny_llama)
    vocab = draft_vocab(target, 48)
    drafter = eagle.create(eagle.Config(ttt_steps=2), target, vocab)
    batch = make_batch(target, drafter)
    logits = target.head(batch["features"][target.num_layers - 1]).float()
    reference, reference_metrics = drafter.loss(batch, target.head)
    values, indices = logits.topk(4, -1)
    ours, ours_metrics = drafter.loss(dict(batch, target_topk={"values": values, "indices": indices}), target.head)
    torch.testing.assert_close(ours, reference)
    assert ours_metrics == pytest.approx(reference_metrics, rel=1e-6, abs=1e-7)
    # the stored argmax is the one used: a token outside the draft vocabulary there masks every position out
    outside = torch.full_like(indices, int((~vocab.t2d).nonzero()[0]))
    masked, _ = drafter.loss(dict(batch, target_topk={"values": values, "indices": outside}), target.head)
    assert float(masked) == 0.0 and float(reference) > 0.0

    drafter.config.labels = "topk"
    with pytest.raises(DraftsmithError, match="topk"):
        drafter.loss(batch, target.head)
    every_values, every_indices = logits.topk(target.vocab_size, -1)
    everything = dict(batch, target_topk={"values": every_values, "indices": every_indices})
    torch.testing.assert_close(drafter.loss(everything, target.head)[0], reference, rtol=1e-5, atol=1e-5)

    flat_values, flat_indices = values.reshape(-1, 4), indices.reshape(-1, 4)
    p, argmax = stored_soft_labels(flat_values, flat_indices, drafter.draft_ids)
    assert torch.equal(argmax, flat_indices[:, 0])
    inside = vocab.t2d[flat_indices]
    for row in range(p.shape[0]):  # softmax over the top 4 that are rows, renormalised; zero elsewhere
        expected = torch.zeros(p.shape[1])
        if inside[row].any():
            slots = torch.searchsorted(drafter.draft_ids, flat_indices[row][inside[row]])
            expected[slots] = torch.softmax(flat_values[row][inside[row]], -1)
        torch.testing.assert_close(p[row], expected)
    assert (~inside.any(-1)).any() and inside.any(-1).any()  # both kinds of row were checked


def test_a_drafter_refuses_a_target_with_another_tokenizer(tiny_llama, tmp_path):
    from tiny import byte_tokenizer

    target = frozen(tiny_llama)
    eagle.create(eagle.Config(ttt_steps=1), target).save_pretrained(tmp_path / "d")
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "d" / "model.safetensors"))
    other_tokenizer = byte_tokenizer()
    other_tokenizer.add_tokens(["<extra>"])  # same sizes, other token ids
    other = Target(target.model, other_tokenizer, name="tiny-other")
    with pytest.raises(DraftsmithError, match="does not fit target 'tiny-other'.*tokenizer"):
        eagle.load_proposer(tmp_path / "d", other)
    eagle.load_proposer(tmp_path / "d", target)  # its own target loads


@pytest.mark.parametrize("variant,num_layers", [("eagle3", 1), ("peagle", 1), ("peagle", 2)])
def test_cod_sampling_runs_each_step_on_a_nested_share_of_the_indices_with_the_dense_values(tiny_llama, variant,
                                                                                             num_layers):
    """P-EAGLE's COD sampling (drafter.cod_ratio): step j learns from ceil(real x max(ratio^j, min)) of a row's
    indices, each step's inside the step before's, and what a step computes at an index is what the dense TTT
    computes there; the draw follows the micro-batch's place in the stream; validation scores every index."""
    target = frozen(tiny_llama)
    options = {"variant": variant, "ttt_steps": 4, "num_layers": num_layers, "cod_ratio_min": 0.2}
    torch.manual_seed(0)
    drafter = eagle.create(eagle.Config(cod_ratio=0.5, **options), target, draft_vocab(target, 48)).train()
    batch = make_batch(target, drafter, batch=2, length=24)
    batch["loss_mask"][1, :10], batch["micro_batch"] = 0, 3
    at, kept = _indices_leading_to(batch["loss_mask"].bool(), 4)
    shuffled, counted, widths = drafter._cod_sample(at, kept, batch)
    real = kept.sum(1).tolist()
    for j, share in enumerate([1, 0.5, 0.25, 0.2]):
        assert counted[j].sum(1).tolist() == [math.ceil(count * share) for count in real]
        assert widths[j] == max(math.ceil(count * share) for count in real) and counted[j].shape[1] == widths[j]
        if j:
            assert bool((counted[j] <= counted[j - 1][:, : widths[j]]).all())  # nested
    for row in range(2):  # step 0 learns from every real index of the row, each once
        assert sorted(shuffled[row, : widths[0]][counted[0][row]].tolist()) == sorted(at[row][kept[row]].tolist())
    with torch.no_grad():
        dense = drafter.ttt_forward(batch["input_ids"], batch["features"], batch["attention_mask"], at=at)
        sampled = drafter.ttt_forward(batch["input_ids"], batch["features"], batch["attention_mask"], at=shuffled,
                                      widths=widths)
    for j in range(4):
        assert sampled[j].shape[1] == widths[j] < at.shape[1] or j == 0
        for row in range(2):
            where = (at[row][None, :] == shuffled[row, : widths[j], None]).float().argmax(1)
            torch.testing.assert_close(sampled[j][row], dense[j][row, where], atol=1e-5, rtol=1e-4)
    again, _, _ = drafter._cod_sample(at, kept, batch)
    other, _, _ = drafter._cod_sample(at, kept, {**batch, "micro_batch": 4})
    assert torch.equal(again, shuffled) and not torch.equal(other, shuffled)
    loss, metrics = drafter.loss(batch, target.head)
    loss.backward()  # the sampled steps train
    assert drafter.layers[0].self_attn["q_proj"].weight.grad.abs().sum() > 0 and set(metrics) >= {"acc_3", "loss_3"}
    every = eagle.create(eagle.Config(**options), target, draft_vocab(target, 48))
    every.load_state_dict(drafter.state_dict())
    with torch.no_grad():  # validation: every index, as without COD
        assert float(drafter.eval().loss(batch, target.head)[0]) == pytest.approx(
            float(every.eval().loss(batch, target.head)[0]), rel=1e-6)
    for bad in ({"cod_ratio": 0.0}, {"cod_ratio_min": 1.5}, {"variant": "eagle1", "cod_ratio": 0.7}):
        with pytest.raises(DraftsmithError, match="cod_ratio"):
            eagle.Config(**bad).validate()
