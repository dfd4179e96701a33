"""Prompt lookup: a training-free drafter that copies what followed an earlier match of the last n-gram. It is a
preset of suffix drafting (`draftsmith.drafters.suffix`), under its own name and options.

The newest n tokens of the context are searched for earlier in the context (n from `max_ngram` down to
`min_ngram`); the chain is what followed the most recent match of the longest n with a full-length continuation
(else the longest continuation). A tree merges the continuations of several distinct matches, newest and longest n
first, into a trie. Drafts are deterministic (q one-hot), so `Draft.probs` is None.

Adaptive chain length: a draft of L tokens costs one target pass over L + 1 tokens, t(L+1), and yields
1 + (accepted tokens). On a CPU t(n) jumps between small n (here t(2) is ~1.5 t(1)) and then stays nearly flat, and
how often a copied token is right depends on how long the match was (a 1-gram match is rarely right, a 3-gram one
usually is). So with a measured cost curve, each draft's length L <= k maximises the expected tokens per unit of cost,
    (1 + a + a^2 + ... + a^L) / t(L+1),
where a is the running per-token acceptance rate of drafts made from matches of the same n-gram length and the same
"was the previous draft fully accepted" state (counts start at an optimistic 3 of 4, so that one early miss does not
end drafting for that kind of match, and carry over between requests of one run). L = 0 means "no draft: a plain
step". Without a cost curve (or with `adaptive: false`) every draft is the full k.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.drafters import suffix
from draftsmith.drafters.base import relative_cost
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

    def suffix_config(self) -> suffix.Config:
        """The suffix drafter's options that are this preset."""
        return suffix.Config(max_match=self.max_ngram, min_match=self.min_ngram, choose="recent", trees="recent",
                             adaptive=self.adaptive)


class PromptLookup(suffix.SuffixProposer):
    """Suffix drafting under prompt lookup's options and name (reports say `prompt_lookup`).

    `verify_cost` maps n (tokens in one target pass) to its cost, any unit; see `calibrate`."""

    def __init__(self, config: Config | None = None, verify_cost: dict[int, float] | None = None):
        self.lookup = config or Config()
        self.lookup.validate()
        super().__init__(self.lookup.suffix_config(), verify_cost)

    def describe(self) -> dict:
        """Kind, n-gram range and length policy, for reports."""
        described = {"kind": "prompt_lookup", "max_ngram": self.lookup.max_ngram, "min_ngram": self.lookup.min_ngram,
                     "adaptive": self.lookup.adaptive and self.verify_cost is not None}
        if described["adaptive"]:
            described["verify_cost_relative"] = relative_cost(self.verify_cost)
            described["acceptance_by_match"] = {f"n={n}, after full accept={full}": round(a / max(o, 1), 3)
                                                for (n, full), (a, o) in sorted(self.counts.items())}
        return described
