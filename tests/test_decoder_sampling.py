"""Sampling is lossless: emitted tokens follow the target's distribution (chi-square, fixed seeds),
and deliberately broken acceptance rules fail the same tests."""

import pytest
import torch
from scipy.stats import chisquare
from test_export_support import draft_vocab
from tiny import tiny_target

from draftsmith.drafters import Draft, DraftShape, Sampling, kind_module
from draftsmith.drafters.draft_lm import DraftLM
from draftsmith.drafters.fallback import RunningAcceptance
from draftsmith.eval import decoder, verify
from draftsmith.eval.verify import verify_chain, verify_tree
from draftsmith.sampling import target_probs

V = 6


SAMPLINGS = [Sampling(1.0), Sampling(1.2, top_k=5, top_p=0.9)]


def chi2_pvalue(samples: list[int], expected: torch.Tensor) -> float:
    """One-sample chi-square; cells with an expected count below 5 are pooled."""
    assert len(samples) >= 500, "too few samples for the test to mean anything"
    observed = torch.bincount(torch.tensor(samples, dtype=torch.long), minlength=expected.numel()).double()
    expected = expected.double() / expected.double().sum() * len(samples)
    small = expected < 5
    if small.any():
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a token with zero probability was emitted"
    return float(chisquare(observed[keep], expected[keep]).pvalue)


def broken_chain(logits, draft, sampling, generator):
    """The classic bug: after a rejection, sample from p instead of norm(max(0, p - q))."""
    accepted, emitted = verify_chain(logits, draft, sampling, generator)
    if accepted < len(draft):
        p = target_probs(logits[accepted], sampling)
        emitted = torch.cat([emitted[:-1], torch.multinomial(p, 1, generator=generator)])
    return accepted, emitted


def run_chain(rule, sampling, with_q: bool, trials=8000, seed=0):
    """Emitted token 0 and (when present) token 1 over many verify passes of a fixed p and q."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, V, generator=generator) * 1.5
    q = target_probs(torch.randn(2, V, generator=generator) * 1.5, sampling)
    first, second = [], []
    for _ in range(trials):
        tokens = torch.multinomial(q, 1, generator=generator)[:, 0] if with_q else torch.tensor([2, 3])
        _, emitted = rule(logits, Draft(tokens, probs=q if with_q else None), sampling, generator)
        first.append(int(emitted[0]))
        if len(emitted) > 1:
            second.append(int(emitted[1]))
    p = target_probs(logits, sampling)
    # A context-free target: token 0 ~ p_0 and token 1 ~ p_1, whatever the draft did.
    return chi2_pvalue(first, p[0]), chi2_pvalue(second, p[1])


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T1", "T1.2-topk-topp"])
@pytest.mark.parametrize("with_q", [True, False], ids=["sampled-draft", "deterministic-draft"])
def test_chain_rule_is_lossless(sampling, with_q):
    assert min(run_chain(verify_chain, sampling, with_q)) > 1e-3


@pytest.mark.parametrize("with_q", [True, False], ids=["sampled-draft", "deterministic-draft"])
def test_broken_chain_rule_fails(with_q):
    assert run_chain(broken_chain, SAMPLINGS[0], with_q)[0] < 1e-6


def run_tree(trials=8000, seed=1, sampling=Sampling(1.0)):
    """Token 0 ~ p(root) and, when the walk took child 0, token 1 ~ p(child 0)."""
    generator = torch.Generator().manual_seed(seed)
    tokens, parents = torch.tensor([1, 4, 0, 2, 5, 4]), torch.tensor([-1, -1, -1, 0, 1, 1])
    logits = torch.randn(7, V, generator=generator) * 1.5
    draft = Draft(tokens, parents)
    first, after_child0 = [], []
    for _ in range(trials):
        path, emitted, _ = verify_tree(logits, draft, sampling, generator)
        first.append(int(emitted[0]))
        if len(path) > 1 and path[1] == 1:
            after_child0.append(int(emitted[1]))
    p = target_probs(logits, sampling)
    return chi2_pvalue(first, p[0]), chi2_pvalue(after_child0, p[1])


def test_tree_rule_with_sibling_retries_is_lossless():
    assert min(run_tree()) > 1e-3
    assert min(run_tree(sampling=SAMPLINGS[1], seed=2)) > 1e-3


def test_broken_tree_rule_fails(monkeypatch):
    def no_renormalisation(p, child_tokens, generator):  # bug: forgets the rejected siblings' mass
        u = torch.rand(child_tokens.numel(), generator=generator)
        return (u < p[child_tokens]).nonzero().flatten()[:1]

    monkeypatch.setattr(verify, "_try_siblings", no_renormalisation)
    assert run_tree()[0] < 1e-6


# --------------------------------------------------------------------------- end to end
def small_vocab_target(seed, num_layers=2):
    target = tiny_target("llama", seed=seed, vocab_size=8, num_layers=num_layers, pad_token_id=0, eos_token_id=None,
                         bos_token_id=None)
    target.model.lm_head.weight.data.mul_(10)  # p and q overlap partly: where a wrong rule shows most
    return target


def exact_marginals(target, prompt, sampling):
    """P(token 1) and P(token 2) of plain sampling, by enumerating every earlier token (8 + 64 runs)."""
    p0 = target_probs(target.forward(prompt).logits[0, -1], sampling)
    grid = torch.tensor([[a, b] for a in range(8) for b in range(8)])
    logits = target.forward(torch.cat([prompt.expand(64, -1), grid], 1)).logits
    p1_given = target_probs(logits[::8, -2], sampling)  # [a] -> P(token 1 | a)
    p2_given = target_probs(logits[:, -1], sampling)  # [a*8+b] -> P(token 2 | a, b)
    joint01 = p0[:, None] * p1_given  # [a, b]
    return joint01.sum(0), (joint01.reshape(64, 1) * p2_given).sum(0)


@pytest.mark.parametrize("broken", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["correct", "broken"])
def test_speculative_sampling_matches_plain_end_to_end(monkeypatch, broken):
    target, drafter_model = small_vocab_target(0), small_vocab_target(5)
    prompt = torch.tensor([[1, 2, 3, 4]])
    sampling = Sampling(1.0)
    p1, p2 = exact_marginals(target, prompt, sampling)
    if broken:
        monkeypatch.setattr(decoder, "verify_chain", broken_chain)
    torch.manual_seed(0)  # the draft model samples from the global generator
    drafter = DraftLM(drafter_model, 8)
    generator = torch.Generator().manual_seed(0)
    runs = [decoder.speculative_generate(target, drafter, prompt, DraftShape(2), sampling, 3, set(), generator).tokens
            for _ in range(800)]
    pvalues = chi2_pvalue([r[1] for r in runs], p1), chi2_pvalue([r[2] for r in runs], p2)
    if broken:
        assert min(pvalues) < 1e-4
    else:
        assert min(pvalues) > 1e-3
        plain = [decoder.plain_generate(target, prompt, sampling, 3, set(), generator).tokens for _ in range(600)]
        assert chi2_pvalue([r[2] for r in plain], p2) > 1e-3  # the enumeration itself is right


# Every trained kind drafts through its own sampling code (chains with their q); the decoder must stay lossless.
DFLASH = {"block_size": 3, "target_layer_ids": [0, 2], "mask_token_id": 7}
KIND_OPTIONS = {"eagle": ("eagle", {"layers": [0, 1, 2]}), "medusa": ("medusa", {"num_heads": 2}),
                "mtp": ("mtp", {"num_modules": 2}), "dflash": ("dflash", DFLASH),
                "dspark": ("dflash", {**DFLASH, "variant": "dspark", "markov_rank": 4}),
                "dflash-draft-vocab": ("dflash", DFLASH), "eagle-cut": ("eagle", {"layers": [0, 1, 2]}),
                "mtp-cut": ("mtp", {"num_modules": 2, "shared": True}), "medusa-cut": ("medusa", {"num_heads": 2}),
                "dflash-cut": ("dflash", DFLASH),
                "eagle-fallback": ("eagle", {"layers": [0, 1, 2]}), "mtp-fallback": ("mtp", {"num_modules": 2}),
                "peagle-fallback": ("eagle", {"layers": [0, 1, 2], "variant": "peagle", "ttt_steps": 2,
                                              "mask_token_id": 7}),
                "medusa-fallback": ("medusa", {"num_heads": 2}), "dflash-fallback": ("dflash", DFLASH),
                "dspark-fallback": ("dflash", {**DFLASH, "variant": "dspark", "markov_rank": 4}),
                "draft_lm-fallback": ("draft_lm", {"num_layers": 1}),
                "eagle-tree-fallback": ("eagle", {"layers": [0, 1, 2]}),
                "dflash-tree-fallback": ("dflash", DFLASH)}
DRAFT_VOCAB_SIZES = {"dflash-draft-vocab": 5}
"""cases whose drafter drafts over a draft vocabulary of that many of the 8 tokens (q is 0 on the other 3)"""
CUT = {"dspark": {1: 1.0, 2: 1.45, 3: 1.6}, "dflash-cut": {1: 1.0, 2: 1.6, 3: 1.8},
       "eagle-cut": {1: 1.0, 2: 1.45, 3: 1.6}, "mtp-cut": {1: 1.0, 2: 1.45, 3: 1.6},
       "medusa-cut": {1: 1.0, 2: 1.7, 3: 2.2}}
"""cases whose chains are cut by their confidences (DSpark and DFlash by default, the others switched on), each with a
cost curve under which its confidences cut some chains after 0, 1 or 2 tokens and leave others whole"""
FALLBACK = {name: {1: 1.0, 2: 1.6, 3: 2.2} for name in KIND_OPTIONS if name.endswith("-fallback")}
FALLBACK.update({name: {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5} for name in FALLBACK if "-tree-" in name})
"""cases whose chain lengths (trees: depths) follow their running acceptance (drafters.fallback), with a cost curve
under which a request starts with one drafted token (a tree of depth 2: 3 nodes) and then drafts 0, 1 or 2 (a tree of
depth 1 or 2) by what was accepted"""
TREE = (2, 2, 3)
"""the (depth, top_k, total_tokens) of the tree cases, verified as trees of one-hot candidates"""


@pytest.mark.parametrize("name", list(KIND_OPTIONS))
def test_every_trained_kind_samples_losslessly_end_to_end(name):
    kind, options = KIND_OPTIONS[name]
    target = small_vocab_target(0, num_layers=4)
    target.tokenizer = None  # 8 token ids and no text: DFlash's MASK is then simply the id it is given
    prompt = torch.tensor([[1, 2, 3, 4]])
    sampling = Sampling(1.0)
    p1, p2 = exact_marginals(target, prompt, sampling)
    module = kind_module(kind)
    vocab = draft_vocab(size=DRAFT_VOCAB_SIZES[name], vocab=8) if name in DRAFT_VOCAB_SIZES else None
    drafter = module.create(module.Config(**options), target, draft_vocab=vocab)
    with torch.no_grad():  # a random drafter whose q differs from p (fresh ones copy parts of the target)
        for parameter in drafter.parameters():
            if parameter.dtype.is_floating_point:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)) * 0.5)
    proposer = drafter.proposer(target, torch.Generator().manual_seed(1))
    if name in CUT:
        proposer.confidence_cut, proposer.verify_cost = True, CUT[name]
    shape = DraftShape(tree=TREE) if "-tree-" in name else DraftShape(2)
    if name in FALLBACK:
        proposer = RunningAcceptance(proposer, 2, FALLBACK[name], tree=shape.tree)
    generator = torch.Generator().manual_seed(0)
    runs = [decoder.speculative_generate(target, proposer, prompt, shape, sampling, 3, set(), generator)
            for _ in range(800)]
    drafted = sum(c.drafted for r in runs for c in r.cycles)
    varies = name in CUT or name in FALLBACK
    assert drafted > (400 if varies else 800), "the drafter must actually draft for the test to mean anything"
    if varies:
        assert len({c.drafted for r in runs for c in r.cycles}) >= 2, "the cut or fallback must vary the length"
    assert min(chi2_pvalue([r.tokens[1] for r in runs], p1), chi2_pvalue([r.tokens[2] for r in runs], p2)) > 1e-3
