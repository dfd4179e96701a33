"""Prompt lookup: a training-free drafter that copies what followed an earlier match of the last n-gram.

The newest n tokens of the context are searched for earlier in the context (n from `max_ngram`
down to `min_ngram`; the most recent match with a full-length continuation first); the tokens
that followed the match are the draft.
For a tree draft, the continuations of several distinct matches are merged into a trie.
Drafts are deterministic (q one-hot), so `Draft.probs` is None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.errors import DraftsmithError


@dataclass
class Config:
    """Options of the prompt-lookup drafter."""

    max_ngram: int = 3
    """longest n-gram (suffix of the context) to search for; longer matches are tried first"""
    min_ngram: int = 1
    """shortest n-gram to fall back to when no longer one matches"""

    def validate(self) -> None:
        """Reject an empty or inverted n-gram range."""
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise DraftsmithError(
                f"prompt-lookup needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
                f"max_ngram={self.max_ngram}."
            )


class PromptLookup:
    """The Proposer: n-gram matches against the committed tokens, nothing cached between calls."""

    required_layers: list[int] = []

    def __init__(self, config: Config | None = None):
        self.config = config or Config()
        self.config.validate()

    def reset(self) -> None:
        """Nothing to forget: every draft is computed from `state.tokens` alone."""

    def describe(self) -> dict:
        """Kind and n-gram range, for reports."""
        return {"kind": "prompt_lookup", "max_ngram": self.config.max_ngram, "min_ngram": self.config.min_ngram}

    def continuations(self, tokens: torch.Tensor, length: int, limit: int) -> list[torch.Tensor]:
        """Up to `limit` distinct continuations (each ≤ `length` tokens) of earlier n-gram matches."""
        found: list[torch.Tensor] = []
        seen: set[tuple[int, ...]] = set()
        total = tokens.numel()
        for n in range(self.config.max_ngram, self.config.min_ngram - 1, -1):
            if total <= n:
                continue
            windows = tokens.unfold(0, n, 1)[:-1]  # every earlier n-gram, the suffix itself excluded
            starts = (windows == tokens[-n:]).all(1).nonzero().flatten() + n
            # Most recent match with a full-length continuation first, then longest continuations.
            full = starts + length <= total
            for start in torch.cat([starts[full].flip(0), starts[~full]]).tolist():
                follow = tokens[start : start + length]
                key = tuple(follow.tolist())
                if key in seen:
                    continue
                seen.add(key)
                found.append(follow)
                if len(found) >= limit:
                    return found
        return found

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain (the most recent match) or, with `shape.tree`, a trie of several matches."""
        tokens = state.tokens[0]
        if shape.tree is None:
            found = self.continuations(tokens, shape.length, 1)
            return Draft(found[0] if found else tokens[:0])
        depth, top_k, total = shape.tree
        return _trie(self.continuations(tokens, depth, top_k), total, tokens)


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
