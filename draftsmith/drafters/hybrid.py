"""Hybrid drafting: suffix candidates and a trained drafter's chain or tree in one tree per verify pass.

Suffix matching is free and wins where the output copies the prompt or earlier output; a trained drafter wins where
the text is new. Each pass the hybrid takes the suffix candidates (`suffix.SuffixProposer`, with their scores:
estimated chances that the target accepts each path) and decides whether the drafter (any Proposer: EAGLE, MTP,
Medusa, DFlash/DSpark, a draft LM) is worth running, how long its chain should be, and beside how many of the suffix
nodes, by expected accepted tokens per second:

    suffix alone:                 (1 + E_s) / t(n_s + 1)
    drafter and the first m:      (1 + E_s(m) + (1 - S_1(m)) * E_d) / (t(m + n_d + 1) + draft seconds)

E_s = sum of the suffix scores, E_s(m) that of its first m nodes (parents come first, so they are a tree), S_1(m) the
chance that one of their depth-1 tokens is accepted (the drafter adds tokens mostly where the suffix is wrong from
the start: an approximation), n_s the node count; m = 0 is the drafter's draft alone. Beside the drafter, fewer
suffix nodes can pay more: each node costs more verify time on top of the drafter's. E_d = sum over depths j <= n_d
of prod_{i<=j} a_i, with a_i the drafter's acceptance at depth i in this request, measured by the hybrid on the
committed tokens and started from its rate over all requests so far (that rate counts as PRIOR drafts; it starts
at an optimistic 3 of 4): a drafter that is right on code and wrong on an extraction prompt is judged per request.
A chain drafter is weighed at every length n_d up to its own, so a request where its deeper tokens miss gets shorter
chains (draft seconds: the mean of its recent drafts of that length, else of the nearest length it has drafted,
the longer on a tie: a length is taken to cost what its neighbour does until it is measured, as fits both a drafter
that runs once per token and one that drafts all tokens in one forward; a mean, not a median, because the draft
after skipped passes also catches up on the skipped tokens and is a real part of what running the drafter costs); a
tree drafter at its tree (n_d: the median of its recent drafts' sizes; draft seconds: their mean). t is the
target's measured verify-cost curve, in seconds (`calibrate`, then timed passes: below). A request whose drafter has
been skipped PROBE_EVERY passes in a row runs it once more (a probe), so its estimate can recover; each probe of a
request that gets no token accepted doubles the passes to the next one (up to PROBE_LIMIT), one that does resets
them: on text the drafter never gets right, each probe (which catches up on every skipped token) is wasted. Only
past passes feed these, never this pass's target output. Without a curve the drafter always runs, beside every
suffix node.

What a pass costs is measured twice. `calibrate` times bare target passes before decoding; then, as the hybrid decodes,
each pass of n tokens is timed from the moment its draft is handed to the decoder to the next call for a draft
(verify, acceptance, the cache and the captured features: what the pass really costs in this decoder). Once
MEASURED_PASSES have been timed, t(n) is the calibrated t(n) times the median, over the recent timed passes of every
size, of timed over calibrated: the calibration, which interleaves the sizes, gives the shape of the curve, the
passes as decoded its level (against which the drafter's own seconds are weighed). Timed means per size were tried
as the curve itself and failed: sizes come at different times and some in special passes, so on a host whose speed
drifts they disagree by more than the curve varies (on the suite, 100 prompts twice, the recent plain passes
averaged 39.5 ms and the 3-token ones 24.7, calibrated 23.0 and 26.1); the plan then saw a drafter pass 40% cheaper
than a plain one and drafted on translation prompts, where the drafter is right one time in thirty.

Exactness. Greedy: any draft gives the target's own tokens. Sampling: suffix candidates are point-mass drafts
(q = 1 on the token), so a merged tree is verified as a tree of one-hot candidates (DESIGN §3, `verify_tree`),
which is exact for any fixed tree; the drafter's own q is dropped there. Where the suffix finds nothing the
drafter's draft goes out unchanged, with its q. Which of the two forms a pass uses depends only on the suffix
candidates (committed tokens), never on the tokens the drafter sampled: picking the form from those would bias
the q-ratio test of a sampled chain.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from statistics import fmean, median

from draftsmith.cost import measure_sizes
from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling
from draftsmith.drafters.base import LearnsFromDrafts, ProbeBackoff
from draftsmith.drafters.suffix import Candidates, SuffixProposer
from draftsmith.small_batch import MAX_ROWS

PRIOR = 2
"""the rate over all requests counts as this many drafts in a request's own acceptance estimate"""
MEASURED_PASSES = 16
"""passes timed while decoding before their median ratio to the calibrated t(n) rescales the curve"""
PROBE_EVERY = 16
"""a request's drafter, skipped this many passes in a row, runs once more (so its estimate can recover)"""
PROBE_LIMIT = 64
"""the most passes between probes: each missed probe of a request doubles its gap from PROBE_EVERY up to this. On
8 extraction prompts of the suite, where the bench drafter was right on 1 draft in 50, the hybrid spent 3% of its
time in the drafter (its first draft over the prompt, a few misses, then a probe every 16 passes)"""


def pass_cost(cost: dict[int, float], n: int) -> float:
    """t(n) from a measured curve: measured, or linear between the nearest measured sizes, or beyond the largest
    along the last measured slope (never below it)."""
    if n in cost:
        return cost[n]
    sizes = sorted(cost)
    below, above = [s for s in sizes if s < n], [s for s in sizes if s > n]
    if below and above:
        low, high = below[-1], above[0]
        return cost[low] + (cost[high] - cost[low]) * (n - low) / (high - low)
    if above:
        return cost[above[0]]
    last, before = sizes[-1], sizes[-2] if len(sizes) > 1 else sizes[-1]
    slope = max((cost[last] - cost[before]) / (last - before), 0.0) if last != before else 0.0
    return cost[last] + slope * (n - last)


def best_pass(scores: list[float], parents: list[int], drafts: list[tuple[float, float, float]],
              cost: dict[int, float]) -> tuple[int, int] | None:
    """The pass with the most expected tokens per second (the formulas in the module docstring): (suffix nodes kept,
    0 to len, beside `drafts`[index]), or None where the suffix nodes (scores, parents: parents first) alone pay
    best. `drafts`: the drafter's drafts on offer, each (expected accepted tokens E_d, nodes n_d, draft seconds)."""
    best, best_value = None, (1 + sum(scores)) / pass_cost(cost, len(scores) + 1)
    for index, (expected_drafter, nodes, seconds) in enumerate(drafts):
        expected, first = 0.0, 0.0
        for kept in range(len(scores) + 1):
            if kept:
                expected += scores[kept - 1]
                first += scores[kept - 1] if parents[kept - 1] < 0 else 0.0
            together = 1 + expected + (1 - min(first, 1.0)) * expected_drafter
            value = together / (pass_cost(cost, round(kept + nodes) + 1) + seconds)
            if value > best_value:
                best, best_value = (kept, index), value
    return best


def merge(found: Candidates, draft: Draft) -> Draft:
    """One draft holding the suffix nodes, then the drafter's; a path both propose is one path (a trie). Chains
    stay chains when the union is one path; q is one-hot either way (probs None)."""
    tokens, parents, index = [], [], {}

    def add(source_tokens: list[int], source_parents: list[int]) -> None:
        mapped = []
        for token, parent in zip(source_tokens, source_parents):
            parent = mapped[parent] if parent >= 0 else -1
            node = index.get((parent, token))
            if node is None:
                node = index[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            mapped.append(node)

    add(found.tokens, found.parents)
    add(draft.tokens.tolist(), _parents_of(draft))
    return Candidates(tokens, parents, []).draft()


def _parents_of(draft: Draft) -> list[int]:
    return list(range(-1, len(draft) - 1)) if draft.parents is None else draft.parents.tolist()


class HybridProposer(LearnsFromDrafts, Proposer):
    """Suffix candidates merged with `drafter`'s draft in one tree; the drafter is skipped where it does not pay.

    `verify_cost`: t(n) in seconds (`calibrate` measures it); it is shared with the suffix proposer.
    `drafter_length`: for chain shapes, the drafter's chains are at most this long while the suffix candidates take
    the whole draft length (a suffix match often runs on for many tokens where a drafter's acceptance falls with
    depth); None = the draft length for both. `timed`: passes timed while decoding refine the curve (`cost`); off,
    the plan reads `verify_cost` as given (any unit)."""

    def __init__(self, suffix: SuffixProposer, drafter: Proposer, verify_cost: dict[int, float] | None = None,
                 drafter_length: int | None = None, timed: bool = True):
        if drafter_length is not None and drafter_length < 1:
            raise ValueError(f"drafter_length must be at least 1, got {drafter_length}.")
        self.suffix, self.drafter, self.drafter_length, self.timed = suffix, drafter, drafter_length, timed
        self.required_layers = list(drafter.required_layers)
        self.verifier = drafter.verifier  # Medusa-2: its tuned target verifies
        self.verify_cost = verify_cost
        if verify_cost is not None:
            suffix.verify_cost = verify_cost
        self.by_depth: list[list[int]] = []  # the drafter's own drafts, all requests: per depth [accepted, offered]
        self.draft_seconds: deque[float] = deque(maxlen=16)
        self.draft_sizes: deque[int] = deque(maxlen=16)
        self.length_seconds: dict[int, deque[float]] = {}  # a chain drafter's seconds per draft, by length asked
        self.passes: Counter[str] = Counter()  # merged / suffix / drafter / plain
        self.pass_seconds: dict[int, deque[float]] = {}  # timed passes while decoding, by tokens in the pass
        self.reset()

    def reset(self) -> None:
        """Start a new request (the suffix proposer remembers the last one's output); measurements are kept."""
        self.suffix.reset()
        self.drafter.reset()
        self.last_draft = None  # the drafter's last draft, noted with whether it was a probe
        self.warm = False  # a request's first draft also runs the drafter over the prompt: not a typical cost
        self.request_by_depth: list[list[int]] = []  # this request's drafts: per depth [accepted, offered]
        self.probes = ProbeBackoff(PROBE_EVERY, PROBE_LIMIT)  # passes this request has skipped the drafter in a row
        self.sent: tuple[int, float] | None = None  # (tokens in the pass, when its draft was handed over)

    def calibrate(self, target, longest: int | None = None) -> dict[int, float]:
        """Measure the verify cost of a pass with both sources at full size (longest + 1 + the drafter's
        `drafter_length`, else `longest`) and of every size below it up to longest + 1 or the few-row products'
        last tuned row count + 1, whichever is larger (between those and the top: linear), in seconds, each the
        median of CALIBRATION_REPEATS passes. Where a CPU routes some row counts to a faster product
        (`small_batch`) the curve has a step where they end, which a line would hide."""
        longest = longest or self.longest_draft
        top = longest + (self.drafter_length or longest) + 1
        sizes = [*range(1, min(top, max(longest + 1, MAX_ROWS + 1)) + 1), top]
        curve = measure_sizes(target, sizes)
        self.verify_cost = self.suffix.verify_cost = curve
        return self.verify_cost

    def describe(self) -> dict:
        """Both sources, how passes were drafted, and what the skip decision reads, for reports."""
        rates = [round(self._overall_rate(depth), 3) for depth in range(len(self.by_depth))]
        return {"kind": "hybrid", "suffix": self.suffix.describe(), "drafter": self.drafter.describe(),
                "drafter_length": self.drafter_length,
                "passes": dict(self.passes), "drafter_acceptance_by_depth": rates,
                "drafter_ms_median": round(1e3 * median(self.draft_seconds), 3) if self.draft_seconds else None,
                "skips_drafter": self.verify_cost is not None,
                "pass_ms_calibrated": {n: round(1e3 * seconds, 3)
                                       for n, seconds in sorted((self.verify_cost or {}).items())},
                "pass_ms_timed": {n: round(1e3 * fmean(times), 3) for n, times in sorted(self.pass_seconds.items())},
                "pass_scale": self._scale()}

    def networks(self) -> list:
        return self.drafter.networks()

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """Suffix candidates, the drafter's draft, or both merged into one tree; the previous pass is timed."""
        now = time.perf_counter()
        if self.sent is not None:
            size, handed = self.sent
            self.pass_seconds.setdefault(size, deque(maxlen=32)).append(now - handed)
        draft = self._propose(state, shape, sampling)
        self.sent = (len(draft) + 1, time.perf_counter()) if self.timed else None
        return draft

    def cost(self) -> dict[int, float] | None:
        """t(n) as the plan reads it: the calibrated t(n) times the median ratio of timed to calibrated seconds over
        the recent timed passes of every calibrated size, once MEASURED_PASSES have been timed; else as calibrated."""
        if self.verify_cost is None or not self.timed:
            return self.verify_cost
        ratios = [seconds / self.verify_cost[n] for n, times in self.pass_seconds.items() if n in self.verify_cost
                  for seconds in times]
        if len(ratios) < MEASURED_PASSES:
            return self.verify_cost
        scale = median(ratios)
        return {n: scale * seconds for n, seconds in self.verify_cost.items()}

    def _scale(self) -> float | None:
        """The factor the timed passes put on the calibrated curve (1 until MEASURED_PASSES), for reports."""
        if not self.verify_cost or not self.timed:
            return None
        smallest = min(self.verify_cost)
        return round(self.cost()[smallest] / self.verify_cost[smallest], 3)

    def _propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        committed = state.tokens[0].tolist()
        self._learn(committed)
        cost = self.cost()
        if cost is not None:
            self.suffix.verify_cost = cost  # the suffix candidates are cut by the same curve
        found = self.suffix.candidates(state, shape)
        own = self.drafter_shape(shape)
        plan = self._plan(found, own, cost)
        if plan is None and self.probes.skip():
            self.passes["suffix" if found.tokens else "plain"] += 1
            return found.draft()
        if plan is not None:  # else a probe: the drafter's whole draft beside every suffix node
            kept, own = plan
            found = Candidates(found.tokens[:kept], found.parents[:kept], found.scores[:kept])
        self.probes.ran()
        start = time.perf_counter()
        draft = self.drafter.propose(state, own, sampling)
        if self.warm:
            self.draft_seconds.append(time.perf_counter() - start)
            if own.tree is None:
                self.length_seconds.setdefault(own.length, deque(maxlen=16)).append(self.draft_seconds[-1])
        self.warm = True
        self.draft_sizes.append(len(draft))
        if len(draft):
            parents = None if draft.parents is None else draft.parents.tolist()
            self.remember_draft(len(committed), draft.tokens.tolist(), parents, note=plan is None)
        if not found.tokens:  # the drafter's own draft, with its q when it sampled
            self.passes["drafter"] += 1
            return draft
        self.passes["merged"] += 1
        return merge(found, draft)

    def drafter_shape(self, shape: DraftShape) -> DraftShape:
        """The shape the drafter drafts: chains cut to `drafter_length`, trees as they are."""
        if shape.tree is not None or self.drafter_length is None:
            return shape
        return DraftShape(length=min(shape.length, self.drafter_length))

    def _plan(self, found: Candidates, shape: DraftShape,
              cost: dict[int, float] | None) -> tuple[int, DraftShape] | None:
        """This pass's plan (`best_pass` under `cost`): how many suffix nodes go beside the drafter's draft and the
        drafter's shape (chains: any length up to `shape`'s); None: skip the drafter. Without a cost curve: all of
        both."""
        if cost is None:
            return len(found.tokens), shape
        reach = shape.length if shape.tree is None else shape.tree[0]
        through, accept = [], 1.0  # chance the drafter's chain is accepted through each depth, in this request
        for depth in range(reach):
            accepted, offered = self.request_by_depth[depth] if depth < len(self.request_by_depth) else (0, 0)
            accept *= (accepted + PRIOR * self._overall_rate(depth)) / (offered + PRIOR)
            through.append(accept)
        if shape.tree is None:
            shapes = [DraftShape(length) for length in range(1, reach + 1)]
            drafts = [(sum(through[:length]), length, self._chain_seconds(length)) for length in range(1, reach + 1)]
        else:
            nodes = median(self.draft_sizes) if self.draft_sizes else shape.tree[2]
            seconds = fmean(self.draft_seconds) if self.draft_seconds else 0.0
            shapes, drafts = [shape], [(sum(through), nodes, seconds)]
        plan = best_pass(found.scores, found.parents, drafts, cost)
        return None if plan is None else (plan[0], shapes[plan[1]])

    def _chain_seconds(self, length: int) -> float:
        """Draft seconds of a chain of `length`: the mean of its recent drafts at that length, else at the nearest one
        (the longer on a tie); 0 before any."""
        if not self.length_seconds:
            return 0.0
        nearest = min(self.length_seconds, key=lambda measured: (abs(measured - length), -measured))
        return fmean(self.length_seconds[nearest])

    def _overall_rate(self, depth: int) -> float:
        """The drafter's acceptance at `depth` over all requests so far, from an optimistic 3 of 4."""
        accepted, offered = self.by_depth[depth] if depth < len(self.by_depth) else (0, 0)
        return (accepted + 3) / (offered + 4)

    def _learn(self, committed: list[int]) -> None:
        """Per-depth acceptance of the drafter's previous draft, read off the committed tokens; under greedy
        decoding exactly what the drafter alone would have had accepted."""
        settled = self.settle_last_draft(committed)
        if settled is None:
            return
        accepted, offered, draft = settled
        if draft.note:  # a probe
            self.probes.probed(accepted > 0)
        for counts in (self.by_depth, self.request_by_depth):
            while len(counts) < offered:
                counts.append([0, 0])
            for depth in range(offered):
                counts[depth][1] += 1
                counts[depth][0] += depth < accepted
