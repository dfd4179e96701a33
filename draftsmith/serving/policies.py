"""Scheduling policies, the response-length predictor and the draft-length choice of each pass.

A policy is one priority function `(request, view) -> sortable key` (lower runs first) plus whether
it may preempt. The speculation modes pick one draft length per pass (a padded batch verifies one
width anyway): `off` (0), `fixed` (the traced main length) and `adaptive` (the length, 0 included,
with the most expected tokens per second of the pass under the cost model and each request's running
acceptance).
"""

from __future__ import annotations

import difflib
import math

import numpy as np

from draftsmith.errors import DraftsmithError
from draftsmith.serving.traces import TracedPrompt

STABLE_ERROR = 0.1
"""acceptance-aware scheduling treats α̂ as stable once its binomial standard error is below this"""


# --------------------------------------------------------------------------- length predictor
class LengthPredictor:
    """Predicts a response's total length from its category and the tokens it has emitted so far.

    The prediction is the mean length of the *other* traced prompts of the same category (all
    categories when none of its own is longer) that are longer than what was emitted: the conditional mean
    residual life, re-predicted as tokens come. Leaving the prompt itself out keeps it honest."""

    def __init__(self, prompts: list[TracedPrompt]):
        self.prompts = prompts
        self.memo: dict[tuple[str, int], float] = {}  # ranking asks again every pass

    def total(self, prompt: TracedPrompt, emitted: int) -> float:
        """Predicted total output tokens of `prompt` after `emitted` tokens."""
        key = (prompt.name, emitted)
        if key not in self.memo:
            self.memo[key] = self._total(prompt, emitted)
        return self.memo[key]

    def _total(self, prompt: TracedPrompt, emitted: int) -> float:
        others = [p for p in self.prompts if p.name != prompt.name]
        for pool in ([p for p in others if p.category == prompt.category], others):
            longer = [p.new_tokens for p in pool if p.new_tokens > emitted]
            if longer:
                return float(np.mean(longer))
        return emitted + 1.0  # nothing longer was ever seen: expect it to end now

    def remaining(self, request) -> float:
        """Predicted output tokens still to come for a live request."""
        return max(self.total(request.prompt, request.emitted) - request.emitted, 1.0)

    def error(self) -> dict:
        """Mean absolute error (tokens) of the predicted remaining length: at admission and over every position."""
        first, every = [], []
        for p in self.prompts:
            for emitted in range(1, p.new_tokens):
                miss = abs(self.total(p, emitted) - p.new_tokens)
                every.append(miss)
                if emitted == 1:
                    first.append(miss)
        mean_length = float(np.mean([p.new_tokens for p in self.prompts]))
        return {"mae_at_admission_tokens": float(np.mean(first)) if first else None,
                "mae_all_positions_tokens": float(np.mean(every)) if every else None,
                "mean_output_tokens": mean_length}


# --------------------------------------------------------------------------- policies
def fcfs(request, view) -> tuple:
    """First come, first served: arrival order."""
    return (request.arrival,)


def srf_oracle(request, view) -> tuple:
    """Shortest remaining first with the true remaining length (an upper bound on what prediction can do)."""
    return (request.remaining, request.arrival)


def srf_predicted(request, view) -> tuple:
    """Shortest remaining first with the length predictor, re-predicted at every pass."""
    return (view.predictor.remaining(request), request.arrival)


def acceptance_aware(request, view) -> tuple:
    """Least attained service while α̂ is unstable, then shortest estimated remaining time (predicted tokens / τ̂)."""
    alpha = request.acceptance(view.prior_acceptance)
    stable = view.draft_length == 0 or (
        request.offered > 0 and math.sqrt(alpha * (1 - alpha) / request.offered) < STABLE_ERROR)
    if not stable:
        return (0, request.attained, request.arrival)
    passes = view.predictor.remaining(request) / request.tokens_per_pass(view.prior_acceptance)
    return (1, passes, request.arrival)


POLICIES = {  # name -> (priority function, preemptive)
    "fcfs": (fcfs, False),
    "srf-oracle": (srf_oracle, True),
    "srf-predicted": (srf_predicted, True),
    "las-srt": (acceptance_aware, True),
}


def policy(name: str):
    """The (priority, preemptive) pair of a policy name, or a clear error naming the valid ones."""
    if name not in POLICIES:
        close = difflib.get_close_matches(name, list(POLICIES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise DraftsmithError(f"Unknown policy '{name}'.{hint} Policies: {', '.join(POLICIES)}.")
    return POLICIES[name]


# --------------------------------------------------------------------------- draft length per pass
def expected_tokens(alpha: float, length: int) -> float:
    """Expected tokens of one verify pass of a chain of `length` with i.i.d. acceptance α (bonus included)."""
    return float(sum(alpha**i for i in range(length + 1)))


def speculation(mode: str, main_length: int, lengths: list[int], draft_seconds: dict[int, float]):
    """The per-pass draft-length function of a mode: 'off', 'fixed' or 'adaptive'."""
    def off(batch, cost, view) -> int:
        return 0

    def fixed(batch, cost, view) -> int:
        return main_length

    if mode in ("off", "fixed"):
        chosen = off if mode == "off" else fixed
        chosen.nominal = 0 if mode == "off" else main_length  # what acceptance-aware ranking assumes
        return chosen
    if mode != "adaptive":
        raise DraftsmithError(f"Unknown speculation mode '{mode}'. Modes: off, fixed, adaptive.")

    def adaptive(batch, cost, view) -> int:
        context = max(r.context for r in batch)
        best, best_rate = 0, -1.0
        for length in [0, *lengths]:
            tokens = sum(min(expected_tokens(r.acceptance(view.prior_acceptance), length), r.remaining) for r in batch)
            seconds = cost.step(len(batch), length + 1, context) + len(batch) * draft_seconds.get(length, 0.0)
            if tokens / seconds > best_rate:
                best, best_rate = length, tokens / seconds
        return best

    adaptive.nominal = main_length
    return adaptive
