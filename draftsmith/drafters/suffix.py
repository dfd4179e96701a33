"""Suffix drafting (SuffixDecoding-style): continue the longest recurring suffix of the context with what most
often followed it, in the current request and, optionally, in earlier requests' outputs. Training-free.

Matching. The request's committed tokens and the cached outputs sit in token arrays that also list, per token id,
its positions. The last token's positions are the candidate occurrences; one vectorised comparison per extra token
walks them backwards to their match lengths (at most `max_match`), and the `max_occurrences` most recent
occurrences of the longest match give the continuations. Memory is O(tokens), where a depth-D suffix tree holds
O(tokens x D) nodes (kilobytes per token as Python objects).

Scoring. The continuations form a trie with counts. A node's score estimates the chance the target accepts the
path to it: a^depth x count(node) / occurrences, where a is the learned per-token acceptance of drafts from
matches of that length (and "was the previous draft fully accepted"), read off the committed tokens as prompt
lookup does, from an optimistic 3 of 4. A chain is the most frequent path; a tree the best-scoring nodes. With a
measured verify-cost curve a draft is cut to the size with the most expected tokens per unit of cost,
(1 + sum of kept scores) / t(kept + 1) (`cost.best_length`); none at all is a plain step. Drafts are point masses
(q one-hot, `Draft.probs` None), so verification stays exact.

Prompt lookup is one configuration: `Config(max_match=3, min_match=1, choose="recent")` drafts the chains of
`prompt_lookup.PromptLookup()`, adaptive lengths included. Trees differ (prompt lookup's merge distinct
continuations of several n-gram lengths; these count those of the longest match).

Cross-request cache: earlier outputs, at most `cache_tokens` tokens, the least recently used (added or drafted
from) evicted first; per process. With `cache_file` it is read at start and rewritten after every request through
a temporary file, fsync and rename, so a crash leaves the old file or the new one; a file torn anyway (truncated,
overwritten) or written for another tokenizer fails its checksum or checks and is ignored with a warning.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from draftsmith.cost import best_length, calibrated, measure
from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomically

SEPARATOR = -1  # ends every cached document: no match or continuation runs across it


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
        if self.choose not in ("frequency", "recent") or self.max_occurrences < 1 or self.cache_tokens < 0:
            raise DraftsmithError("suffix drafting needs choose 'frequency' or 'recent', max_occurrences >= 1 and "
                                  f"cache_tokens >= 0; got {self.choose!r}, {self.max_occurrences}, "
                                  f"{self.cache_tokens}.")
        if self.cache_file and not self.cache_tokens:
            raise DraftsmithError("suffix drafting: cache_file needs a cross-request cache (cache_tokens > 0).")


# --------------------------------------------------------------------------- where the suffix recurs
class TokenStore:
    """Token ids in one growing array, and the positions of each id: what suffix matches are searched in."""

    def __init__(self) -> None:
        self.buffer = np.empty(256, dtype=np.int64)
        self.length = 0
        self.where: dict[int, list[int]] = {}

    @property
    def tokens(self) -> np.ndarray:
        return self.buffer[: self.length]

    def extend(self, new) -> None:
        """Append ids (amortised O(new): the array doubles when full); SEPARATOR is stored, never listed."""
        new = np.asarray(new, dtype=np.int64)
        if self.length + new.size > self.buffer.size:
            grown = np.empty(max(2 * self.buffer.size, self.length + new.size), dtype=np.int64)
            grown[: self.length] = self.tokens
            self.buffer = grown
        self.buffer[self.length : self.length + new.size] = new
        for position, token in enumerate(new.tolist(), start=self.length):
            if token != SEPARATOR:
                self.where.setdefault(token, []).append(position)
        self.length += new.size

    def matches(self, context: np.ndarray, longest: int) -> tuple[np.ndarray, np.ndarray]:
        """(continuation start p, match length) of every occurrence of the context's last token that something
        follows; the length counts how many of the context's last tokens precede p (at most `longest`)."""
        listed = self.where.get(int(context[-1]))
        if not listed:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        starts = np.asarray(listed, dtype=np.int64) + 1
        starts = starts[starts < self.length]  # the context's own suffix has nothing after it
        starts = starts[self.buffer[starts] != SEPARATOR]
        lengths, alive = np.ones(starts.size, dtype=np.int64), np.ones(starts.size, dtype=bool)
        for back in range(2, min(longest, context.size) + 1):  # one vectorised step per extra matched token
            before = starts - back
            alive &= (before >= 0) & (self.buffer[np.maximum(before, 0)] == context[-back])
            if not alive.any():
                break
            lengths += alive
        return starts, lengths

    def continuation(self, start: int, depth: int) -> list[int]:
        """Up to `depth` tokens from `start`, stopping at a document's end."""
        row = self.buffer[start : min(self.length, start + depth)].tolist()
        return row[: row.index(SEPARATOR)] if SEPARATOR in row else row


class DocumentCache:
    """Earlier requests' outputs (documents), at most `bound` tokens in all, in one TokenStore.

    `used[i]` is the clock at which document i was added or last drafted from. A document that does not fit evicts
    the least recently used down to 7/8 of the bound, so the O(bound) rebuild of the store is paid once per bound/8
    new tokens rather than once per request."""

    MAGIC = b"draftsmith suffix cache v1\n"

    def __init__(self, bound: int) -> None:
        self.bound, self.clock = bound, 0
        self.documents: list[list[int]] = []
        self.used: list[int] = []
        self.added_tokens = self.evicted_documents = self.peak_tokens = 0  # for reports: what the bound did
        self._rebuild()

    @property
    def total(self) -> int:
        """Tokens held (separators not counted)."""
        return self.store.length - len(self.documents)

    def _rebuild(self) -> None:
        self.store, self.starts = TokenStore(), []
        for document in self.documents:
            self.starts.append(self.store.length)
            self.store.extend(document + [SEPARATOR])

    def add(self, document: list[int]) -> None:
        """Remember one output (its last `bound` tokens when longer), evicting as the bound requires."""
        document = list(document)[-self.bound :] if self.bound else []
        if not document:
            return
        self.clock += 1
        if self.total + len(document) > self.bound:
            limit, total = max(self.bound - self.bound // 8 - len(document), 0), self.total
            kept = sorted(range(len(self.documents)), key=lambda i: (self.used[i], i))  # least recently used first
            while total > limit:
                total -= len(self.documents[kept.pop(0)])
                self.evicted_documents += 1
            kept.sort()
            self.documents, self.used = [self.documents[i] for i in kept], [self.used[i] for i in kept]
            self._rebuild()
        self.documents.append(document)
        self.used.append(self.clock)
        self.starts.append(self.store.length)
        self.store.extend(document + [SEPARATOR])
        self.added_tokens += len(document)
        self.peak_tokens = max(self.peak_tokens, self.total)

    def describe(self) -> dict:
        """What the cache holds against its bound, and what it took in and evicted, for reports."""
        return {"documents": len(self.documents), "tokens": self.total, "bound_tokens": self.bound,
                "peak_tokens": self.peak_tokens, "added_tokens": self.added_tokens,
                "evicted_documents": self.evicted_documents}

    def touch(self, positions: list[int]) -> None:
        """Mark the documents holding these store positions as just used."""
        for index in set((np.searchsorted(self.starts, positions, side="right") - 1).tolist()):
            self.used[index] = self.clock

    def save(self, path: str | Path, tokenizer_id: str | None = None) -> None:
        """Write the cache so that a crash leaves the old file or the new one: header, checksum, JSON payload."""
        payload = json.dumps({"tokenizer": tokenizer_id, "clock": self.clock, "documents": self.documents,
                              "used": self.used}, separators=(",", ":")).encode()
        header = f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode()
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # e.g. inside an eval --out not written yet
        write_atomically(path, self.MAGIC + header + payload)

    @classmethod
    def load(cls, path: str | Path, bound: int, tokenizer_id: str | None = None) -> DocumentCache:
        """The cache in `path` (empty when there is none); a torn, corrupt or foreign file is ignored with a warning."""
        cache = cls(bound)
        try:
            data = _read_cache_file(Path(path).read_bytes(), tokenizer_id)
        except FileNotFoundError:
            return cache
        except (OSError, ValueError, KeyError, TypeError) as err:  # JSON and decoding errors are ValueErrors
            warnings.warn(f"Ignoring the suffix cache file '{path}' ({err}); starting with an empty cache.",
                          RuntimeWarning, stacklevel=2)
            return cache
        for document, used in zip(data["documents"], data["used"]):  # in the order they were added
            cache.clock = used - 1  # so that add() gives it back its own stamp (a smaller bound evicts by them)
            cache.add(document)
        cache.clock = max(data["clock"], cache.clock)
        return cache


def _read_cache_file(blob: bytes, tokenizer_id: str | None) -> dict:
    """The checked payload of a cache file; ValueError saying what is wrong with it."""
    if not blob.startswith(DocumentCache.MAGIC):
        raise ValueError("not a draftsmith suffix cache: wrong header")
    header, _, payload = blob[len(DocumentCache.MAGIC):].partition(b"\n")
    digest, _, size = header.decode("ascii").partition(" ")
    if not size.isdigit() or int(size) != len(payload):
        raise ValueError(f"{len(payload)} payload bytes where {size or '?'} were written: torn")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("checksum mismatch: torn or corrupted")
    data = json.loads(payload)
    documents, used = data["documents"], data["used"]
    lists = isinstance(documents, list) and isinstance(used, list) and len(documents) == len(used)
    if not lists or any(not isinstance(d, list) or any(type(t) is not int or t < 0 for t in d) for d in documents) \
            or any(type(u) is not int for u in used) or type(data["clock"]) is not int:
        raise ValueError("malformed contents")
    if tokenizer_id is not None and data.get("tokenizer") not in (None, tokenizer_id):
        raise ValueError("written for another tokenizer: its token ids mean other tokens")
    return data


# --------------------------------------------------------------------------- candidates
@dataclass
class Candidates:
    """Drafted nodes of one pass: tokens, parents (-1 = root; parents first) and scores, each the estimated chance
    that the target accepts the path to the node (non-increasing along every path)."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]

    def draft(self) -> Draft:
        """As a Draft: a chain when the nodes form one path, else a tree; q one-hot either way (probs None)."""
        tokens = torch.tensor(self.tokens, dtype=torch.long)
        if all(parent == node - 1 for node, parent in enumerate(self.parents)):
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


class SuffixProposer:
    """The Proposer: suffix matches in the current request and the cross-request cache.

    `verify_cost` maps n (tokens in one target pass) to its cost (see `calibrate`); `tokenizer_id` names the
    tokenizer the cache file's ids belong to (a file written for another one is ignored)."""

    required_layers: list[int] = []

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
        self.pending: tuple[int, list[int], list[float], tuple[int, bool]] | None = None
        self.last_full = False

    def calibrate(self, target, max_length: int, context_tokens: int = 256) -> dict[int, float]:
        """Measure t(n) for n = 1 .. max_length + 1 on `target` (a few seconds); adaptive drafts use it."""
        self.verify_cost = measure(target, max_length, context_tokens)
        return self.verify_cost

    def describe(self) -> dict:
        """Kind, options, cache size and learned acceptance, for reports."""
        rates = {f"match {'>=' if n >= 4 else ''}{n}, after full accept={full}": round(h / max(e, 1e-9), 3)
                 for (n, full), (h, e) in sorted(self.counts.items())}
        cache = self.cache and self.cache.describe()
        adaptive = self.config.adaptive and self.verify_cost is not None
        return {"kind": "suffix", **vars(self.config), "adaptive": adaptive, "acceptance_by_match": rates, "cache": cache}

    def match(self, tokens: torch.Tensor, depth: int) -> tuple[int, list[list[int]]] | None:
        """Index the committed `tokens` [T]; (length of the longest recurring suffix, up to `depth` tokens that
        followed each of its occurrences, most recent first: the current request's before the cache's), or None
        where the longest is shorter than min_match."""
        context = tokens.numpy().astype(np.int64, copy=False)
        known = self.live.length
        if context.size < known or not np.array_equal(context[:known], self.live.tokens):
            self.live, known = TokenStore(), 0  # another sequence without reset(): start over
        self.live.extend(context[known:])
        found = [(self.live, *self.live.matches(context, self.config.max_match))]
        if self.cache is not None:
            found.append((self.cache.store, *self.cache.store.matches(context, self.config.max_match)))
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

    def candidates(self, state: DecodeState, shape: DraftShape) -> Candidates:
        """This pass's scored nodes: a chain for chain shapes, else a tree; cut to what pays for its verify cost."""
        tokens = state.tokens[0].cpu()
        self.prompt_length = state.prompt_length
        self._learn(tokens.tolist())
        depth, budget = (shape.length, shape.length) if shape.tree is None else (shape.tree[0], shape.tree[2])
        found = self.match(tokens, depth)
        if found is None or depth < 1 or budget < 1:
            return Candidates([], [], [])
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
            kept = trie.best_path(depth) if shape.tree is None else trie.best_nodes(rate, *shape.tree)
            scores, shares = [trie.score(n, rate) for n in kept], [trie.share(n) for n in kept]
        if self.config.adaptive and calibrated(self.verify_cost, budget):
            kept = kept[: best_length(scores, self.verify_cost)]
        renumber = {node: i for i, node in enumerate(kept)}
        result = Candidates([trie.tokens[n] for n in kept], [renumber.get(trie.parents[n], -1) for n in kept],
                            scores[: len(kept)])
        main = [0] if kept else []  # the best path (each node's first, best-scoring child): where acceptance is learned
        while main and (child := next((i for i, p in enumerate(result.parents) if p == main[-1]), None)) is not None:
            main.append(child)
        if main:
            self.pending = (tokens.numel(), [result.tokens[i] for i in main], [shares[i] for i in main], key)
        return result

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain or, with `shape.tree`, a tree of suffix continuations (possibly empty: a plain step)."""
        return self.candidates(state, shape).draft()

    def _learn(self, tokens: list[int]) -> None:
        """Score the previous draft's best path against the committed tokens: hits against expected hits."""
        if self.pending is None:
            return
        at, path, shares, key = self.pending
        self.pending = None
        committed = tokens[at : at + len(path)]
        hits = next((i for i, (a, b) in enumerate(zip(path, committed)) if a != b), len(committed))
        counts = self.counts.setdefault(key, [0.0, 0.0])
        counts[0] += hits
        counts[1] += sum(shares[: min(len(path), hits + 1)])  # what the frequencies expected up to the first miss
        self.last_full = hits == len(path)


def load_proposer(config: Config | None = None, target=None) -> SuffixProposer:
    """The suffix proposer; with `target`, its cache file is tied to the target's tokenizer."""
    tokenizer_id = target.fingerprint().get("tokenizer_sha256") if target is not None else None
    return SuffixProposer(config, tokenizer_id=tokenizer_id)
