"""Confidence cuts of EAGLE and MTP chains: each step's own top probability under the verify-cost curve decides
whether it is drafted (the same StoppingRule as DSpark's and Medusa's), greedy decoding stays the plain loop's,
and `draftsmith eval --confidence-cut` measures the curve as far as the chain reaches."""

import pytest
import torch

from draftsmith import cost
from draftsmith.drafters import DecodeState, DraftShape, Sampling, eagle, mtp
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate
from tiny import tiny_target

PROMPT = torch.tensor([[257, 5, 6, 7, 8, 9]])


def frozen(target):
    target.model.requires_grad_(False)
    return target


def drafter_for(kind: str, target):
    """A random drafter of `kind` whose weights are moved off their initialisation (varied confidences)."""
    torch.manual_seed(0)
    if kind == "eagle":
        drafter = eagle.create(eagle.Config(ttt_steps=2), target)
    else:
        drafter = mtp.create(mtp.Config(num_modules=4, shared=kind == "mtp-shared"), target)
    with torch.no_grad():
        for parameter in drafter.parameters():
            if parameter.dtype.is_floating_point:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)) * 0.2)
    return drafter


def state_of(target, proposer, tokens):
    features = target.forward(tokens[:, :-1], layers=proposer.required_layers, logits=False).features
    return DecodeState(tokens, features)


@pytest.mark.parametrize("kind", ["eagle", "mtp", "mtp-shared"])
def test_the_cut_stops_where_the_rule_replayed_on_each_steps_own_distribution_stops(tiny_llama, kind):
    target = frozen(tiny_llama)
    proposer = drafter_for(kind, target).proposer(target)
    state = state_of(target, proposer, PROMPT)
    seen = []  # the logits each uncut step drew its token from
    choose = proposer._choose
    proposer._choose = lambda logits, sampling: (seen.append(logits.float().clone()), choose(logits, sampling))[1]
    full = proposer.propose(state, DraftShape(4), Sampling()).tokens.tolist()
    proposer._choose = choose
    assert len(full) == 4 and len(seen) == 4
    confidences = [float(torch.softmax(logits, -1).max()) for logits in seen]
    proposer.confidence_cut = True
    lengths = set()
    for curve in ({n: 1.0 for n in range(1, 6)}, {1: 1.0, 2: 1.02, 3: 1.1, 4: 1.5, 5: 1.6},
                  {1: 1.0, 2: 1.3, 3: 1.35, 4: 1.4, 5: 1.45}, {n: float(n) for n in range(1, 6)}):
        proposer.reset()
        proposer.verify_cost = curve
        rule, expected = cost.StoppingRule(curve, 4), 0
        while expected < 4 and rule.keep(confidences[expected]):
            expected += 1
        draft = proposer.propose(state, DraftShape(4), Sampling()).tokens.tolist()
        assert draft == full[:expected]
        lengths.add(expected)
    assert {0, 4} <= lengths  # free verification drafts every step, a full pass per token none
    assert proposer.describe()["confidence_cut"] is True


@pytest.mark.parametrize("kind,arch", [("eagle", "llama"), ("mtp", "qwen3"), ("mtp-shared", "llama")])
def test_greedy_decoding_with_the_cut_is_token_identical_to_the_plain_loop(kind, arch):
    target = frozen(tiny_target(arch))
    proposer = drafter_for(kind, target).proposer(target)
    proposer.confidence_cut = True
    proposer.verify_cost = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.6, 5: 1.65}  # two drafts are free, a third is dear
    plain = plain_generate(target, PROMPT, Sampling(), 32, eos=set()).tokens
    result = speculative_generate(target, proposer, PROMPT, DraftShape(4), Sampling(), 32, eos=set())
    assert result.tokens == plain
    assert 0 < max(cycle.drafted for cycle in result.cycles) < 4  # it drafted, and the cut shortened the chains


def test_a_cut_chain_longer_than_the_measured_curve_is_refused(tiny_llama):
    target = frozen(tiny_llama)
    proposer = drafter_for("eagle", target).proposer(target)
    proposer.confidence_cut, proposer.verify_cost = True, {1: 1.0, 2: 1.1, 3: 1.2}
    with pytest.raises(DraftsmithError, match="verify cost of 1..5 tokens; it was measured for up to 3"):
        proposer.propose(state_of(target, proposer, PROMPT), DraftShape(4), Sampling())


def test_eval_measures_the_curve_as_far_as_the_asked_chain_reaches(tiny_llama, tmp_path):
    from draftsmith.eval.runner import load_drafter

    target = frozen(tiny_llama)
    drafter_for("eagle", target).save_pretrained(tmp_path / "eagle")
    assert not load_drafter(str(tmp_path / "eagle"), target).confidence_cut  # off unless asked
    proposer = load_drafter(str(tmp_path / "eagle"), target, confidence_cut=True, draft_length=10)
    assert proposer.confidence_cut and set(proposer.verify_cost) == set(range(1, 12))
    proposer = load_drafter(str(tmp_path / "eagle"), target, confidence_cut=True)
    assert set(proposer.verify_cost) == set(range(1, proposer.longest_draft + 2))
