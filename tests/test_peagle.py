"""P-EAGLE (the eagle kind's `peagle` variant): steps after the first read a mask token and a learned mask hidden,
so training's steps equal the rows of the one forward that drafts at decode time; decoding is lossless."""

import pytest
import torch

from draftsmith.drafters import DraftShape, Sampling
from draftsmith.drafters import eagle
from draftsmith.drafters.base import cache_length
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate
from test_eagle import frozen, make_batch
from test_eagle_decode import state_for, train_on_own_output

STEPS = 4


def peagle(target, **options):
    torch.manual_seed(1)
    drafter = eagle.create(eagle.Config(variant="peagle", ttt_steps=STEPS, **options), target).eval()
    with torch.no_grad():  # norms unlike their initialisation, so every piece matters
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return drafter


@pytest.mark.parametrize("arch,options", [("llama", {}), ("qwen3", {}), ("llama", {"fc_norm": True, "norm_output": True}),
                                          ("llama", {"num_layers": 2})])
def test_training_steps_equal_the_rows_of_the_one_decode_forward(arch, options):
    """Step j at index t in training == row j of the decode-time forward over the committed tokens x_0..x_{t+1} and
    j mask rows; and a proposer that caught up before gives the same rows as a fresh one."""
    from tiny import tiny_target

    target = frozen(tiny_target(arch))
    drafter = peagle(target, **options)
    batch = make_batch(target, drafter, batch=1, length=14)
    ids = batch["input_ids"]
    with torch.no_grad():
        outputs = drafter.ttt_forward(ids, batch["features"])
        cached = drafter.proposer(target)
        for t in (0, 3, 8):
            state = state_for(target, ids[:, : t + 2], drafter.required_layers)
            fresh = drafter.proposer(target)
            _, rows, _ = fresh._catch_up(state, ahead=STEPS - 1)
            _, again, _ = cached._catch_up(state, ahead=STEPS - 1)
            assert cache_length(cached.past) == t + 1  # the mask rows are never cached
            for j in range(STEPS):
                trained = drafter.logits(outputs[j][:, t], target.head)[0].float()
                torch.testing.assert_close(rows[j], trained, atol=2e-5, rtol=1e-4, msg=f"step {j}, index {t}")
                torch.testing.assert_close(again[j], trained, atol=2e-5, rtol=1e-4)
        # the later steps read the mask inputs, not the next token: changing x_{t+2..} leaves them unchanged
        other = ids.clone()
        other[:, 6:] = (other[:, 6:] + 1) % target.vocab_size
        changed = drafter.ttt_forward(other, batch["features"])
        torch.testing.assert_close(changed[2][:, 3], outputs[2][:, 3])
        assert not torch.allclose(outputs[0][:, 3], outputs[1][:, 3], atol=1e-3)


@torch.no_grad()
def test_a_chain_is_one_drafter_forward(tiny_llama, monkeypatch):
    target = frozen(tiny_llama)
    drafter = peagle(target)
    proposer = drafter.proposer(target)
    calls = []
    step = drafter.step
    monkeypatch.setattr(drafter, "step", lambda *a, **k: calls.append(a[0].shape[1]) or step(*a, **k))
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(2))
    draft = proposer.propose(state_for(target, tokens, proposer.required_layers), DraftShape(STEPS), Sampling())
    assert len(draft.tokens) == STEPS and calls == [11 + STEPS - 1]  # the prompt's 11 indices and 3 mask rows
    calls.clear()
    longer = torch.cat([tokens, torch.tensor([[5, 6]])], 1)
    proposer.propose(state_for(target, longer, proposer.required_layers), DraftShape(9), Sampling())
    assert calls == [2 + STEPS - 1]  # two new committed indices; the chain stops at the steps it was trained for


def one_forward(tiny_llama, seed: int):
    """(target, drafter, a proposer, a state of 11 random tokens, the rows of a fresh proposer's one forward there)."""
    target = frozen(tiny_llama)
    drafter = peagle(target)
    proposer = drafter.proposer(target)
    state = state_for(target, torch.randint(0, 320, (1, 11), generator=torch.Generator().manual_seed(seed)),
                      proposer.required_layers)
    _, rows, _ = drafter.proposer(target)._catch_up(state, ahead=STEPS - 1)
    return target, drafter, proposer, state, rows


@torch.no_grad()
def test_a_greedy_chain_is_each_positions_argmax_and_a_new_request_rereads_the_mask_inputs(tiny_llama):
    """The greedy chain (every position's argmax in one op) equals the argmax of each row of the forward; the mask
    row is fused once per request, so a drafter changed between requests drafts from its new mask hidden."""
    target, drafter, proposer, state, rows = one_forward(tiny_llama, seed=5)
    chain = proposer.propose(state, DraftShape(STEPS), Sampling())
    assert chain.tokens.tolist() == drafter.draft_ids[rows.argmax(-1)].tolist()
    drafter.mask_hidden.mul_(-3)  # e.g. a training step between two validations
    proposer.reset()
    _, fresh_rows, _ = drafter.proposer(target)._catch_up(state, ahead=STEPS - 1)
    _, rows_after_reset, _ = proposer._catch_up(state, ahead=STEPS - 1)
    torch.testing.assert_close(rows_after_reset, fresh_rows)
    assert not torch.allclose(fresh_rows[1:], rows[1:], atol=1e-3)  # the change reached the mask rows


@torch.no_grad()
def test_tree_is_built_from_the_per_position_distributions(tiny_llama):
    _, drafter, proposer, state, rows = one_forward(tiny_llama, seed=4)
    log_probs = torch.log_softmax(rows, -1)
    tokens, parents, scores = proposer.tree(state, depth=3, top_k=2, total_tokens=6)
    for i in range(len(tokens)):
        path, node = [], i
        while node >= 0:
            path.insert(0, int(tokens[node]))
            node = int(parents[node])
        want = sum(float(log_probs[d, (drafter.draft_ids == token).nonzero()[0, 0]]) for d, token in enumerate(path))
        assert abs(want - float(scores[i])) < 1e-4
    chain = proposer.propose(state, DraftShape(3), Sampling())
    line = proposer.propose(state, DraftShape(tree=(3, 1, 3)), Sampling())
    assert torch.equal(chain.tokens, line.tokens) and line.parents.tolist() == [-1, 0, 1]


def test_speculative_decoding_is_lossless_and_accepted(tiny_llama):
    target = frozen(tiny_llama)
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(30)
    prompt = torch.randint(0, 320, (1, 10), generator=torch.Generator().manual_seed(1))
    plain = plain_generate(target, prompt, Sampling(), 30, eos=set()).tokens
    torch.manual_seed(0)
    drafter = eagle.create(eagle.Config(variant="peagle", ttt_steps=3), target)
    drafter = train_on_own_output(target, drafter, prompt, plain, steps=40)
    assert drafter.mask_hidden.grad is not None and drafter.mask_hidden.grad.abs().sum() > 0
    for shape in (DraftShape(3), DraftShape(tree=(3, 3, 8))):
        result = speculative_generate(target, drafter.proposer(target), prompt, shape, Sampling(), 30, eos=set())
        assert result.tokens == plain
        tau = sum(c.emitted for c in result.cycles) / len(result.cycles)
        assert tau > 1.8, f"acceptance length {tau:.2f} with {shape}"
    sampling = Sampling(temperature=0.7, top_k=50)
    proposer = drafter.proposer(target, generator=torch.Generator().manual_seed(0))
    draft = proposer.propose(state_for(target, prompt, proposer.required_layers), DraftShape(3), sampling)
    assert draft.probs.shape == (3, 320) and (draft.probs[torch.arange(3), draft.tokens] > 0).all()
    result = speculative_generate(target, proposer, prompt, DraftShape(3), sampling, 20, eos=set(),
                                  generator=torch.Generator().manual_seed(0))
    assert len(result.tokens) == 20


def test_save_load_and_the_mask_token(tiny_llama, tmp_path):
    target = frozen(tiny_llama)
    drafter = peagle(target)
    tokenizer = target.tokenizer
    expected = next(t for t in (tokenizer.mask_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None)
    assert drafter.config.mask_token_id == expected
    assert eagle.create(eagle.Config(variant="peagle", mask_token_id=7), target).config.mask_token_id == 7
    drafter.save_pretrained(tmp_path / "d")
    loaded = eagle.Drafter.from_pretrained(tmp_path / "d", target)
    assert loaded.parallel and loaded.config.mask_token_id == expected
    assert torch.equal(loaded.mask_hidden, drafter.mask_hidden)
    batch = make_batch(target, drafter, batch=1, length=10)
    with torch.no_grad():
        torch.testing.assert_close(loaded.ttt_forward(batch["input_ids"], batch["features"])[2],
                                   drafter.ttt_forward(batch["input_ids"], batch["features"])[2])
    with pytest.raises(DraftsmithError, match="mask_token_id is an option of the peagle variant"):
        eagle.create(eagle.Config(mask_token_id=3), target)
