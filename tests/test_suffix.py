"""Suffix drafting: the index against a brute-force search, frequency scoring (prompt lookup, its preset, is tested in
test_prompt_lookup.py), the cross-request cache's bound, its file (round trip, torn files, crash during a write), exact decoding."""

import os

import pytest
import torch

from draftsmith.drafters import DecodeState, DraftShape, Sampling
from draftsmith.drafters.suffix import Config, DocumentCache, SuffixProposer, Trie
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate

CPU_LIKE = {1: 1.0, **{n: 1.5 for n in range(2, 12)}}


def state(tokens, prompt_length=0):
    return DecodeState(torch.tensor([tokens]), prompt_length=prompt_length)


# --------------------------------------------------------------------------- the index
def brute_force_match(live, documents, max_match, min_match, depth, limit):
    """Scan every position of the request and of every cached document (newest first) for the longest suffix of
    `live` that recurs with something after it; (length, continuations most recent first) or None."""
    found = []  # (match length, continuation), most recent first
    for source, is_live in [(live, True)] + [(d, False) for d in reversed(documents)]:
        for p in range(len(source) - 1, 0, -1):  # continuation start: something follows
            length = 0
            while (length < min(max_match, p, len(live))
                   and source[p - length - 1] == live[len(live) - length - 1]):
                length += 1
            if length:
                found.append((length, source[p : p + depth]))
    longest = max((length for length, _ in found), default=0)
    if longest < min_match:
        return None
    return longest, [row for length, row in found if length == longest][:limit]


@pytest.mark.parametrize("max_match, min_match, vocab", [(6, 1, 3), (3, 2, 5), (16, 1, 2)])
def test_index_finds_what_a_full_scan_finds(max_match, min_match, vocab):
    generator = torch.Generator().manual_seed(max_match)
    documents = [torch.randint(0, vocab, (int(n),), generator=generator).tolist() for n in (7, 30, 1, 12)]
    proposer = SuffixProposer(Config(max_match=max_match, min_match=min_match, max_occurrences=9, cache_tokens=500))
    for document in documents:
        proposer.cache.add(document)
    for sequence in range(2):  # the second arrives without reset(): the index must start over
        tokens = torch.randint(0, vocab, (2,), generator=generator)
        while tokens.numel() < 80:
            for depth in (1, 4):
                match = proposer.match(tokens, depth)
                expected = brute_force_match(tokens.tolist(), documents, max_match, min_match, depth, 9)
                assert match == expected
            grow = int(torch.randint(1, 5, (1,), generator=generator))
            tokens = torch.cat([tokens, torch.randint(0, vocab, (grow,), generator=generator)])
    assert proposer.live.length == proposer.live.tokens.size <= 80 + 4


def test_trie_counts_every_prefix():
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 3, (int(torch.randint(1, 5, (1,), generator=generator)),), generator=generator).tolist()
            for _ in range(40)]
    trie = Trie(rows)
    tokens, parents, counts = trie.tokens, trie.parents, trie.counts
    paths = []
    for node in range(len(tokens)):
        assert parents[node] < node
        paths.append((paths[parents[node]] if parents[node] >= 0 else ()) + (tokens[node],))
        assert trie.depths[node] == len(paths[-1])
    assert len(set(paths)) == len(paths)  # one node per distinct prefix
    brute = {}
    for row in rows:
        for end in range(1, len(row) + 1):
            brute[tuple(row[:end])] = brute.get(tuple(row[:end]), 0) + 1
    assert dict(zip(paths, counts)) == brute


def test_the_most_frequent_continuation_beats_the_most_recent():
    tokens = [5, 1, 7, 5, 1, 7, 5, 1, 8, 5, 1]  # "5 1" was followed by 7 twice, most recently by 8
    assert SuffixProposer().propose(state(tokens), DraftShape(2), Sampling()).tokens.tolist() == [7, 5]
    recent = SuffixProposer(Config(choose="recent")).propose(state(tokens), DraftShape(2), Sampling())
    assert recent.tokens.tolist() == [8, 5]
    found = SuffixProposer().candidates(state(tokens), DraftShape(tree=(2, 2, 10)))
    assert found.tokens == [7, 5, 8, 5] and found.parents == [-1, 0, -1, 2]
    # score = 0.75^depth x the share of the three occurrences that continue this way
    assert found.scores == pytest.approx([0.75 * 2 / 3, 0.75**2 * 2 / 3, 0.75 / 3, 0.75**2 / 3])
    assert len(SuffixProposer().candidates(state(tokens), DraftShape(tree=(2, 1, 10))).tokens) == 2  # top_k 1


def test_bad_configs():
    with pytest.raises(DraftsmithError, match="min_match"):
        SuffixProposer(Config(max_match=2, min_match=3))
    with pytest.raises(DraftsmithError, match="cache_tokens"):
        SuffixProposer(Config(cache_file="x.cache"))


# --------------------------------------------------------------------------- the cross-request cache
def test_eviction_keeps_the_bound_and_the_recently_used():
    generator = torch.Generator().manual_seed(2)
    cache = DocumentCache(bound=100)
    added = 0
    for _ in range(60):
        size = int(torch.randint(1, 45, (1,), generator=generator))
        cache.add(torch.randint(0, 50, (size,), generator=generator).tolist())
        added += size
        assert cache.total <= 100
        # the store holds exactly the kept documents, each followed by a separator, and lists every position
        assert cache.store.tokens.tolist() == [t for d in cache.documents for t in d + [-1]]
        assert sum(len(p) for p in cache.store.where.values()) == cache.total
    assert cache.total > 100 * 7 // 8 - 45  # eviction stops at 7/8 of the bound
    report = cache.describe()  # what reports show: the bound kept, the tokens taken in, the documents let go
    assert report["tokens"] == cache.total and report["bound_tokens"] == 100 and report["added_tokens"] == added
    assert cache.total <= report["peak_tokens"] <= 100 and report["evicted_documents"] == 60 - len(cache.documents)
    cache.add([1] * 150)  # longer than the bound: its last 100 tokens
    assert cache.documents == [[1] * 100]

    cache = DocumentCache(bound=80)
    for first in (10, 20, 30, 40):
        cache.add([first] * 20)
    cache.touch([0])  # drafting from the oldest document makes it the most recently used
    cache.add([50] * 20)  # evicts the least recently used until 7/8 of the bound holds the new one
    assert [d[0] for d in cache.documents] == [10, 40, 50]


def run_request(proposer, prompt, output):
    """What the decoder does: reset, then drafts while the output grows."""
    proposer.reset()
    for end in range(1, len(output) + 1):
        proposer.propose(state(prompt + output[:end], len(prompt)), DraftShape(3), Sampling())


def test_the_cache_file_round_trips(tmp_path):
    path = tmp_path / "suffix.cache"
    config = Config(cache_tokens=200, cache_file=str(path))
    first = SuffixProposer(config, tokenizer_id="tok-a")
    for request in range(4):
        run_request(first, [9, 9, request], [request, 1, 2, 3, 4, 5, 6, 7])
    first.reset()  # the last request goes into the cache and the file too
    second = SuffixProposer(config, tokenizer_id="tok-a")
    assert second.cache.documents == first.cache.documents and second.cache.used == first.cache.used
    assert len(second.cache.documents) == 4
    query = torch.tensor([8, 8, 1, 2])
    assert second.match(query, 4) == first.match(query, 4)
    # what earlier requests wrote is drafted in a new one
    assert second.propose(state([3, 1, 2], 1), DraftShape(3), Sampling()).tokens.tolist() == [3, 4, 5]


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "garbage", "empty", "other tokenizer"])
def test_a_torn_or_foreign_file_is_ignored_with_a_warning(tmp_path, damage):
    path = tmp_path / "suffix.cache"
    config = Config(cache_tokens=200, cache_file=str(path))
    writer = SuffixProposer(config, tokenizer_id="tok-a")
    run_request(writer, [1], [2, 3, 4, 5, 6])
    writer.reset()
    blob = path.read_bytes()
    damaged = {"truncated": blob[: len(blob) - 7], "flipped byte": blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:],
               "garbage": os.urandom(300), "empty": b"", "other tokenizer": blob}[damage]
    path.write_bytes(damaged)
    with pytest.warns(RuntimeWarning, match="Ignoring the suffix cache file"):
        reader = SuffixProposer(config, tokenizer_id="tok-b" if damage == "other tokenizer" else "tok-a")
    assert reader.cache.documents == [] and reader.cache.total == 0
    run_request(reader, [1], [7, 8, 9])
    reader.reset()  # the next request's write replaces the bad file with a good one
    assert SuffixProposer(config, tokenizer_id=reader.tokenizer_id).cache.documents == [[7, 8, 9]]


def test_a_crash_during_a_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "suffix.cache"
    config = Config(cache_tokens=200, cache_file=str(path))
    proposer = SuffixProposer(config)
    run_request(proposer, [1], [2, 3, 4])
    proposer.reset()
    before = path.read_bytes()

    def crash(*args):
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    run_request(proposer, [1], [5, 6, 7])
    with pytest.raises(OSError, match="killed"):
        proposer.reset()
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert SuffixProposer(config).cache.documents == [[2, 3, 4]]


# --------------------------------------------------------------------------- through the decoder
@pytest.mark.parametrize("shape", [DraftShape(5), DraftShape(tree=(4, 3, 12))], ids=["chain", "tree"])
def test_decoding_is_exact_and_the_cache_helps_a_repeated_request(tiny_qwen3, shape):
    prompt = torch.tensor([[257, 40, 41, 42, 43, 40, 41, 42, 44, 40, 41]])
    plain = plain_generate(tiny_qwen3, prompt, Sampling(), 40, eos=set()).tokens
    proposer = SuffixProposer(Config(cache_tokens=1000), verify_cost=CPU_LIKE)
    runs = [speculative_generate(tiny_qwen3, proposer, prompt, shape, Sampling(), 40, eos=set()) for _ in range(2)]
    assert all(run.tokens == plain for run in runs)
    first, again = (len(run.tokens) / len(run.cycles) for run in runs)
    assert again > first + 1, "the first request's output, cached, should be drafted back almost whole"
