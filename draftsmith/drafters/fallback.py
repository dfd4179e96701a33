"""A trained chain drafter that falls back towards plain decoding within a request where it does not pay.

A drafter trained on code may draft well there and badly on chat; a draft that is rejected still costs its drafting
and a wider target pass (t(k+1) > t(1)), so a weak drafter makes decoding slower than no drafter. `RunningAcceptance`
wraps any chain proposer and picks each draft's length from what the target accepted so far in this request:

- per draft position i, the running conditional acceptance a_i = (accepted_i + w_i a_{i-1}) / (reached_i + w_i)
  over this request's drafts (reached: drafts that got to position i with all before it accepted), each count
  decayed by 0.8 per new observation so that it follows the text as it changes (about the last five drafts
  weigh). The prior a_{i-1} is the oldest observation: its weight w_i starts at 2 and decays by 0.8 with the
  others, so a position with little evidence leans on the one before it, and the first on an optimistic
  a_0 = 3/4, as prompt lookup starts (a request begins by drafting), while a drafter the target keeps rejecting
  sees a_i fall towards 0. A prior that kept its weight would floor a_1 at 1.5 / 7 and keep a target whose
  two-token pass costs little more than one (t(2) ≈ t(1) on a CPU) paying t(2) plus a drafted token for
  nothing, pass after pass;
- the cost of a pass that verifies L drafted tokens: the target's measured verify-cost curve t(L + 1) plus L times
  the drafter's measured seconds per drafted token (timed on this request's own drafts after its first, which also
  reads the whole prompt into the drafter: a one-time cost that would make long prompts look dear to draft);
- the length L in 0 .. longest with the most expected tokens, 1 + a_1 + a_1 a_2 + ..., per unit of that cost
  (`cost.best_length`). L = 0 is a plain step: nothing is drafted.

A request that has fallen back to L = 0 still probes with one drafted token after 4 plain steps, then after 8, 16,
up to 32 while probes keep failing (back to 4 once one is accepted), so a request whose text turns predictable
gets its drafter back. Lengths are decided from earlier passes only, never from the target's answer to this one:
greedy output is plain decoding's and sampling stays exact.
"""

from __future__ import annotations

import time

from draftsmith.cost import best_length
from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling
from draftsmith.drafters.base import LearnsFromDrafts, ProbeBackoff

START, PRIOR_WEIGHT, DECAY = 0.75, 2.0, 0.8
FIRST_PROBE, LAST_PROBE = 4, 32


class RunningAcceptance(LearnsFromDrafts, Proposer):
    """`inner`'s chain drafts, each of the length its running acceptance in this request pays for (module doc)."""

    def __init__(self, inner: Proposer, longest: int, verify_cost: dict[int, float] | None = None):
        self.inner, self.longest_draft, self.verify_cost = inner, longest, verify_cost
        self.required_layers = inner.required_layers
        self.reset()

    @property
    def verifier(self):
        return self.inner.verifier

    @property
    def assistant_model(self):
        return self.inner.assistant_model

    def networks(self) -> list:
        return self.inner.networks()

    def reset(self) -> None:
        self.inner.reset()
        self.accepted, self.reached = [0.0] * self.longest_draft, [0.0] * self.longest_draft
        self.prior = [PRIOR_WEIGHT] * self.longest_draft  # w_i of the module doc
        self.draft_seconds, self.drafted, self.calls = 0.0, 0, 0
        self.last_draft = None
        self.probes = ProbeBackoff(FIRST_PROBE, LAST_PROBE)

    def describe(self) -> dict:
        return {**self.inner.describe(), "fallback": "running acceptance (draftsmith.drafters.fallback)"}

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        self._count(state.tokens[0].tolist())
        length = self.length(min(shape.length, self.longest_draft))
        if length == 0:
            if self.probes.skip():
                return Draft(state.tokens[0, :0])
            length = 1  # a probe: has the text turned predictable?
        began = time.perf_counter()
        draft = self.inner.propose(state, DraftShape(length=length), sampling)
        if self.calls:  # the first call also reads the prompt into the drafter (module doc)
            self.draft_seconds += time.perf_counter() - began
            self.drafted += len(draft)
        self.calls += 1
        self.remember_draft(state.tokens.shape[1], draft.tokens.tolist())
        return draft

    def length(self, longest: int) -> int:
        """The draft length this request's acceptance so far pays for (the module doc's rule)."""
        if self.verify_cost is None:
            return longest
        through, running, rate = [], 1.0, START
        for i in range(longest):
            rate = (self.accepted[i] + self.prior[i] * rate) / (self.reached[i] + self.prior[i])
            running *= rate
            through.append(running)
        per_token = self.draft_seconds / self.drafted if self.drafted else 0.0
        cost = {n: self.verify_cost[n] + per_token * (n - 1) for n in range(1, longest + 2)}
        return best_length(through, cost)

    def _count(self, committed: list[int]) -> None:
        """Count how much of the previous draft the target accepted, read off the tokens committed since."""
        settled = self.settle_last_draft(committed)
        if settled is None:
            return
        accepted, offered, _ = settled
        for i in range(offered):  # positions looked at, up to the first rejection
            self.reached[i] = DECAY * self.reached[i] + 1
            self.accepted[i] = DECAY * self.accepted[i] + (i < accepted)
            self.prior[i] *= DECAY
        if self.probes.skipped:  # a probe: back to drafting when accepted, else wait twice as long for the next
            self.probes.probed(accepted > 0)
            self.probes.ran()
