"""What proposers share, written once: how much of the last draft the target accepted, the catch-up and crop of a
drafter's own cache, the back-off of probes after skipped passes, confidence cuts under the verify-cost curve, and
the rows of a head over a draft vocabulary.

Every piece reads only the committed tokens (`DecodeState.tokens`), never the target's answer to the pass being
drafted, so what a proposer learns or skips keeps decoding exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from draftsmith.cost import StoppingRule, calibrated
from draftsmith.drafters import DecodeState, Draft, Proposer, Sampling, shared_prefix
from draftsmith.errors import DraftsmithError
from draftsmith.kv_cache import keep_cache
from draftsmith.sampling import target_probs


# --------------------------------------------------------------------------- how much of the last draft was accepted
def accepted_depth(tokens: list[int], parents: list[int] | None, committed: list[int]) -> tuple[int, int]:
    """(drafted tokens the target accepted: the depth of the draft's deepest node on the committed path, positions it
    looked at: one more where that node has children, i.e. up to and including the first rejected one). `parents`
    None: a chain; `committed`: the tokens committed after the draft's root."""
    if parents is None:
        accepted = next((i for i, (a, b) in enumerate(zip(tokens, committed)) if a != b),
                        min(len(tokens), len(committed)))
        return accepted, min(len(tokens), accepted + 1)
    node, depth = -1, 0
    for token in committed:
        child = next((i for i, p in enumerate(parents) if p == node and tokens[i] == token), None)
        if child is None:
            break
        node, depth = child, depth + 1
    return depth, depth + int(any(p == node for p in parents))


@dataclass
class LastDraft:
    """A proposer's previous draft, kept until its next call reads off the committed tokens what the target did
    with it."""

    at: int  # committed tokens when it was drafted (its root is the last of them)
    tokens: list[int]
    parents: list[int] | None = None  # None: a chain
    note: Any = None  # what the proposer files the outcome under


class LearnsFromDrafts:
    """For proposers that learn from how much of their previous draft the target accepted (suffix matching and its
    prompt-lookup preset, the fallback, the hybrid): `remember_draft` when drafting, `settle_last_draft` on the next
    call (a new request's `reset` sets `last_draft` to None)."""

    last_draft: LastDraft | None = None

    def remember_draft(self, at: int, tokens: list[int], parents: list[int] | None = None, note: Any = None) -> None:
        """Keep this pass's draft (`at` committed tokens before it) to be settled on the next call."""
        self.last_draft = LastDraft(at, list(tokens), parents, note)

    def settle_last_draft(self, committed) -> tuple[int, int, LastDraft] | None:
        """(accepted, offered as in `accepted_depth`, the draft) of the previous draft, read off the `committed`
        tokens (a list or a 1-D tensor) and then forgotten; None where there is none."""
        draft, self.last_draft = self.last_draft, None
        if draft is None:
            return None
        after = committed[draft.at : draft.at + len(draft.tokens)] if draft.parents is None else committed[draft.at:]
        after = after.tolist() if isinstance(after, torch.Tensor) else after
        return (*accepted_depth(draft.tokens, draft.parents, after), draft)


# --------------------------------------------------------------------------- probes after skipped passes
class ProbeBackoff:
    """A drafter skipped pass after pass (it did not pay) runs once more, a probe, after `first` skipped passes; each
    probe the target rejects doubles the wait (up to `last`), one it accepts brings it back to `first`. On text the
    drafter never gets right, probes then cost little; where the text turns predictable, the drafter comes back."""

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self.skipped, self.wait = 0, first  # passes skipped in a row; skips before the next probe

    def skip(self) -> bool:
        """Whether this pass may skip the drafter (and count it); False: the wait is over, it is time to probe."""
        if self.skipped < self.wait:
            self.skipped += 1
            return True
        return False

    def ran(self) -> None:
        """The drafter ran: no pass skipped in a row."""
        self.skipped = 0

    def probed(self, accepted: bool) -> None:
        """A probe's outcome: back to the first wait when the target accepted some of it, else twice the wait."""
        self.wait = self.first if accepted else min(2 * self.wait, self.last)


# --------------------------------------------------------------------------- confidence cuts
OPEN_CHAIN_REACH = 8
"""How far the verify-cost curve is measured by default for chains with no length of their own (EAGLE, a shared
MTP module); `draftsmith eval` measures as far as the asked draft length when that is longer."""


def relative_cost(cost: dict[int, float]) -> dict[int, float]:
    """t(n) / t(1), rounded: a verify-cost curve as reports show it."""
    return {n: round(c / cost[1], 3) for n, c in cost.items()}


class CutsDrafts(Proposer):
    """A proposer that cuts its chains with a `StoppingRule` (EAGLE, MTP, Medusa, DSpark): the rule for one draft,
    read off the verify-cost curve that `calibrate` measures (the runner calls it when `wants_verify_cost`). A subclass
    sets `confidence_cut`, `longest_draft` and, where only some of its drafters have confidences, `can_cut`."""

    can_cut = True

    def stopping_rule(self, longest: int) -> StoppingRule | None:
        """The rule for a draft of up to `longest` tokens, or None (no cut: off, or no curve measured)."""
        if not self.confidence_cut or self.verify_cost is None:
            return None
        if not calibrated(self.verify_cost, longest):
            raise DraftsmithError(f"A confidence cut of drafts of up to {longest} tokens needs the verify cost of "
                                  f"1..{longest + 1} tokens; it was measured for up to {max(self.verify_cost)}: "
                                  f"calibrate(target, {longest}) first.")
        return StoppingRule(self.verify_cost, longest)

    def describe_cut(self) -> dict:
        """For reports: whether drafts are cut, and the relative verify-cost curve they are cut by."""
        cut = self.confidence_cut and self.verify_cost is not None
        return {"confidence_cut": cut, **({"verify_cost_relative": relative_cost(self.verify_cost)} if cut else {})}


def feature_tokens(state: DecodeState, drafter: str) -> torch.Tensor:
    """The committed tokens [T] (on the CPU) of a drafter that reads target features, which needs one (T >= 2)."""
    if state.tokens.shape[1] < 2:
        raise DraftsmithError(f"{drafter} needs two committed tokens (one target feature) to draft.")
    return state.tokens[0].cpu()


def draw(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None,
         rows: DraftRows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft token (target id) from `logits` [N] over a head's `rows` (None: the target vocabulary): the argmax
    when greedy (q None), else a sample from q, the processed distribution over the target vocabulary, returned
    with it (what the lossless acceptance rule reads)."""
    if sampling.greedy:
        best = logits.argmax(-1)
        return (best if rows is None else rows.to_target(best)), None
    q = target_probs((logits if rows is None else rows.logits_to_target(logits))[None], sampling)[0]
    return torch.multinomial(q, 1, generator=generator)[0], q


def chain(tokens: list[torch.Tensor], probs: list[torch.Tensor | None], state: DecodeState) -> Draft:
    """The chain Draft of tokens drafted one at a time (on the CPU), with the q each was sampled from (None entries:
    greedy, no q)."""
    if not tokens:
        return Draft(state.tokens[0, :0])
    drawn = [q for q in probs if q is not None]
    return Draft(torch.stack(tokens).cpu(), probs=torch.stack(drawn).cpu() if drawn else None)


# --------------------------------------------------------------------------- a drafter's own cache
EMPTY = torch.zeros(0, dtype=torch.long)


def cache_length(cache) -> int:
    """Positions a drafter cache holds: a DynamicCache, or per-layer (keys, values) [b, heads, positions, d]."""
    return cache.get_seq_length() if isinstance(cache, DynamicCache) else cache[0][0].shape[2]


def crop(cache, length: int):
    """`cache` cut to its first `length` positions: a DynamicCache in place (`kv_cache.keep_cache`) and returned,
    per-layer (keys, values) pairs as views."""
    if isinstance(cache, DynamicCache):
        keep_cache(cache, length, EMPTY)
        return cache
    return tuple((keys[:, :, :length], values[:, :, :length]) for keys, values in cache)


class CachedProposer(Proposer):
    """A proposer with its own cache over the committed tokens (EAGLE, MTP, DFlash, a draft LM), rolled back by
    position on every call: `cached` holds the tokens its entries were made from, and `reusable` says how many
    entries the tokens committed now leave valid; `crop` cuts the rest."""

    cached: torch.Tensor = EMPTY

    def forget_cache(self) -> None:
        """A new request: no entry is valid."""
        self.cached = EMPTY

    def reusable(self, tokens: torch.Tensor, held: int, lookahead: int = 0, limit: int | None = None) -> int:
        """How many leading entries of a cache holding `held` stay valid for the committed `tokens` [T]: entry t, made
        from tokens 0..t + `lookahead`, while those are unchanged since `cached`; at most `limit`."""
        valid = shared_prefix(self.cached, tokens) - lookahead
        return max(0, min(held, valid, held if limit is None else limit))


# --------------------------------------------------------------------------- a head over a draft vocabulary
class DraftRows:
    """Which target token each row of a drafter's head drafts: `ids`, the target id of each row over a draft
    vocabulary (`data.vocab.DraftVocab`: row i drafts i + d2t[i]), or None where the rows are the target's whole
    vocabulary of `vocab_size` tokens."""

    def __init__(self, ids: torch.Tensor | None, vocab_size: int):
        self.ids, self.vocab_size = ids, vocab_size

    @classmethod
    def from_offsets(cls, d2t: torch.Tensor | None, vocab_size: int) -> DraftRows:
        """From a draft vocabulary's offsets `d2t` (ids i + d2t[i], on its device); None: the whole vocabulary."""
        return cls(None if d2t is None else torch.arange(d2t.numel(), device=d2t.device) + d2t, vocab_size)

    def to_target(self, rows: torch.Tensor) -> torch.Tensor:
        """Target token ids of head rows `rows` (on their device)."""
        return rows if self.ids is None else self.ids[rows.to(self.ids.device)].to(rows.device)

    def logits_to_target(self, logits: torch.Tensor) -> torch.Tensor:
        """Row logits [..., N] as logits over the target vocabulary [..., V], -inf where no row drafts."""
        if self.ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.ids.to(logits.device)] = logits
        return full

    def probs_to_target(self, q: torch.Tensor) -> torch.Tensor:
        """A distribution [..., N] over the rows as one over the target vocabulary [..., V] (0 where no row drafts),
        as the lossless acceptance rule reads it."""
        if self.ids is None:
            return q
        full = q.new_zeros(*q.shape[:-1], self.vocab_size)
        full[..., self.ids.to(q.device)] = q
        return full
