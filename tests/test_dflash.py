"""DFlash: the loss by hand, the attention mask, proposing = training forward, lossless greedy, frozen target,
anchors, errors."""

import hashlib

import pytest
import torch
from test_export_support import draft_vocab
from test_losses import by_hand as by_hand_loss
from tiny import tiny_target

from draftsmith.config import build
from draftsmith.data.capture import parse_layers
from draftsmith.drafters import DecodeState, DraftShape, Sampling, dflash, kind_module
from draftsmith.drafters.dflash_training import MAX_ANCHORS
from draftsmith.drafters.dflash_layers import BlockLayout, block_attention_mask, flex_block_mask
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate


def frozen(target):
    target.model.requires_grad_(False)
    return target


def make(target, seed=0, vocab=None, **options):
    """A drafter whose norms are not all ones, so a norm applied in the wrong place shows (`vocab`: a draft
    vocabulary)."""
    drafter = dflash.create(dflash.Config(**options), target, draft_vocab=vocab)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return drafter


def batch_for(target, drafter, length=20):
    ids = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:, :5] = 0
    features = target.forward(ids, layers=drafter.required_layers, logits=False).features
    return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids), "features": features}


# --------------------------------------------------------------------------- a block written out by hand
def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x, positions, theta):
    d = x.shape[-1]
    angles = positions[:, None].float() * (1.0 / theta ** (torch.arange(0, d, 2).float() / d))[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def by_hand(drafter, target, context_features, block_ids, anchor):
    """Normed hiddens [B, H] of one block at `anchor` over `context_features` [anchor, nH]: plain softmax
    attention of the block's queries over [context; block] keys, no mask at all (the context is cut by hand)."""
    cfg, eps = drafter.layer_config, drafter.layer_config.rms_norm_eps
    theta, d = cfg.rope_parameters["rope_theta"], cfg.head_dim
    c = rms(context_features @ drafter.fc.weight.T, drafter.hidden_norm.weight, eps)
    x = target.model.get_input_embeddings().weight[block_ids]
    ctx_pos, blk_pos = torch.arange(anchor), torch.arange(anchor, anchor + len(block_ids))
    for layer in drafter.layers:
        a = layer.self_attn
        h = rms(x, layer.input_layernorm.weight, eps)
        q = rotate(rms((h @ a.q_proj.weight.T).view(len(h), -1, d), a.q_norm.weight, eps).transpose(0, 1), blk_pos, theta)
        keys, values = [], []
        for source, pos in ((c, ctx_pos), (h, blk_pos)):
            k = rms((source @ a.k_proj.weight.T).view(len(source), -1, d), a.k_norm.weight, eps).transpose(0, 1)
            keys.append(rotate(k, pos, theta))
            values.append((source @ a.v_proj.weight.T).view(len(source), -1, d).transpose(0, 1))
        k, v = torch.cat(keys, 1), torch.cat(values, 1)
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        out = torch.softmax(q @ k.transpose(1, 2) / d**0.5, -1) @ v
        x = x + out.transpose(0, 1).reshape(len(h), -1) @ a.o_proj.weight.T
        h = rms(x, layer.post_attention_layernorm.weight, eps)
        m = layer.mlp
        x = x + (torch.nn.functional.silu(h @ m.gate_proj.weight.T) * (h @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    return rms(x, drafter.norm.weight, eps)


@pytest.mark.parametrize("vocab_size", [None, 64], ids=["full", "draft-vocab"])
@pytest.mark.parametrize("loss,weighting", [("forward_kl", "decay"), ("lk", "decay"), ("lk", "dpace")])
def test_loss_equals_the_definition_computed_by_hand(tiny_qwen3, vocab_size, loss, weighting):
    """Over a draft vocabulary: the drafter's own head, labels renormalised over its rows, accuracy against the
    target's argmax over the whole vocabulary. D-PACE: each block's weights from the drafter's confidences there."""
    target = frozen(tiny_qwen3)
    vocab = draft_vocab(size=vocab_size) if vocab_size else None
    drafter = make(target, vocab=vocab, block_size=4, num_layers=2, gamma=2.0, loss=loss,
                   position_weighting=weighting, dpace_alpha=0.3)
    ids = vocab.t2d.nonzero().flatten() if vocab else torch.arange(target.vocab_size)
    head = drafter.lm_head.weight if vocab else target.model.lm_head.weight
    batch = batch_for(target, drafter)
    anchors = torch.tensor([[4, 9, 17], [6, 12, -1]])  # 17: positions past the end are not counted; -1 unused
    value, metrics = drafter(batch, target.head, anchors=anchors)
    with torch.no_grad():
        out = target.model(batch["input_ids"], output_hidden_states=True)
        p = torch.softmax(out.logits.float()[..., ids], -1)
        best = out.logits.argmax(-1)
        context = torch.cat([batch["features"][i] for i in drafter.layer_ids], -1)
        ce = {k: [] for k in (1, 2, 3)}
        hits = {k: [] for k in (1, 2, 3)}
        for row, anchor in [(0, 4), (0, 9), (0, 17), (1, 6), (1, 12)]:
            block = torch.tensor([int(batch["input_ids"][row, anchor])] + [drafter.mask_token_id] * 3)
            hidden = by_hand(drafter, target, context[row, :anchor], block, anchor)
            log_q = torch.log_softmax(hidden @ head.T, -1)
            counted = [k for k in (1, 2, 3) if anchor + k < 20]  # every position from 5 on is loss-masked
            # D-PACE: w_k = sum over counted j >= k of prod_{i <= j} (0.7 exp(-CE_i) + 0.3)
            smooth = {k: 0.7 * torch.exp((p[row, anchor + k - 1] * log_q[k]).sum()) + 0.3 for k in counted}
            reach = {j: torch.stack([smooth[i] for i in counted if i <= j]).prod() for j in counted}
            for k in counted:
                decay = torch.exp(torch.tensor(-(k - 1) / 2.0))
                weight = sum(reach[j] for j in counted if j >= k) if weighting == "dpace" else decay
                ce[k].append(weight * by_hand_loss(loss, p[row, anchor + k - 1], log_q[k]))
                hits[k].append(float(ids[log_q[k].argmax()] == best[row, anchor + k - 1]))
        total = sum(torch.stack(ce[k]).mean() for k in (1, 2, 3))
    torch.testing.assert_close(value, total, rtol=1e-4, atol=1e-5)
    for k in (1, 2, 3):
        assert metrics[f"acc_{k - 1}"] == pytest.approx(sum(hits[k]) / len(hits[k]))


def test_the_attention_mask_is_context_before_the_anchor_and_the_whole_own_block():
    anchors, length, size = torch.tensor([[3, 7], [1, 5]]), 10, 4
    mask = block_attention_mask(anchors, length, size)
    assert mask.shape == (2, 1, 8, 18)
    for row in range(2):
        for query in range(8):
            n = query // size
            for key in range(18):
                if key < length:
                    expected = key < int(anchors[row, n])
                else:
                    expected = (key - length) // size == n
                assert bool(mask[row, 0, query, key]) == expected


def two_spans() -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [2, 20] and a loss mask learning 8..11 of the first sequence and 3.. of the second."""
    loss_mask = torch.zeros(2, 20, dtype=torch.long)
    loss_mask[0, 8:12] = 1
    loss_mask[1, 3:] = 1
    return torch.arange(40).view(2, 20), loss_mask


def test_anchors_lie_in_loss_masked_spans_and_are_seeded(tiny_qwen3):
    drafter = make(frozen(tiny_qwen3), anchors_per_sequence=3)
    ids, loss_mask = two_spans()
    anchors = drafter.sample_anchors(ids, loss_mask)
    assert len(set(anchors[0].tolist())) == 3 and set(anchors[0].tolist()) <= {7, 8, 9, 10}  # x_{a+1} in 8..11
    for row in range(2):
        for a in anchors[row].tolist():
            assert a >= 1 and loss_mask[row, a + 1] == 1
    assert torch.equal(anchors, drafter.sample_anchors(ids, loss_mask))
    draws = {tuple(drafter.sample_anchors(ids, loss_mask, torch.tensor([s, 0]))[1].tolist()) for s in range(8)}
    assert len(draws) > 1  # other samples, other anchors
    short = torch.zeros(1, 20, dtype=torch.long)
    short[0, 19] = 1  # one possible anchor (18, whose first label is the last token): the rest are unused
    assert drafter.sample_anchors(ids[:1], short).tolist() == [[18, -1, -1]]
    # fresh anchors: each micro-batch of the training stream draws its own, the same one draws the same again
    fresh = {tuple(drafter.sample_anchors(ids, loss_mask, draw=d)[1].tolist()) for d in range(8)}
    assert len(fresh) > 1 and torch.equal(drafter.sample_anchors(ids, loss_mask, draw=5),
                                          drafter.sample_anchors(ids, loss_mask, draw=5))


def test_anchors_per_sequence_0_draws_every_allowed_anchor(tiny_qwen3):
    drafter = make(frozen(tiny_qwen3), anchors_per_sequence=0)
    ids, loss_mask = two_spans()
    anchors = drafter.sample_anchors(ids, loss_mask)
    assert anchors[0].tolist() == [7, 8, 9, 10] + [-1] * 13  # x_{a+1} in 8..11; as wide as the widest row
    assert anchors[1].tolist() == list(range(2, 19))
    many = torch.ones(1, 2000, dtype=torch.long)
    assert drafter.sample_anchors(torch.zeros(1, 2000, dtype=torch.long), many).shape == (1, MAX_ANCHORS)
    few = make(frozen(tiny_qwen3), anchors_per_sequence=2)
    assert few.sample_anchors(ids, loss_mask).shape == (2, 2)
    assert torch.equal(few.sample_anchors(ids, loss_mask, every=True), anchors)


def test_validation_counts_every_allowed_block(tiny_qwen3):
    """In eval mode a drafter drawing 2 blocks per sequence in training scores every allowed block."""
    target = frozen(tiny_qwen3)
    drafter = make(target, block_size=4, anchors_per_sequence=2)
    batch = batch_for(target, drafter)
    every = drafter.sample_anchors(batch["input_ids"], batch["loss_mask"], every=True)
    with torch.no_grad():
        drafter.eval()
        assert drafter(batch, target.head)[1] == drafter(batch, target.head, anchors=every)[1]
        drafter.train()
        assert drafter(batch, target.head)[1] != drafter(batch, target.head, anchors=every)[1]


@pytest.mark.parametrize("anchors", [[[4, 9, 13, 15], [6, 12, 16, -1]], [[1, 2, 3, 4], [2, 3, 4, 5]]],
                         ids=["spread", "overlapping"])
def test_blockwise_attention_gives_the_sdpa_loss_and_gradients(tiny_qwen3, anchors):
    """Context and own-block scores under one softmax = SDPA over all blocks with the block mask (GQA: 4 query heads
    on 2 key/value heads); overlapping blocks share label positions, computed once."""
    target = frozen(tiny_qwen3)
    sdpa = make(target, block_size=4, num_layers=2, attention="sdpa")
    blockwise = make(target, block_size=4, num_layers=2, attention="blockwise")
    blockwise.load_state_dict(sdpa.state_dict())
    batch, anchors = batch_for(target, sdpa), torch.tensor(anchors)
    (dense, dense_metrics), (split, split_metrics) = (d(batch, target.head, anchors=anchors) for d in (sdpa, blockwise))
    torch.testing.assert_close(split, dense, rtol=1e-5, atol=1e-6)
    assert split_metrics == pytest.approx(dense_metrics, rel=1e-4, abs=1e-6)
    dense.backward()
    split.backward()
    for (name, a), b in zip(sdpa.named_parameters(), blockwise.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # a block that sees its anchor's own context position differs: the rule is what it says
        block = torch.full((2, 16), sdpa.mask_token_id)
        positions = torch.arange(16)[None].expand(2, -1)
        context = sdpa.context_kv(batch["features"], 0, 20)
        at = anchors.clamp(min=0)
        right = sdpa.blocks(block, positions, context, BlockLayout(at, 20, 4))
        # float32 summation order differs between the two paths: 1.05e-6 apart on an AVX2-only EPYC
        torch.testing.assert_close(right, sdpa.blocks(block, positions, context, block_attention_mask(at, 20, 4)),
                                   rtol=1e-5, atol=1e-5)
        assert not torch.allclose(right, sdpa.blocks(block, positions, context, BlockLayout(at + 1, 20, 4)),
                                  atol=1e-4)


def test_fresh_anchors_follow_the_training_stream_and_resume_exactly(tmp_path):
    """drafter.fresh_anchors: every micro-batch of the training stream draws its own anchors from its index there,
    so a run resumed from a checkpoint logs the same losses as one that never stopped."""
    from test_train import make_recipe, memory_data, read_log, required_layers, reset_accelerate_state
    from test_train_launch import crash_copy

    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe

    target = tiny_target("qwen3")
    options = {"kind": "dflash", "block_size": 4, "num_layers": 1, "anchors_per_sequence": 2, "fresh_anchors": True}
    straight = make_recipe(tmp_path, target, drafter=options, max_steps=6, checkpoint_every=3, keep_checkpoints=0,
                           lr=3e-3)
    seen, draws = [], straight.model.drafter.sample_anchors
    straight.model.drafter.sample_anchors = lambda *args, every: seen.append((args[3], every)) or draws(*args,
                                                                                                      every=every)
    straight.train()
    # one process, no accumulation: micro-batch s of the stream at step s, a few anchors each
    assert seen[:6] == [(s, False) for s in range(6)]
    assert seen[6:] and set(seen[6:]) == {(None, True)}  # held-out batches: every allowed block, at every validation
    crash_copy(tmp_path / "run", tmp_path / "crashed", 3, 6)
    reset_accelerate_state()
    config = load(TrainConfig, tmp_path / "recipe.yaml", ["resume=true", f"output_dir={tmp_path / 'crashed'}"])
    resumed = TrainRecipe(config, data=memory_data(target, required_layers(config, target)), target=target)
    resumed.setup()
    resumed.train()
    assert [r["loss"] for r in read_log(tmp_path / "crashed")] == [r["loss"] for r in read_log(tmp_path / "run")]


def test_default_layers_match_the_capture_spec():
    layers, count = 30, 5  # SmolLM2-135M
    assert dflash.default_layer_ids(layers, count) == [1, 8, 14, 20, 27]

    class Fake:
        num_layers, name = layers, "fake"

    assert parse_layers(f"dflash:{count}", Fake()) == dflash.default_layer_ids(layers, count) + [layers - 1]


def test_proposing_equals_the_training_forward_on_the_same_block(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, block_size=8, num_layers=2)
    tokens = torch.tensor([[257, 5, 6, 7, 8, 9, 10, 11, 12]])
    features = target.forward(tokens, layers=drafter.required_layers, logits=False).features
    T = tokens.shape[1]
    with torch.no_grad():
        expected = drafter.logits(drafter.block_hidden(tokens, features, torch.tensor([[T - 1]]))[0, 0, 1:])
    proposer = drafter.proposer(target)
    for cut in (5, T):  # a shorter prefix first, so the second call extends the cached context
        state = DecodeState(tokens[:, :cut], {i: f[:, : cut - 1] for i, f in features.items()})
        got = proposer.block_logits(state)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    draft = proposer.propose(state, DraftShape(length=5), Sampling())
    assert draft.tokens.tolist() == expected[:5].argmax(-1).tolist()
    rolled = tokens.clone()
    rolled[0, 6:] = 40  # a rejected suffix: the cache must drop positions 6.. and recompute them
    rolled_features = target.forward(rolled, layers=drafter.required_layers, logits=False).features
    state = DecodeState(rolled, {i: f[:, : T - 1] for i, f in rolled_features.items()})
    fresh = drafter.proposer(target).block_logits(state)
    torch.testing.assert_close(proposer.block_logits(state), fresh, rtol=1e-5, atol=1e-5)


def test_sampled_drafts_carry_their_distributions(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, block_size=4)
    tokens = torch.tensor([[257, 5, 6, 7]])
    features = target.forward(tokens[:, :-1], layers=drafter.required_layers, logits=False).features
    draft = drafter.proposer(target, torch.Generator().manual_seed(0)).propose(
        DecodeState(tokens, features), DraftShape(length=8), Sampling(temperature=0.7))
    assert len(draft) == 3 and draft.probs.shape == (3, 320)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(3))
    assert bool((draft.probs[torch.arange(3), draft.tokens] > 0).all())


@pytest.mark.parametrize("arch,block_size", [("qwen3", 4), ("qwen3", 8), ("llama", 8)])
def test_greedy_decoding_is_token_identical_to_the_plain_loop(arch, block_size):
    target = frozen(tiny_target(arch))
    drafter = make(target, block_size=block_size)
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 40, eos=set()).tokens
    spec = speculative_generate(target, drafter.proposer(target), prompt, DraftShape(length=block_size - 1),
                                Sampling(), 40, eos=set())
    assert spec.tokens == plain
    assert all(cycle.drafted == block_size - 1 for cycle in spec.cycles[:-1])


def test_training_moves_the_drafter_only_and_the_folder_round_trips(tiny_qwen3, tmp_path):
    target = frozen(tiny_qwen3)
    digest = lambda: hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sorted(target.model.state_dict().items())))
    before = digest().hexdigest()
    drafter = dflash.create(dflash.Config(block_size=4), target)
    start = {k: v.clone() for k, v in drafter.state_dict().items()}
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    batch = batch_for(target, drafter)
    for _ in range(3):
        loss, _ = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert digest().hexdigest() == before
    assert not torch.equal(start["fc.weight"], drafter.fc.weight)
    assert not any(k.startswith(("embed", "lm_head")) for k in drafter.state_dict())  # target parts never stored
    drafter.save_pretrained(tmp_path / "d")
    loaded = kind_module("dflash").Drafter.from_pretrained(tmp_path / "d", target)
    assert (loaded.layer_ids, loaded.mask_token_id) == (drafter.layer_ids, drafter.mask_token_id)
    torch.testing.assert_close(loaded.loss(batch, target.head)[0], drafter.loss(batch, target.head)[0])


def test_bad_input_names_the_key(tiny_qwen3):
    with pytest.raises(DraftsmithError, match="drafter.block_size must be at least 2"):
        build(dflash.Config, {"block_size": 1}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.num_target_layers=9 but target 'tiny-qwen3' has only 8"):
        dflash.create(dflash.Config(num_target_layers=9), tiny_qwen3)
    with pytest.raises(DraftsmithError, match="drafter.target_layer_ids"):
        dflash.create(dflash.Config(target_layer_ids=[1, 8]), tiny_qwen3)
    with pytest.raises(DraftsmithError, match="drafter.mask_token_id=65 is '.', a token the tokenizer uses for real"):
        dflash.create(dflash.Config(mask_token_id=65), tiny_qwen3)
    broken = draft_vocab(size=64)
    broken.t2d[int(broken.t2d.nonzero()[0])] = False
    with pytest.raises(DraftsmithError, match="draft vocabulary is inconsistent"):
        dflash.create(dflash.Config(), tiny_qwen3, draft_vocab=broken)


def test_the_mask_token_is_the_tokenizers_or_an_id_no_text_uses(tiny_qwen3):
    assert dflash.create(dflash.Config(), tiny_qwen3).mask_token_id == 259  # byte tokenizer: 259 ids, 320 rows
    assert dflash.create(dflash.Config(mask_token_id=258), tiny_qwen3).mask_token_id == 258  # a special token
    tiny_qwen3.tokenizer.mask_token = "<|im_start|>"
    assert dflash.create(dflash.Config(), tiny_qwen3).mask_token_id == 257


def train_with_the_loop(tmp_path, **drafter):
    """A tiny target and a block-4 drafter of these options trained 12 steps by the real trainer (validated and
    saved at step 12, into tmp_path/run); returns the target and the training log."""
    from test_train import memory_data, read_log, recipe_dict, write_recipe

    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe

    target = frozen(tiny_target())
    with torch.no_grad():  # a peaked target distribution, so there is something to learn beyond its entropy
        target.model.lm_head.weight.mul_(30)
    config_dict = recipe_dict({"target": "unused", "prepared": None}, max_steps=12, lr=3e-3, eval_every=12,
                              checkpoint_every=12)
    config_dict["drafter"] = {"kind": "dflash", "block_size": 4, "anchors_per_sequence": 4, **drafter}
    config_dict["data"] = {"features": "in-memory", "batch_size": 2, "max_length": 48}
    config_dict["output_dir"] = str(tmp_path / "run")
    config = load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict))
    layers = dflash.create(dflash.Config(block_size=4), target).required_layers
    recipe = TrainRecipe(config, data=memory_data(target, layers, n_train=2), target=target)
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    return target, read_log(tmp_path / "run")


def test_the_training_loop_trains_a_dflash_drafter_and_decodes_it(tmp_path):
    from test_train import read_log

    target, log = train_with_the_loop(tmp_path)
    assert log[-1]["loss"] < 0.6 * log[0]["loss"]
    assert {"acc_0", "acc_1", "acc_2"} <= set(log[0])
    assert read_log(tmp_path / "run", "eval")[-1]["acceptance_length"] >= 1.0  # a real decode of the drafter
    assert dflash.load_proposer(tmp_path / "run" / "best", target).drafter.config.block_size == 4


def test_flex_attention_block_masks_give_the_sdpa_loss(tiny_qwen3):
    """Forward only: torch has no flex_attention backward on a CPU (tests/test_cuda.py compares gradients)."""
    target = frozen(tiny_qwen3)
    sdpa = make(target, block_size=4, num_layers=2, attention="sdpa")
    flex = make(target, block_size=4, num_layers=2, attention="flex")
    flex.load_state_dict(sdpa.state_dict())
    batch = batch_for(target, sdpa, length=40)
    anchors = torch.tensor([[4, 9, 17, 30], [6, 12, 25, -1]])
    with torch.no_grad():
        torch.testing.assert_close(flex(batch, target.head, anchors=anchors)[0],
                                   sdpa(batch, target.head, anchors=anchors)[0], rtol=1e-5, atol=1e-5)
        block = torch.full((2, 16), flex.mask_token_id)
        positions = torch.arange(16)[None].expand(2, -1)
        context = flex.context_kv(batch["features"], 0, 40)
        masks = [flex_block_mask(a.clamp(min=0), 40, 4) for a in (anchors, anchors + 1)]
        right, shifted = (flex.blocks(block, positions, context, m) for m in masks)  # context one too far: differs
        torch.testing.assert_close(right, flex.blocks(block, positions, context, block_attention_mask(
            anchors.clamp(min=0), 40, 4)), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(right, shifted, atol=1e-4)
    assert make(target, attention="auto").attention_rule(torch.device("cpu")) == "blockwise"
    with pytest.raises(DraftsmithError, match="no flex_attention backward on a CPU"):
        flex(batch, target.head, anchors=anchors)
    with pytest.raises(DraftsmithError, match="drafter.attention must be auto, sdpa, flex or blockwise"):
        build(dflash.Config, {"attention": "xformers"}, prefix="drafter.")


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_block_trees_grow_from_the_positions_top_k_and_decode_like_the_plain_loop(tiny_qwen3, variant):
    target = frozen(tiny_qwen3)
    drafter = make(target, block_size=6, variant=variant, markov_rank=8)
    tokens = torch.tensor([[257, 5, 6, 7, 8, 9]])
    features = target.forward(tokens[:, :-1], layers=drafter.required_layers, logits=False).features
    proposer = drafter.proposer(target)
    state = DecodeState(tokens, features)
    draft = proposer.propose(state, DraftShape(tree=(3, 2, 6)), Sampling())
    assert len(draft) == 6 and draft.parents is not None and int(draft.parents[0]) == -1
    logits = proposer.block_logits(state)
    prev = torch.tensor(9)
    if variant == "dspark":
        logits[0] += drafter.markov_w2.weight @ drafter.markov_w1.weight[prev]
    roots = draft.tokens[draft.parents == -1].tolist()
    assert sorted(roots) == sorted(logits[0].topk(2).indices.tolist())  # depth 1: position 1's top 2
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 30, eos=set()).tokens
    spec = speculative_generate(target, drafter.proposer(target), prompt, DraftShape(tree=(4, 3, 10)), Sampling(), 30,
                                eos=set())
    assert spec.tokens == plain


# --------------------------------------------------------------------------- a draft vocabulary
@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_a_draft_vocabulary_head_starts_as_the_targets_rows_drafts_only_its_tokens_and_decodes_losslessly(
        tiny_qwen3, tmp_path, variant):
    target = frozen(tiny_qwen3)
    vocab = draft_vocab(size=64)
    ids = vocab.t2d.nonzero().flatten()
    fresh = dflash.create(dflash.Config(block_size=6, variant=variant, markov_rank=8), target, draft_vocab=vocab)
    hidden = torch.randn(3, target.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # at the start: the target's own logits at those tokens
        torch.testing.assert_close(fresh.logits(hidden), target.model.lm_head(hidden)[:, ids])
    drafter = make(target, vocab=vocab, block_size=6, variant=variant, markov_rank=8)
    drafter.save_pretrained(tmp_path / "d")
    loaded = dflash.Drafter.from_pretrained(tmp_path / "d", target)
    assert loaded.sizes["draft_vocab_size"] == 64 and torch.equal(loaded.draft_ids, ids)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in drafter.state_dict().items())
    assert loaded.proposer(target).describe()["draft_vocab_size"] == 64

    tokens = torch.tensor([[257, 5, 6, 7, 8, 9]])
    features = target.forward(tokens[:, :-1], layers=drafter.required_layers, logits=False).features
    state = DecodeState(tokens, features)
    proposer = loaded.proposer(target, torch.Generator().manual_seed(0))
    proposer.confidence_cut = False  # DSpark: whole blocks here
    chain = proposer.propose(state, DraftShape(length=5), Sampling())
    tree = proposer.propose(state, DraftShape(tree=(3, 2, 6)), Sampling())
    sampled = proposer.propose(state, DraftShape(length=5), Sampling(temperature=0.8))
    for draft in (chain, tree, sampled):
        assert len(draft) > 0 and bool(vocab.t2d[draft.tokens].all())  # only draft-vocabulary tokens
    with torch.no_grad():
        first = proposer.block_logits(state)[0]
        if variant == "dspark":
            first = first + drafter.markov_w2.weight @ drafter.markov_w1.weight[9]
    assert int(chain.tokens[0]) == int(ids[first.argmax()])
    assert sorted(tree.tokens[tree.parents == -1].tolist()) == sorted(ids[first.topk(2).indices].tolist())
    assert sampled.probs.shape == (len(sampled), target.vocab_size)
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(len(sampled)))
    assert float(sampled.probs[:, ~vocab.t2d].abs().max()) == 0.0
    assert bool((sampled.probs[torch.arange(len(sampled)), sampled.tokens] > 0).all())

    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 30, eos=set()).tokens
    for shape in (DraftShape(length=5), DraftShape(tree=(4, 3, 10))):
        assert speculative_generate(target, loaded.proposer(target), prompt, shape, Sampling(), 30,
                                    eos=set()).tokens == plain
