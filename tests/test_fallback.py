"""Trained chain drafters fall back towards plain decoding within a request where their acceptance does not pay
(`draftsmith.drafters.fallback`): the length rule, probes, greedy equality on a real decode, and the eval flag."""

from __future__ import annotations

import json
import time

import pytest
import torch
from tiny import save_target, tiny_target

from draftsmith.cli import main
from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling, eagle
from draftsmith.drafters.fallback import FIRST_PROBE, LAST_PROBE, RunningAcceptance
from draftsmith.eval.decoder import plain_generate, speculative_generate

COST = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.7, 5: 1.9}  # t(n)/t(1) of a CPU-like target: a wider pass costs more


class Scripted(Proposer):
    """A chain proposer that drafts `token` repeated; its first call of a request takes `first_call_s` (a drafter
    reading the prompt in)."""

    required_layers: list = []

    def __init__(self, token: int, first_call_s: float = 0.0):
        self.token, self.first_call_s, self.asked = token, first_call_s, []

    def reset(self):
        self.asked = []

    def propose(self, state, shape, sampling):
        if not self.asked:
            time.sleep(self.first_call_s)
        self.asked.append(shape.length)
        return Draft(torch.full((shape.length,), self.token))

    def describe(self):
        return {"kind": "scripted"}


def drive(proposer: RunningAcceptance, next_token, passes: int) -> list[int]:
    """Run the proposer through `passes` verify passes as the decoder would, committing what a target whose next
    token is `next_token(position)` accepts; returns each pass's draft length."""
    tokens, lengths = [0], []
    proposer.reset()
    for _ in range(passes):
        draft = proposer.propose(DecodeState(torch.tensor([tokens])), DraftShape(4), Sampling()).tokens.tolist()
        lengths.append(len(draft))
        for token in draft:  # accept while the draft is the target's token, then its own token
            if token != next_token(len(tokens)):
                break
            tokens.append(token)
        tokens.append(next_token(len(tokens)))
    return lengths


def test_a_drafter_the_target_always_rejects_falls_back_to_plain_steps_with_spaced_out_probes():
    lengths = drive(RunningAcceptance(Scripted(7), 4, COST), lambda position: 3, passes=120)
    assert lengths[0] == 3  # the optimistic start drafts (4 does not pay for t(5) even at its prior)
    assert lengths[:4] == [3, 1, 1, 0]  # shorter drafts, then none
    probes = [i for i, n in enumerate(lengths) if n and i > lengths.index(0)]
    assert all(lengths[i] == 1 for i in probes)  # a probe drafts one token
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [2 * FIRST_PROBE + 1, 4 * FIRST_PROBE + 1, LAST_PROBE + 1] and set(gaps[3:]) == {LAST_PROBE + 1}
    assert sum(n > 0 for n in lengths) < 12  # of 120 passes


class Timed(Scripted):
    """Scripted, with each drafted token taking `per_token_s` (a real drafter's forward)."""

    def __init__(self, token: int, per_token_s: float):
        super().__init__(token)
        self.per_token_s = per_token_s

    def propose(self, state, shape, sampling):
        time.sleep(self.per_token_s * shape.length)
        return super().propose(state, shape, sampling)


def test_where_a_wider_pass_costs_no_more_the_drafted_tokens_cost_still_makes_a_rejected_drafter_stop():
    # A CPU's measured curve: t(2) within 4% of t(1); each drafted token takes a tenth of t(1) = 10 ms. Drafting
    # one token that is never accepted costs 1.14 t(1) a token, so the request must go plain, not draft forever
    # against the optimistic prior (which once kept a_1 >= 1.5 / 7 and the request at length 1, 0.88x plain).
    seconds = {1: 0.010, 2: 0.0104, 3: 0.013}
    lengths = drive(RunningAcceptance(Timed(7, 0.001), 2, seconds), lambda position: 3, passes=60)
    assert 0 in lengths[:8] and sum(n > 0 for n in lengths) <= 10
    assert drive(RunningAcceptance(Timed(3, 0.001), 2, seconds), lambda position: 3, passes=20) == [2] * 20


def test_a_drafter_the_target_always_accepts_keeps_the_full_length():
    assert drive(RunningAcceptance(Scripted(3), 4, COST), lambda position: 3, passes=30) == [3] + [4] * 29


def test_a_request_that_turns_predictable_gets_its_drafter_back():
    # rejected for the first 40 positions, then the text is what the drafter drafts
    lengths = drive(RunningAcceptance(Scripted(3), 4, COST), lambda position: 5 if position < 40 else 3, passes=85)
    assert 0 in lengths[:30] and lengths[-5:] == [4] * 5  # a probe was accepted, and the lengths grew back


def test_each_request_starts_afresh():
    proposer = RunningAcceptance(Scripted(7), 4, COST)
    drive(proposer, lambda position: 3, passes=20)
    assert drive(proposer, lambda position: 7, passes=3) == [3, 4, 4]


def test_reading_a_long_prompt_in_is_not_charged_as_draft_time_per_token():
    seconds = {n: 0.01 * cost for n, cost in COST.items()}  # t(1) = 10 ms; the first call takes 50 ms
    lengths = drive(RunningAcceptance(Scripted(3, first_call_s=0.05), 4, seconds), lambda position: 3, passes=6)
    assert lengths == [3, 4, 4, 4, 4, 4]  # charged at 50 ms / 3 tokens, drafting would not pay for t(1) = 10 ms


def test_without_a_cost_curve_it_drafts_the_full_length():
    assert drive(RunningAcceptance(Scripted(7), 4), lambda position: 3, passes=5) == [4] * 5


def test_greedy_output_is_plain_decodings_and_weak_requests_draft_less(tiny_llama):
    drafter = eagle.create(eagle.Config(), tiny_llama)  # untrained: mostly rejected on this target
    plain_proposer = drafter.proposer(tiny_llama)
    wrapped = RunningAcceptance(drafter.proposer(tiny_llama), 3, {n: 1.0 + 0.4 * (n - 1) for n in range(1, 5)})
    prompts = [torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[40, 41, 42, 43]])]
    for prompt in prompts:
        plain = plain_generate(tiny_llama, prompt, Sampling(), 24, set()).tokens
        full = speculative_generate(tiny_llama, plain_proposer, prompt, DraftShape(3), Sampling(), 24, set())
        adaptive = speculative_generate(tiny_llama, wrapped, prompt, DraftShape(3), Sampling(), 24, set())
        assert adaptive.tokens == full.tokens == plain
        drafted = [c.drafted for c in adaptive.cycles]
        assert sum(drafted) < sum(c.drafted for c in full.cycles) and 0 in drafted


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fallback")
    target = tiny_target("llama")
    name = save_target(target, root / "target")
    eagle.create(eagle.Config(), target).save_pretrained(root / "eagle")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("count to ten", "hi")))
    return name, root


def test_eval_falls_back_by_default_for_eagle_chains_and_not_when_told(folders, tmp_path):
    name, root = folders
    args = ["eval", "--target", name, "--drafter", str(root / "eagle"), "--prompts", str(root / "prompts.jsonl"),
            "--num-prompts", "2", "--max-new-tokens", "12", "--no-transformers-baseline", "--no-small-batch-linear"]
    for flags, expected in (([], True), (["--fallback", "false"], False)):
        out = tmp_path / f"eval-{expected}"
        assert main([*args, *flags, "--out", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        assert ("fallback" in results["drafter"]) == expected and results["lossless"]["identical"] == 2


@pytest.mark.parametrize("flags", [["--drafter", "prompt-lookup"], ["--tree", "2,2,4"]], ids=["lookup", "tree"])
def test_fallback_is_refused_where_lengths_are_not_the_drafters_to_choose(folders, tmp_path, flags, capsys):
    name, root = folders
    drafter = [] if "--drafter" in flags else ["--drafter", str(root / "eagle")]
    assert main(["eval", "--target", name, *drafter, *flags, "--fallback", "true", "--prompts", str(root / "prompts.jsonl"),
                 "--out", str(tmp_path / "e")]) == 2
    assert "--fallback is for trained drafters drafting chains" in capsys.readouterr().err
