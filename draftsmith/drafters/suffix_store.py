"""Where a suffix of the context recurs, for suffix drafting (`draftsmith.drafters.suffix`): token ids in one
growing array that also lists, per id, its positions (`TokenStore`), and the cross-request cache of earlier requests'
outputs (`DocumentCache`), kept in a file that a crash or another tokenizer cannot corrupt.

Matching. The last token's positions are the candidate occurrences; one vectorised comparison per extra token walks
them backwards to their match lengths. Memory is O(tokens), where a depth-D suffix tree holds O(tokens x D) nodes
(kilobytes per token as Python objects).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np

from draftsmith.files import write_atomically

SEPARATOR = -1  # ends every cached document: no match or continuation runs across it


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
