"""Suffix drafting (SuffixDecoding-style): continue the longest recurring suffix of the context with what most
often followed it, in the current request and, optionally, in earlier requests' outputs. Training-free.

Matching (`suffix_store`). The request's committed tokens and the cached outputs sit in token arrays that also list,
per token id, its positions; the `max_occurrences` most recent occurrences of the longest match (at most
`max_match` tokens) give the continuations.

Scoring. The continuations form a trie with counts. A node's score estimates the chance the target accepts the
path to it: a^depth x count(node) / occurrences, where a is the learned per-token acceptance of drafts from
matches of that length (and "was the previous draft fully accepted"), read off the committed tokens
(`base.LearnsFromDrafts`), from an optimistic 3 of 4. A chain is the most frequent path; a tree the best-scoring
nodes. With a measured verify-cost curve a draft is cut to the size with the most expected tokens per unit of cost,
(1 + sum of kept scores) / t(kept + 1) (`cost.best_length`); none at all is a plain step. Drafts are point masses
(q one-hot, `Draft.probs` None), so verification stays exact.

Prompt lookup is a preset (`prompt_lookup.PromptLookup`): `max_match=3, min_match=1, choose="recent",
trees="recent"`, the chain of the newest occurrence of the longest match (the one with the longest continuation),
and trees of the distinct continuations of several match lengths, newest first.

Cross-request cache: earlier outputs, at most `cache_tokens` tokens, the least recently used (added or drafted
from) evicted first; per process. With `cache_file` it is read at start and rewritten after every request through
a temporary file, fsync and rename, so a crash leaves the old file or the new one; a file torn anyway (truncated,
overwritten) or written for another tokenizer fails its checksum or checks and is ignored with a warning.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from draftsmith.cost import best_length, calibrated
from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling
from draftsmith.drafters.base import LearnsFromDrafts
from draftsmith.drafters.suffix_store import DocumentCache, TokenStore
from draftsmith.errors import DraftsmithError


@dataclass
class Config:
    """Options of the suffix drafter."""

    max_match: int = 16
    """longest suffix of the context that is matched; longer recurring suffixes count as this long"""
    min_match: int = 1
    """shortest suffix match that is drafted from"""
    choose: Literal["frequency", "recent"] = "frequency"
    """chains: the most frequent continuation of the longest match, or (recent, prompt lookup's rule) that of its
    most recent occurrence with the longest continuation"""
    trees: Literal["frequency", "recent"] = "frequency"
    """trees: the best-scoring nodes of the longest match's continuations, or (recent, prompt lookup's rule) the
    first `total` nodes of the trie of the top_k distinct continuations of the newest occurrences of every match
    length, the longest first (`continuations`), never cut by the verify cost nor learned from"""
    max_occurrences: int = 64
    """continuations counted per draft: those of the most recent occurrences of the longest match"""
    adaptive: bool = True
    """cut each draft to the size with the most expected tokens per unit of measured verify cost"""
    cache_tokens: int = 0
    """cross-request cache of earlier requests' outputs, at most this many tokens (0 = off)"""
    cache_file: str | None = None
    """keep the cross-request cache in this file: read at start, rewritten atomically after every request"""

    def validate(self) -> None:
        """Reject empty ranges and negative sizes."""
        if not 1 <= self.min_match <= self.max_match:
            raise DraftsmithError(f"suffix drafting needs 1 <= min_match <= max_match, got {self.min_match}, "
                                  f"{self.max_match}.")
        if {self.choose, self.trees} - {"frequency", "recent"} or self.max_occurrences < 1 or self.cache_tokens < 0:
            raise DraftsmithError("suffix drafting needs choose and trees 'frequency' or 'recent', max_occurrences "
                                  f">= 1 and cache_tokens >= 0; got {self.choose!r}, {self.trees!r}, "
                                  f"{self.max_occurrences}, {self.cache_tokens}.")
        if self.cache_file and not self.cache_tokens:
            raise DraftsmithError("suffix drafting: cache_file needs a cross-request cache (cache_tokens > 0).")


# --------------------------------------------------------------------------- candidates
@dataclass
class Candidates:
    """Drafted nodes of one pass: tokens, parents (-1 = root; parents first) and scores, each the estimated chance
    that the target accepts the path to the node (non-increasing along every path)."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]
    tree: bool = False  # a tree draft even where the nodes form one path (prompt lookup's trees)

    def draft(self) -> Draft:
        """As a Draft: a chain when the nodes form one path, else a tree; q one-hot either way (probs None)."""
        tokens = torch.tensor(self.tokens, dtype=torch.long)
        if not self.tree and all(parent == node - 1 for node, parent in enumerate(self.parents)):
            return Draft(tokens)
        return Draft(tokens, torch.tensor(self.parents, dtype=torch.long))


class Trie:
    """Continuations merged into a trie: per node its token, parent (-1 = root), depth (1 below the root) and the
    number of rows through it; parents come first, siblings in order of first appearance (most recent first)."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = len(rows)
        self.tokens, self.parents, self.depths, self.counts = [], [], [], []
        self.children: dict[int, list[int]] = {}
        index: dict[tuple[int, int], int] = {}
        for row in rows:
            parent = -1
            for token in row:
                node = index.get((parent, token))
                if node is None:
                    node = index[(parent, token)] = len(self.tokens)
                    self.tokens.append(token)
                    self.parents.append(parent)
                    self.depths.append(self.depths[parent] + 1 if parent >= 0 else 1)
                    self.counts.append(0)
                    self.children.setdefault(parent, []).append(node)
                self.counts[node] += 1
                parent = node

    def share(self, node: int) -> float:
        """Rows through `node` per row through its parent: the empirical chance of its token there."""
        parent = self.parents[node]
        return self.counts[node] / (self.counts[parent] if parent >= 0 else self.rows)

    def score(self, node: int, rate: float) -> float:
        """rate^depth x the share of all rows through `node`: the estimated chance its path is accepted."""
        return rate ** self.depths[node] * self.counts[node] / self.rows

    def best_path(self, depth: int) -> list[int]:
        """The most frequent child at each step (ties: the most recent), at most `depth` nodes."""
        path: list[int] = []
        while len(path) < depth and (options := self.children.get(path[-1] if path else -1)):
            path.append(max(options, key=lambda n: (self.counts[n], -n)))
        return path

    def best_nodes(self, rate: float, depth: int, top_k: int, total: int) -> list[int]:
        """The best-scoring nodes, at most `depth` deep, `top_k` siblings and `total` in all; parents first."""
        order = sorted(range(len(self.tokens)), key=lambda n: (-self.score(n, rate), self.depths[n], n))
        kept, chosen, children = [], set(), Counter()
        for node in order:  # scores never grow along a path and ties go to the shallower: parents come first
            parent = self.parents[node]
            if len(kept) == total:
                break
            if self.depths[node] <= depth and (parent < 0 or parent in chosen) and children[parent] < top_k:
                children[parent] += 1
                chosen.add(node)
                kept.append(node)
        return kept


def _match_class(length: int) -> int:
    """Acceptance is learned per match length 1, 2, 3, then per power-of-two band (4-7, 8-15, ...)."""
    return length if length < 4 else 1 << (length.bit_length() - 1)


class SuffixProposer(LearnsFromDrafts, Proposer):
    """The Proposer: suffix matches in the current request and the cross-request cache.

    `verify_cost` maps n (tokens in one target pass) to its cost (see `calibrate`); `tokenizer_id` names the
    tokenizer the cache file's ids belong to (a file written for another one is ignored)."""

    def __init__(self, config: Config | None = None, verify_cost: dict[int, float] | None = None,
                 tokenizer_id: str | None = None):
        self.config = config or Config()
        self.config.validate()
        self.verify_cost, self.tokenizer_id = verify_cost, tokenizer_id
        self.cache = None
        if self.config.cache_tokens:
            self.cache = (DocumentCache.load(self.config.cache_file, self.config.cache_tokens, tokenizer_id)
                          if self.config.cache_file else DocumentCache(self.config.cache_tokens))
        self.counts: dict[tuple[int, bool], list[float]] = {}  # (match class, last draft whole) -> [hits, expected]
        self.live, self.prompt_length = TokenStore(), 0
        self.reset()

    def reset(self) -> None:
        """Start a new request: the last one's output goes into the cache (and its file); acceptance counts stay."""
        if self.cache is not None and self.live.length > self.prompt_length:
            self.cache.add(self.live.tokens[self.prompt_length :].tolist())
            if self.config.cache_file:
                self.cache.save(self.config.cache_file, self.tokenizer_id)
        self.live, self.prompt_length = TokenStore(), 0
        self.last_draft = None  # its best path, noted with (the shares of its nodes, its acceptance class)
        self.last_full = False

    def describe(self) -> dict:
        """Kind, options, cache size and learned acceptance, for reports."""
        rates = {f"match {'>=' if n >= 4 else ''}{n}, after full accept={full}": round(h / max(e, 1e-9), 3)
                 for (n, full), (h, e) in sorted(self.counts.items())}
        cache = self.cache and self.cache.describe()
        adaptive = self.config.adaptive and self.verify_cost is not None
        return {"kind": "suffix", **vars(self.config), "adaptive": adaptive, "acceptance_by_match": rates, "cache": cache}

    def _index(self, tokens: torch.Tensor) -> np.ndarray:
        """Index the committed `tokens` [T] in the live store (what is new since the last call); them as an array."""
        context = tokens.numpy().astype(np.int64, copy=False)
        known = self.live.length
        if context.size < known or not np.array_equal(context[:known], self.live.tokens):
            self.live, known = TokenStore(), 0  # another sequence without reset(): start over
        self.live.extend(context[known:])
        return context

    def _matches(self, context: np.ndarray) -> list[tuple[TokenStore, np.ndarray, np.ndarray]]:
        """(store, continuation starts, match lengths) in the current request, then in the cache."""
        stores = [self.live] + ([] if self.cache is None else [self.cache.store])
        return [(store, *store.matches(context, self.config.max_match)) for store in stores]

    def match(self, tokens: torch.Tensor, depth: int) -> tuple[int, list[list[int]]] | None:
        """Index the committed `tokens` [T]; (length of the longest recurring suffix, up to `depth` tokens that
        followed each of its occurrences, most recent first: the current request's before the cache's), or None
        where the longest is shorter than min_match."""
        found = self._matches(self._index(tokens))
        longest = max((int(lengths.max()) for _, _, lengths in found if lengths.size), default=0)
        if longest < self.config.min_match:
            return None
        rows = []
        for store, starts, lengths in found:  # the current request first: the most recent text
            newest = np.sort(starts[lengths == longest])[::-1][: self.config.max_occurrences - len(rows)].tolist()
            rows += [store.continuation(start, depth) for start in newest]
            if store is not self.live:
                self.cache.touch(newest)  # drafted from: recently used
        return longest, rows

    def continuations(self, tokens: torch.Tensor, depth: int, limit: int) -> list[tuple[int, torch.Tensor]]:
        """Prompt lookup's search (`trees="recent"`): up to `limit` distinct (n, continuation of at most `depth`
        tokens) of earlier occurrences of the last n committed `tokens` [T], n from max_match down to min_match; per
        n those with `depth` tokens after them from the most recent back, then the shorter ones, longest first (the
        current request's before the cache's)."""
        found, seen, cached = [], set(), []
        stores = self._matches(self._index(tokens))
        for n in range(self.config.max_match, self.config.min_match - 1, -1):
            for store, starts, lengths in stores:
                for row, start in _newest_first(store, starts[lengths >= n], depth):
                    if tuple(row) in seen:
                        continue
                    seen.add(tuple(row))
                    found.append((n, torch.tensor(row, dtype=torch.long)))
                    cached += [start] if store is not self.live else []
                    if len(found) >= limit:
                        break
                if len(found) >= limit:
                    break
            if len(found) >= limit:
                break
        if cached:
            self.cache.touch(cached)  # drafted from: recently used
        return found

    def candidates(self, state: DecodeState, shape: DraftShape) -> Candidates:
        """This pass's scored nodes: a chain for chain shapes, else a tree; cut to what pays for its verify cost."""
        tokens = state.tokens[0].cpu()
        self.prompt_length = state.prompt_length
        self._learn(tokens)
        depth, budget = (shape.length, shape.length) if shape.tree is None else (shape.tree[0], shape.tree[2])
        recent_tree = shape.tree is not None and self.config.trees == "recent"
        if recent_tree:
            rows = self.continuations(tokens, depth, shape.tree[1])
            found = (rows[0][0], [row.tolist() for _, row in rows]) if rows else None
        else:
            found = self.match(tokens, depth)
        if found is None or depth < 1 or budget < 1:
            return Candidates([], [], [], tree=recent_tree)
        length, continuations = found
        key = (_match_class(length), self.last_full)
        hits, expected = self.counts.get(key, (0.0, 0.0))
        rate = min(1.0, (hits + 3) / (expected + 4))  # an optimistic start: 3 of 4
        if shape.tree is None and self.config.choose == "recent":  # prompt lookup's rule: one occurrence is
            # followed (the newest with the longest continuation), so no frequencies; lengths up to the full k
            trie = Trie([max(continuations, key=lambda row: min(len(row), depth))])
            kept = trie.best_path(depth)
            scores, shares = [rate ** (i + 1) for i in range(depth)], [1.0] * len(kept)
        else:
            trie = Trie(continuations)
            if shape.tree is None:
                kept = trie.best_path(depth)
            else:  # recent: the nodes in the order the continuations made them, as prompt lookup merged them
                kept = list(range(min(budget, len(trie.tokens)))) if recent_tree else trie.best_nodes(rate, *shape.tree)
            scores, shares = [trie.score(n, rate) for n in kept], [trie.share(n) for n in kept]
        if self.config.adaptive and calibrated(self.verify_cost, budget) and not recent_tree:
            kept = kept[: best_length(scores, self.verify_cost)]
        renumber = {node: i for i, node in enumerate(kept)}
        result = Candidates([trie.tokens[n] for n in kept], [renumber.get(trie.parents[n], -1) for n in kept],
                            scores[: len(kept)], tree=recent_tree)
        main = [0] if kept else []  # the best path (each node's first, best-scoring child): where acceptance is learned
        while main and (child := next((i for i, p in enumerate(result.parents) if p == main[-1]), None)) is not None:
            main.append(child)
        if main and not recent_tree:  # prompt lookup's trees teach nothing (a chain's rate is what they read)
            self.remember_draft(tokens.numel(), [result.tokens[i] for i in main], note=([shares[i] for i in main], key))
        return result

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain or, with `shape.tree`, a tree of suffix continuations (possibly empty: a plain step)."""
        return self.candidates(state, shape).draft()

    def _learn(self, tokens: torch.Tensor) -> None:
        """Score the previous draft's best path against the committed tokens: hits against expected hits."""
        settled = self.settle_last_draft(tokens)
        if settled is None:
            return
        hits, offered, path = settled
        shares, key = path.note
        counts = self.counts.setdefault(key, [0.0, 0.0])
        counts[0] += hits
        counts[1] += sum(shares[:offered])  # what the frequencies expected up to the first miss
        self.last_full = hits == len(path.tokens)


def _newest_first(store: TokenStore, starts: np.ndarray, depth: int):
    """(continuation of at most `depth` tokens, start) from `starts`: the whole ones from the most recent back, then
    the shorter ones, longest first; lazily, as a search that stops early reads only the most recent."""
    short = []
    for start in np.sort(starts)[::-1].tolist():
        row = store.continuation(start, depth)
        if len(row) < depth:
            short.append((row, start))
        else:
            yield row, start
    yield from sorted(short, key=lambda pair: len(pair[0]), reverse=True)


def load_proposer(config: Config | None = None, target=None) -> SuffixProposer:
    """The suffix proposer; with `target`, its cache file is tied to the target's tokenizer."""
    tokenizer_id = target.fingerprint().get("tokenizer_sha256") if target is not None else None
    return SuffixProposer(config, tokenizer_id=tokenizer_id)
