"""The speculative loop against plain greedy, with rigged drafters, and tree masks / cache rollback
against a slow reference that re-runs the target from scratch."""

import pytest
import torch
from tiny import tiny_target
from transformers import DynamicCache

from draftsmith.drafters import Draft, DraftShape, Proposer, Sampling
from draftsmith.drafters.draft_lm import DraftLM
from draftsmith.eval.decoder import GrowingFeatures, keep_cache, plain_generate, speculative_generate, tree_forward
from draftsmith.eval.verify import tree_layout

GREEDY = Sampling()
PROMPT = torch.tensor([[257, 10, 20, 30, 40, 10, 20, 30, 50, 60, 70]])


# --------------------------------------------------------------------------- rigged drafters
class Rigged(Proposer):
    """Drafts from a known greedy continuation `reference` (prompt + output), corrupted on demand.

    agree: "always" copies the reference, "never" shifts every token, "sometimes" shifts the
    tokens at positions where a fixed pseudo-random pattern says so. Trees put wrong siblings
    (with children of their own) before the reference child, so the walk must skip them.
    """

    required_layers: list[int] = []

    def __init__(self, reference: list[int], agree: str, vocab: int):
        self.reference, self.agree, self.vocab = reference, agree, vocab

    def reset(self):
        pass

    def describe(self):
        return {"kind": "rigged", "agree": self.agree}

    def token(self, position: int) -> int:
        token = self.reference[position] if position < len(self.reference) else 0
        wrong = self.agree == "never" or (self.agree == "sometimes" and (position * 7919) % 5 < 2)
        return (token + 1) % self.vocab if wrong else token

    def propose(self, state, shape, sampling):
        start = state.tokens.shape[1]
        if shape.tree is None:
            return Draft(torch.tensor([self.token(start + i) for i in range(shape.length)]))
        tokens, parents, last = [], [], -1
        for i in range(shape.tree[0]):
            right = self.token(start + i)
            tokens += [(right + 3) % self.vocab, right, self.token(start + i + 1)]
            parents += [last, last, len(tokens) - 3]  # wrong sibling, the real child, a child of the wrong one
            last = len(tokens) - 2
        return Draft(torch.tensor(tokens), torch.tensor(parents))


class FeatureChecker(Rigged):
    """A rigged drafter that also checks `state.features` against a from-scratch target run."""

    def __init__(self, target, reference, agree, layers):
        super().__init__(reference, agree, target.vocab_size)
        self.target, self.required_layers, self.checks = target, layers, 0

    def propose(self, state, shape, sampling):
        scratch = self.target.forward(state.tokens[:, :-1], layers=self.required_layers, logits=False)
        for layer in self.required_layers:
            assert state.features[layer].shape[1] == state.tokens.shape[1] - 1
            torch.testing.assert_close(state.features[layer], scratch.features[layer], atol=1e-4, rtol=1e-4)
        self.checks += 1
        return super().propose(state, shape, sampling)


def reference(target, new_tokens):
    return PROMPT[0].tolist() + plain_generate(target, PROMPT, GREEDY, new_tokens, eos=set()).tokens


@pytest.fixture(params=["llama", "qwen3"])
def target(request):
    return tiny_target(request.param)


# --------------------------------------------------------------------------- greedy == plain greedy
@pytest.mark.parametrize("shape", [DraftShape(4), DraftShape(1), DraftShape(tree=(3, 2, 9))], ids=["chain4", "chain1", "tree"])
@pytest.mark.parametrize("agree", ["always", "never", "sometimes"])
def test_greedy_speculative_equals_plain(target, shape, agree):
    max_new = 23
    full = reference(target, max_new + 8)
    drafter = Rigged(full, agree, target.vocab_size)
    out = speculative_generate(target, drafter, PROMPT, shape, GREEDY, max_new, eos=set())
    assert out.tokens == full[PROMPT.shape[1]:][:max_new]
    depth = shape.tree[0] if shape.tree else shape.length
    accepted = [c.accepted for c in out.cycles]
    if agree == "always":
        assert accepted[:-1] == [depth] * (len(accepted) - 1)
        assert all(c.emitted == depth + 1 for c in out.cycles[:-1])
    elif agree == "never":
        assert set(accepted) == {0}
    else:
        assert 0 < sum(accepted) < depth * len(accepted)


def test_eos_stops_like_plain(tiny_llama):
    plain = plain_generate(tiny_llama, PROMPT, GREEDY, 30, eos=set())
    eos = {plain.tokens[9]}  # pretend the 10th token ends the reply
    expected = plain_generate(tiny_llama, PROMPT, GREEDY, 30, eos=eos).tokens
    assert expected[-1] in eos and len(expected) <= 10
    drafter = Rigged(PROMPT[0].tolist() + plain.tokens, "always", tiny_llama.vocab_size)
    out = speculative_generate(tiny_llama, drafter, PROMPT, DraftShape(4), GREEDY, 30, eos=eos)
    assert out.tokens == expected


def test_target_as_drafter_accepts_everything(target):
    """The target drafting for itself: every pass accepts the whole chain, τ = k + 1."""
    twin = tiny_target(target.model.config.model_type)
    k, max_new = 5, 27
    out = speculative_generate(target, DraftLM(twin, target.vocab_size), PROMPT, DraftShape(k), GREEDY, max_new, eos=set())
    assert out.tokens == plain_generate(target, PROMPT, GREEDY, max_new, eos=set()).tokens
    assert [c.accepted for c in out.cycles[:-1]] == [k] * (len(out.cycles) - 1)
    # 26 tokens after the prefill's first: four whole passes of k + 1, then max-new-tokens cuts the fifth.
    assert [c.emitted for c in out.cycles] == [k + 1] * 4 + [2]


@pytest.mark.parametrize("shape", [DraftShape(3), DraftShape(tree=(3, 2, 9))], ids=["chain", "tree"])
def test_features_follow_the_committed_tokens(tiny_llama, shape):
    full = reference(tiny_llama, 30)
    drafter = FeatureChecker(tiny_llama, full, "sometimes", layers=[1, 7])
    out = speculative_generate(tiny_llama, drafter, PROMPT, shape, GREEDY, 16, eos=set())
    assert out.tokens == full[PROMPT.shape[1]:][:16] and drafter.checks == len(out.cycles) > 3


# --------------------------------------------------------------------------- tree masks and rollback
def random_tree(n, generator, vocab):
    parents = torch.tensor([-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)])
    return torch.randint(0, vocab, (n,), generator=generator), parents


def test_tree_layout_small():
    sees, depth = tree_layout(torch.tensor([-1, -1, 0, 2, 1]))
    assert depth.tolist() == [0, 1, 1, 2, 3, 2]
    assert sees[4].nonzero().flatten().tolist() == [0, 1, 3, 4]  # node 3 (row 4): root, node 0, node 2, itself
    assert sees[5].nonzero().flatten().tolist() == [0, 2, 5]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tree_verify_and_rollback_match_from_scratch(arch, attention):
    target = tiny_target(arch)
    target.model.set_attn_implementation(attention)
    generator = torch.Generator().manual_seed(3)
    committed = PROMPT
    cache = DynamicCache(config=target.config)
    target.forward(committed[:, :-1], cache=cache)
    past = committed.shape[1] - 1
    tokens, parents = random_tree(12, generator, target.vocab_size)
    inputs = torch.cat([committed[:, -1:], tokens[None]], dim=1)
    out = tree_forward(target, inputs, parents, past, cache, layers=[7])
    sees, _ = tree_layout(parents)
    for node in range(13):  # every node's logits equal a causal run over prefix + its ancestor path
        path = inputs[0, sees[node]]
        scratch = target.forward(torch.cat([committed[0, :-1], path])[None], layers=[7])
        torch.testing.assert_close(out.logits[0, node], scratch.logits[0, -1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.features[7][0, node], scratch.features[7][0, -1], atol=1e-4, rtol=1e-4)
    leaf = int(sees.sum(1).argmax())  # the deepest node; keep its path and continue decoding
    path = sees[leaf].nonzero().flatten()
    keep_cache(cache, past, path)
    assert cache.get_seq_length() == past + path.numel()
    kept = torch.cat([committed[0, :-1], inputs[0, path]])
    scratch_cache = DynamicCache(config=target.config)
    target.forward(kept[None], cache=scratch_cache)
    for ours, theirs in zip(cache.layers, scratch_cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-4, rtol=1e-4)
    follow = torch.tensor([[5, 6]])
    step = target.forward(follow, cache=cache)
    torch.testing.assert_close(step.logits, target.forward(torch.cat([kept[None], follow], 1)).logits[:, -2:],
                               atol=1e-4, rtol=1e-4)


def test_tree_rollback_moves_only_the_path_in_place(tiny_llama):
    """The committed prefix stays in the same storage, untouched; only the accepted path's slots change."""
    cache = DynamicCache(config=tiny_llama.config)
    tiny_llama.forward(PROMPT, cache=cache)
    start, path = 5, torch.tensor([0, 2, 5])
    before = [(layer.keys.data_ptr(), layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    keep_cache(cache, start, path)
    assert cache.get_seq_length() == start + path.numel()
    for layer, (pointer, keys, values) in zip(cache.layers, before):
        assert layer.keys.data_ptr() == pointer  # no new tensor: nothing proportional to the context was copied
        torch.testing.assert_close(layer.keys, torch.cat([keys[..., :start, :], keys[..., start + path, :]], -2))
        torch.testing.assert_close(layer.values, torch.cat([values[..., :start, :], values[..., start + path, :]], -2))


def test_growing_features_append_without_copying_history():
    first = torch.arange(6.0).view(1, 3, 2)
    stored = GrowingFeatures({4: first})
    views = stored.append({4: torch.full((1, 2, 2), -1.0)})  # outgrows the prefill buffer once
    pointer = views[4].data_ptr()
    views = stored.append({4: torch.full((1, 1, 2), -2.0)})  # fits: written in place
    assert views[4].data_ptr() == pointer and views[4].shape == (1, 6, 2)
    torch.testing.assert_close(views[4], torch.cat([first, torch.full((1, 2, 2), -1.0), torch.full((1, 1, 2), -2.0)], 1))


def test_chain_rollback_is_a_crop(tiny_qwen3):
    cache = DynamicCache(config=tiny_qwen3.config)
    tiny_qwen3.forward(PROMPT, cache=cache)
    keep_cache(cache, 4, torch.arange(3))
    scratch = DynamicCache(config=tiny_qwen3.config)
    tiny_qwen3.forward(PROMPT[:, :7], cache=scratch)
    torch.testing.assert_close(cache.layers[0].keys, scratch.layers[0].keys)


def test_bad_tree_is_rejected(tiny_llama):
    class Backwards(Rigged):
        def propose(self, state, shape, sampling):
            return Draft(torch.tensor([1, 2]), torch.tensor([1, -1]))

    from draftsmith.errors import DraftsmithError

    with pytest.raises(DraftsmithError, match="parents"):
        speculative_generate(tiny_llama, Backwards([], "always", 320), PROMPT, DraftShape(tree=(2, 1, 2)), GREEDY, 8)


def test_shared_prefix_counts_the_leading_equal_tokens():
    from draftsmith.drafters import shared_prefix

    tokens = torch.tensor([5, 6, 7, 8, 9])
    assert shared_prefix(tokens[:3], tokens) == 3  # all it saw is still committed
    assert shared_prefix(tokens, tokens[:2]) == 2  # rolled back below what it saw
    assert shared_prefix(torch.tensor([5, 6, 0, 8]), tokens) == 2  # differs at index 2, equal again after
    assert shared_prefix(torch.tensor([1]), tokens) == 0
    assert shared_prefix(torch.zeros(0, dtype=torch.long), tokens) == 0
