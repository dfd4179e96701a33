"""Prompt lookup: a training-free drafter that copies what followed an earlier match of the last n-gram.

The newest n tokens of the context are searched for earlier in the context (n from `max_ngram`
down to `min_ngram`; the most recent match with a full-length continuation first); the tokens
that followed the match are the draft.
For a tree draft, the continuations of several distinct matches are merged into a trie.
Drafts are deterministic (q one-hot), so `Draft.probs` is None.

Adaptive chain length: a draft of L tokens costs one target pass over L + 1 tokens, t(L+1), and
yields 1 + (accepted tokens). On a CPU t(n) jumps between small n (here t(2) is ~1.5 t(1)) and
then stays nearly flat, and how often a copied token is right depends on how long the match
was (a 1-gram match is rarely right, a 3-gram one usually is). So with a measured cost curve,
each draft's length L <= k maximises the expected tokens per unit of cost,
    (1 + a + a^2 + ... + a^L) / t(L+1),
where a is the running per-token acceptance rate of drafts made from matches of the same n-gram
length and the same "was the previous draft fully accepted" state (counts start at an optimistic
3 of 4, so that one early miss does not end drafting for that kind of match, and carry over
between requests of one run). L = 0 means "no draft: a plain step".
Without a cost curve (or with `adaptive: false`) every draft is the full k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.cost import best_length, calibrated, measure
from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.errors import DraftsmithError


@dataclass
class Config:
    """Options of the prompt-lookup drafter."""

    max_ngram: int = 3
    """longest n-gram (suffix of the context) to search for; longer matches are tried first"""
    min_ngram: int = 1
    """shortest n-gram to fall back to when no longer one matches"""
    adaptive: bool = True
    """choose each chain draft's length (at most k) from the verify-cost curve and running acceptance rates"""

    def validate(self) -> None:
        """Reject an empty or inverted n-gram range."""
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise DraftsmithError(
                f"prompt-lookup needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
                f"max_ngram={self.max_ngram}."
            )


class NgramIndex:
    """Where each n-gram of the committed tokens starts, extended by the new tokens of every cycle.

    Searching the whole context for the last n-gram costs O(context) per cycle; with this index a
    cycle costs O(new tokens) to extend it plus O(matches looked at)."""

    def __init__(self, sizes) -> None:
        self.sizes = list(sizes)
        self.tokens = torch.zeros(0, dtype=torch.long)  # what is indexed
        self.listed: list[int] = []
        self.starts: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.sizes}

    def update(self, tokens: torch.Tensor) -> None:
        """Index the tokens after the indexed prefix; start over when `tokens` does not extend it."""
        known = self.tokens.numel()
        # torch.equal is a memcmp-speed check, kept so that a caller switching sequences without
        # reset() still gets right matches.
        if tokens.numel() < known or not torch.equal(tokens[:known], self.tokens):
            self.__init__(self.sizes)
            known = 0
        new = tokens[known:].tolist()
        self.listed.extend(new)
        for end in range(known + 1, len(self.listed) + 1):
            for n in self.sizes:
                if end >= n:
                    self.starts[n].setdefault(tuple(self.listed[end - n : end]), []).append(end - n)
        self.tokens = tokens.clone()

    def match_ends(self, n: int, total: int, length: int):
        """Where the continuations of earlier matches of the last n tokens begin: matches with a full
        `length`-token continuation from the most recent back, then the others, longest first."""
        if total <= n:
            return
        starts = self.starts[n].get(tuple(self.listed[total - n : total]), [])
        last = len(starts) - 1 if starts and starts[-1] == total - n else len(starts)  # the suffix itself
        short = []
        for i in range(last - 1, -1, -1):
            end = starts[i] + n
            if end + length <= total:
                yield end
            else:
                short.append(end)
        yield from reversed(short)


class PromptLookup:
    """The Proposer: n-gram matches against the committed tokens.

    `verify_cost` maps n (tokens in one target pass) to its cost, any unit; see `calibrate`."""

    required_layers: list[int] = []

    def __init__(self, config: Config | None = None, verify_cost: dict[int, float] | None = None):
        self.config = config or Config()
        self.config.validate()
        self.verify_cost = verify_cost
        self.counts: dict[tuple[int, bool], list[int]] = {}  # (n, last draft fully accepted) -> [accepted, offered]
        self.reset()

    def reset(self) -> None:
        """Forget the previous request (its last draft); the acceptance counts are kept."""
        self.pending: tuple[int, list[int], tuple[int, bool]] | None = None  # (at length, draft, class)
        self.last_full = False
        self.index = NgramIndex(range(self.config.min_ngram, self.config.max_ngram + 1))

    def calibrate(self, target, max_length: int, context_tokens: int = 256) -> dict[int, float]:
        """Measure t(n) for n = 1 .. max_length + 1 on `target` (a few seconds); adaptive drafts use it."""
        self.verify_cost = measure(target, max_length, context_tokens)
        return self.verify_cost

    def describe(self) -> dict:
        """Kind, n-gram range and length policy, for reports."""
        described = {"kind": "prompt_lookup", "max_ngram": self.config.max_ngram, "min_ngram": self.config.min_ngram,
                     "adaptive": self.config.adaptive and self.verify_cost is not None}
        if described["adaptive"]:
            described["verify_cost_relative"] = {n: round(c / self.verify_cost[1], 3) for n, c in self.verify_cost.items()}
            described["acceptance_by_match"] = {f"n={n}, after full accept={full}": round(a / max(o, 1), 3)
                                                for (n, full), (a, o) in sorted(self.counts.items())}
        return described

    def continuations(self, tokens: torch.Tensor, length: int, limit: int) -> list[tuple[int, torch.Tensor]]:
        """Up to `limit` distinct (n, continuation ≤ `length` tokens) of earlier n-gram matches, n = match length."""
        self.index.update(tokens)
        found: list[tuple[int, torch.Tensor]] = []
        seen: set[tuple[int, ...]] = set()
        total = tokens.numel()
        for n in range(self.config.max_ngram, self.config.min_ngram - 1, -1):
            for start in self.index.match_ends(n, total, length):
                follow = tokens[start : start + length]
                key = tuple(follow.tolist())
                if key in seen:
                    continue
                seen.add(key)
                found.append((n, follow))
                if len(found) >= limit:
                    return found
        return found

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain (the most recent match) or, with `shape.tree`, a trie of several matches."""
        tokens = state.tokens[0]
        if shape.tree is not None:
            depth, top_k, total = shape.tree
            return _trie([path for _, path in self.continuations(tokens, depth, top_k)], total, tokens)
        self._learn(tokens)
        found = self.continuations(tokens, shape.length, 1)
        if not found:
            return Draft(tokens[:0])
        n, draft = found[0]
        key = (n, self.last_full)
        draft = draft[: self._length(key, shape.length)]
        if draft.numel():
            self.pending = (tokens.numel(), draft.tolist(), key)
        return Draft(draft)

    def _learn(self, tokens: torch.Tensor) -> None:
        """Count how much of the previous draft the target accepted (read off the committed tokens)."""
        if self.pending is None:
            return
        at, draft, key = self.pending
        self.pending = None
        committed = tokens[at : at + len(draft)].tolist()
        accepted = next((i for i, (a, b) in enumerate(zip(draft, committed)) if a != b), len(committed))
        counts = self.counts.setdefault(key, [0, 0])
        counts[0] += accepted
        counts[1] += min(len(draft), accepted + 1)  # tokens looked at up to the first rejection
        self.last_full = accepted == len(draft)

    def _length(self, key: tuple[int, bool], longest: int) -> int:
        """Draft length in [0, longest] with the most expected tokens per unit of verify cost."""
        if not self.config.adaptive or not calibrated(self.verify_cost, longest):
            return longest
        accepted, offered = self.counts.get(key, (0, 0))
        rate = (accepted + 3) / (offered + 4)  # an optimistic start: 3 of 4
        return best_length([rate**length for length in range(1, longest + 1)], self.verify_cost)


def _trie(paths: list[torch.Tensor], total: int, like: torch.Tensor) -> Draft:
    """Merge token paths into a tree draft of at most `total` nodes (shared prefixes share nodes)."""
    node_tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for path in paths:
        parent = -1
        for token in path.tolist():
            node = index.get((parent, token))
            if node is None:
                if len(node_tokens) >= total:
                    break
                node = len(node_tokens)
                index[(parent, token)] = node
                node_tokens.append(token)
                parents.append(parent)
            parent = node
    return Draft(torch.tensor(node_tokens, dtype=like.dtype), torch.tensor(parents, dtype=torch.long))


def load_proposer(config: Config | None = None, target=None) -> PromptLookup:
    """The prompt-lookup proposer (the target is not needed; accepted for a uniform call)."""
    return PromptLookup(config)
