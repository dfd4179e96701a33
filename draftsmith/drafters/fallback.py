"""A trained drafter that falls back towards plain decoding within a request where it does not pay.

A drafter trained on code may draft well there and badly on chat; a draft that is rejected still costs its drafting
and a wider target pass (t(k+1) > t(1)), so a weak drafter makes decoding slower than no drafter. `RunningAcceptance`
wraps any trained drafter's proposer (chains, blocks and trees) and picks each draft's length, or a tree's depth,
from what the target accepted so far in this request:

- per draft position (a tree: depth) i, the running conditional acceptance a_i = (accepted_i + w_i a_{i-1}) /
  (reached_i + w_i) over this request's drafts (reached: drafts that got to position i with all before it accepted;
  a tree reaches depth i when its accepted path got to depth i - 1 and had children there), each count decayed by
  0.8 per new observation so that it follows the text as it changes (about the last five drafts weigh). The prior
  a_{i-1} is the oldest observation: its weight w_i starts at 2 and decays by 0.8 with the others, so a position
  with little evidence leans on the one before it, and the first on an optimistic a_0 = 3/4, as prompt lookup
  starts (a request begins by drafting), while a drafter the target keeps rejecting sees a_i fall towards 0. A prior
  that kept its weight would floor a_1 at 1.5 / 7 and keep a target whose two-token pass costs little more than
  one (t(2) ≈ t(1) on a CPU) paying t(2) plus a drafted token for nothing, pass after pass;
- the cost of a pass that verifies a draft of length L: the target's measured verify-cost curve t(n + 1) for its n
  nodes (a chain or block: n = L; a tree of depth L: the nodes the latest tree of that depth had in this request,
  else an EAGLE-2 tree's count min(total, top_k + (L - 1) top_k²)), plus the drafter's measured seconds: per
  drafted token (a tree: per level), or per call for a drafter whose one forward drafts every position of its block
  (`drafts_in_one_forward`: DFlash, DSpark, P-EAGLE), so a shorter block does not look cheaper to draft than it is.
  The seconds are timed on this request's own drafts after its first, which also reads the whole prompt into the
  drafter: a one-time cost that would make long prompts look dear to draft;
- the length L in 0 .. longest with the most expected tokens, 1 + a_1 + a_1 a_2 + ..., per unit of that cost
  (`cost.best_length`). L = 0 is a plain step: nothing is drafted.

A request that has fallen back to L = 0 still probes with one drafted token (a tree: its depth-1 level) after 4
plain steps, then after 8, 16, up to 32 while probes keep failing (back to 4 once one is accepted), so a request
whose text turns predictable gets its drafter back. Within the length it is given, a drafter that cuts by its
confidences (EAGLE, MTP, Medusa, DFlash, DSpark) still cuts. Lengths are decided from earlier passes only, never
from the target's answer to this one: greedy output is plain decoding's and sampling stays exact.
"""

from __future__ import annotations

import time

from draftsmith.cost import best_length, measure_sizes
from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling
from draftsmith.drafters.base import LearnsFromDrafts, ProbeBackoff
from draftsmith.drafters.hybrid import pass_cost

START, PRIOR_WEIGHT, DECAY = 0.75, 2.0, 0.8
FIRST_PROBE, LAST_PROBE = 4, 32


def tree_nodes(depth: int, top_k: int, total_tokens: int) -> int:
    """Nodes of an EAGLE-2 dynamic tree of `depth` levels (`tree.dynamic_tree`): top_k at depth 1 and top_k² more
    candidates per further level, of which the best `total_tokens` are kept."""
    return 0 if depth < 1 else min(total_tokens, top_k + (depth - 1) * top_k * top_k)


class RunningAcceptance(LearnsFromDrafts, Proposer):
    """`inner`'s drafts, each of the length (a tree: the depth) its running acceptance in this request pays for (module
    doc). `longest`: the longest chain; `tree`: the (depth, top_k, total_tokens) of the trees it will be asked for,
    whose sizes `calibrate` measures too."""

    def __init__(self, inner: Proposer, longest: int, verify_cost: dict[int, float] | None = None,
                 tree: tuple[int, int, int] | None = None):
        self.inner, self.longest_draft, self.verify_cost, self.tree = inner, longest, verify_cost, tree
        self.required_layers = inner.required_layers
        self.one_forward = getattr(inner, "drafts_in_one_forward", False)
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
        self.accepted, self.reached, self.prior = [], [], []  # per position; `prior`: w_i of the module doc
        self._reach(max(self.longest_draft, self.tree[0] if self.tree else 0))
        self.draft_seconds, self.drafted, self.timed, self.calls = 0.0, 0, 0, 0  # drafted: tokens (trees: levels)
        self.nodes: dict[int, int] = {}  # tree depth -> nodes of the latest tree drafted at that depth
        self.last_draft = None
        self.probes = ProbeBackoff(FIRST_PROBE, LAST_PROBE)

    def _reach(self, depth: int) -> None:
        """Counts for positions up to `depth` (a tree deeper than the chains asked for so far)."""
        more = depth - len(self.accepted)
        if more > 0:
            self.accepted += [0.0] * more
            self.reached += [0.0] * more
            self.prior += [PRIOR_WEIGHT] * more

    def describe(self) -> dict:
        return {**self.inner.describe(), "fallback": "running acceptance (draftsmith.drafters.fallback)"}

    def calibrate(self, target, longest: int | None = None, context_tokens: int = 256) -> dict[int, float]:
        """The verify-cost curve for chains of up to `longest` tokens and, with `tree`, for the tree of each depth."""
        sizes = set(range(1, (longest or self.longest_draft) + 2))
        if self.tree is not None:
            sizes |= {tree_nodes(depth, *self.tree[1:]) + 1 for depth in range(1, self.tree[0] + 1)}
        self.verify_cost = measure_sizes(target, sizes, context_tokens)
        return self.verify_cost

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        self._count(state.tokens[0].tolist())
        longest = min(shape.length, self.longest_draft) if shape.tree is None else shape.tree[0]
        self._reach(longest)
        length = self.length(longest, shape.tree)
        if length == 0:
            if self.probes.skip():
                return Draft(state.tokens[0, :0])
            length = 1  # a probe: has the text turned predictable?
        asked = DraftShape(length=length) if shape.tree is None else DraftShape(tree=(length, *shape.tree[1:]))
        began = time.perf_counter()
        draft = self.inner.propose(state, asked, sampling)
        if self.calls:  # the first call also reads the prompt into the drafter (module doc)
            self.draft_seconds += time.perf_counter() - began
            self.drafted += len(draft) if shape.tree is None else length
            self.timed += 1
        self.calls += 1
        parents = None if draft.parents is None else draft.parents.tolist()
        if shape.tree is not None:
            self.nodes[length] = len(draft)
        self.remember_draft(state.tokens.shape[1], draft.tokens.tolist(), parents)
        return draft

    def length(self, longest: int, tree: tuple[int, int, int] | None = None) -> int:
        """The draft length (with `tree`: the tree's depth) this request's acceptance so far pays for (the module
        doc's rule), 0 .. `longest`."""
        if self.verify_cost is None:
            return longest
        through, running, rate = [], 1.0, START
        for i in range(longest):
            rate = (self.accepted[i] + self.prior[i] * rate) / (self.reached[i] + self.prior[i])
            running *= rate
            through.append(running)
        cost = {n + 1: self._verify_seconds(n, tree) + self.draft_cost(n) for n in range(longest + 1)}
        return best_length(through, cost)

    def _verify_seconds(self, length: int, tree: tuple[int, int, int] | None) -> float:
        """t(n + 1) of a draft of `length` (a tree: depth), measured or interpolated along the curve."""
        nodes = length if tree is None else self.nodes.get(length, tree_nodes(length, *tree[1:]))
        return self.verify_cost[nodes + 1] if nodes + 1 in self.verify_cost else pass_cost(self.verify_cost, nodes + 1)

    def draft_cost(self, length: int) -> float:
        """The drafter's measured seconds for a draft of `length` (module doc); 0 for a plain step."""
        if length == 0 or not self.timed:
            return 0.0
        if self.one_forward:
            return self.draft_seconds / self.timed
        return self.draft_seconds / self.drafted * length if self.drafted else 0.0

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
