"""The EAGLE proposer at decode time: cache roll-back, trees, and the real speculative decoder."""

import pytest
import torch

from draftsmith.drafters import DecodeState, DraftShape, Sampling
from draftsmith.drafters import eagle
from draftsmith.drafters.base import cache_length
from draftsmith.eval.decoder import plain_generate, speculative_generate


def frozen(target):
    for p in target.model.parameters():
        p.requires_grad_(False)
    return target


def state_for(target, tokens, layers):
    features = target.forward(tokens[:, :-1], layers=layers, logits=False).features
    return DecodeState(tokens, features)


def path_score(drafter, target, state, path):
    """Cumulative draft log-prob of `path` (target ids), computed as a plain chain from scratch."""
    tokens = state.tokens
    fused = drafter.fuse(state.features)
    n = tokens.shape[1] - 1
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    hidden, past = drafter.step(tokens[:, 1:], fused, torch.arange(n)[None], None, causal)
    hidden, score = hidden[:, -1:], 0.0
    for i, token in enumerate(path):
        log_probs = torch.log_softmax(drafter.logits(hidden, target.head)[0, 0].float(), -1)
        score += float(log_probs[(drafter.draft_ids == token).nonzero()[0, 0]])
        hidden, past = drafter.step(torch.tensor([[token]]), hidden, torch.tensor([[n + i]]), past)
    return score


@torch.no_grad()
def test_tree_nodes_score_like_chains_along_their_paths(tiny_llama):
    target = frozen(tiny_llama)
    torch.manual_seed(0)
    drafter = eagle.create(eagle.Config(), target)
    proposer = drafter.proposer(target)
    state = state_for(target, torch.randint(0, 320, (1, 11)), proposer.required_layers)
    tokens, parents, scores = proposer.tree(state, depth=4, top_k=3, total_tokens=14)
    assert tokens.numel() == 14 and (parents < torch.arange(14)).all()
    for i in range(14):
        path, node = [], i
        while node >= 0:
            path.insert(0, int(tokens[node]))
            node = int(parents[node])
        assert abs(path_score(drafter, target, state, path) - float(scores[i])) < 1e-4
    # top_k = 1 is a greedy chain.
    chain = proposer.propose(state, DraftShape(4), Sampling())
    line = proposer.propose(state, DraftShape(tree=(4, 1, 4)), Sampling())
    assert torch.equal(chain.tokens, line.tokens) and line.parents.tolist() == [-1, 0, 1, 2]


@torch.no_grad()
def test_cache_rolls_back_like_a_fresh_start(tiny_qwen3):
    """Growing, shrinking and diverging prefixes give the same drafts as a proposer with no cache."""
    target = frozen(tiny_qwen3)
    drafter = eagle.create(eagle.Config(), target)
    cached, fresh = drafter.proposer(target), drafter.proposer(target)
    tokens = torch.randint(0, 320, (1, 30), generator=torch.Generator().manual_seed(3))
    other = tokens.clone()
    other[0, 12:] = (other[0, 12:] + 1) % 320
    for prefix in [tokens[:, :8], tokens[:, :9], tokens[:, :13], tokens[:, :20], other[:, :16], tokens[:, :25]]:
        state = state_for(target, prefix, cached.required_layers)
        fresh.reset()
        for shape in (DraftShape(5), DraftShape(tree=(3, 2, 6))):
            got, want = cached.propose(state, shape, Sampling()), fresh.propose(state, shape, Sampling())
            assert torch.equal(got.tokens, want.tokens)
        assert cache_length(cached.past) == prefix.shape[1] - 1  # only committed positions stay cached


def train_on_own_output(target, drafter, prompt, continuation, steps=25):
    """Overfit the drafter on the target's greedy continuation of `prompt`."""
    tokens = torch.tensor([prompt[0].tolist() + continuation])
    features = target.forward(tokens, layers=drafter.required_layers, logits=False).features
    batch = {"input_ids": tokens, "loss_mask": torch.ones_like(tokens), "attention_mask": torch.ones_like(tokens),
             "features": features}
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=2e-2)
    drafter.train()
    for _ in range(steps):
        loss, _ = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval()


@pytest.mark.parametrize("variant", ["eagle3", "eagle1", "eagle3.1"])
def test_speculative_greedy_equals_plain_greedy(tiny_llama, variant):
    target = frozen(tiny_llama)
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(30)
    torch.manual_seed(0)
    prompt = torch.randint(0, 320, (1, 10), generator=torch.Generator().manual_seed(1))
    plain = plain_generate(target, prompt, Sampling(), 30, eos=set()).tokens
    options = {"fc_norm": True, "norm_output": True} if variant == "eagle3.1" else {"variant": variant}
    drafter = eagle.create(eagle.Config(ttt_steps=3, **options), target)
    drafter = train_on_own_output(target, drafter, prompt, plain)
    for shape in (DraftShape(4), DraftShape(tree=(4, 3, 10))):
        result = speculative_generate(target, drafter.proposer(target), prompt, shape, Sampling(), 30, eos=set())
        assert result.tokens == plain
        tau = sum(c.emitted for c in result.cycles) / len(result.cycles)
        floor = 1.3 if variant == "eagle1" else 2.0  # a trained drafter must actually be accepted
        assert tau > floor, f"acceptance length {tau:.2f} with {shape}"


def test_sampled_chain_is_lossless_shape(tiny_llama):
    """Sampled decoding runs end to end and reports q for every drafted token."""
    target = frozen(tiny_llama)
    drafter = eagle.create(eagle.Config(), target)
    proposer = drafter.proposer(target, generator=torch.Generator().manual_seed(0))
    prompt = torch.randint(0, 320, (1, 8), generator=torch.Generator().manual_seed(2))
    sampling = Sampling(temperature=0.7, top_k=50)
    state = state_for(target, prompt, proposer.required_layers)
    draft = proposer.propose(state, DraftShape(3), sampling)
    assert draft.probs.shape == (3, 320) and (draft.probs[torch.arange(3), draft.tokens] > 0).all()
    assert ((draft.probs > 0).sum(-1) <= 50).all()
    result = speculative_generate(target, proposer, prompt, DraftShape(3), sampling, 20, eos=set(),
                                  generator=torch.Generator().manual_seed(0))
    assert len(result.tokens) == 20


@pytest.mark.parametrize("with_mask", [True, False])
def test_grouped_query_attention_equals_repeated_keys(with_mask):
    """Stacking a key/value head's query heads gives what repeating the keys per head gives."""
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import repeat_kv

    from draftsmith.drafters.eagle_layers import grouped_query_attention

    generator = torch.Generator().manual_seed(0)
    q, keys, values = (torch.randn(shape, generator=generator) for shape in [(1, 6, 4, 8), (1, 2, 11, 8), (1, 2, 11, 8)])
    mask = torch.rand(4, 11, generator=generator) > 0.4 if with_mask else None
    if mask is not None:
        mask[:, 0] = True  # every query sees something
    expected = F.scaled_dot_product_attention(q, repeat_kv(keys, 3), repeat_kv(values, 3), mask)
    torch.testing.assert_close(grouped_query_attention(q, keys, values, mask), expected)


def test_the_causal_prompt_pass_equals_the_masked_pass(tiny_llama):
    """A new request's whole prompt runs through SDPA's causal kernel: same hiddens and cache as an [n, n] mask."""
    target = frozen(tiny_llama)
    drafter = eagle.create(eagle.Config(), target).eval()
    tokens = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(3))
    state = state_for(target, tokens, drafter.config.layers)
    n = tokens.shape[1] - 1
    with torch.no_grad():
        fused, positions = drafter.fuse(state.features), torch.arange(n)[None]
        masked, masked_past = drafter.step(tokens[:, 1:], fused, positions, None, torch.ones(n, n, dtype=torch.bool).tril())
        causal, causal_past = drafter.step(tokens[:, 1:], fused, positions, causal=True)
    torch.testing.assert_close(causal, masked)
    torch.testing.assert_close(causal_past, masked_past)
    with pytest.raises(ValueError, match="causal=True"):
        drafter.step(tokens[:, 1:], fused, positions, None, torch.ones(n, n, dtype=torch.bool).tril(), causal=True)
