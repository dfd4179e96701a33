"""Prompt lookup, the suffix drafter's preset: which match it copies, tree drafts as tries, adaptive lengths (against
a brute-force prompt lookup), exactness through the decoder."""

import pytest
import torch

from draftsmith.drafters import DecodeState, DraftShape, Sampling
from draftsmith.drafters.prompt_lookup import Config, PromptLookup
from draftsmith.drafters.suffix import Config as SuffixConfig
from draftsmith.errors import DraftsmithError
from draftsmith.cost import best_length, verify_cost_curve
from draftsmith.eval.decoder import plain_generate, speculative_generate


def state(tokens):
    return DecodeState(torch.tensor([tokens]))


def test_copies_what_followed_the_longest_most_recent_match():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 2, 3]
    draft = PromptLookup().propose(state(tokens), DraftShape(3), Sampling())
    assert draft.tokens.tolist() == [7, 8, 6]  # "2 3" last seen at 6..7 (the 3-gram "6 2 3" never)
    assert draft.parents is None and draft.probs is None


def test_prefers_a_full_length_continuation_and_falls_back_to_shorter_ngrams():
    tokens = [5, 6, 7, 8, 9, 1, 5, 6, 2, 5, 6]
    draft = PromptLookup(Config(max_ngram=2)).propose(state(tokens), DraftShape(4), Sampling())
    assert draft.tokens.tolist() == [7, 8, 9, 1]  # the newer match (at 6) has only 3 tokens after it
    draft = PromptLookup(Config(max_ngram=4)).propose(state([3, 1, 4, 1, 5, 9, 2, 6, 9]), DraftShape(2), Sampling())
    assert draft.tokens.tolist() == [2, 6]  # only the 1-gram "9" matches


def test_no_match_gives_an_empty_draft():
    draft = PromptLookup().propose(state([1, 2, 3, 4]), DraftShape(4), Sampling())
    assert len(draft) == 0


def test_tree_merges_continuations_into_a_trie():
    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 9, 1, 2]
    draft = PromptLookup(Config(max_ngram=2)).propose(state(tokens), DraftShape(tree=(3, 3, 10)), Sampling())
    # continuations of "1 2": 3 5 9 (newest full), 4 1 2, 3 1 2 -> shared first token 3
    assert draft.tokens.tolist() == [3, 5, 9, 4, 1, 2, 1, 2]
    assert draft.parents.tolist() == [-1, 0, 1, -1, 3, 4, 0, 6]
    capped = PromptLookup(Config(max_ngram=2)).propose(state(tokens), DraftShape(tree=(3, 3, 4)), Sampling())
    assert len(capped) == 4


def brute_force_continuations(tokens, ngrams, length, limit):
    """The O(context) search the n-gram index replaced: scan every earlier window."""
    found, seen, total = [], set(), tokens.numel()
    for n in ngrams:
        if total <= n:
            continue
        starts = (tokens.unfold(0, n, 1)[:-1] == tokens[-n:]).all(1).nonzero().flatten() + n
        full = starts + length <= total
        for start in torch.cat([starts[full].flip(0), starts[~full]]).tolist():
            follow = tokens[start : start + length].tolist()
            if tuple(follow) not in seen:
                seen.add(tuple(follow))
                found.append((n, follow))
        if len(found) >= limit:
            return found[:limit]
    return found[:limit]


def test_incremental_index_finds_what_a_full_scan_finds():
    generator = torch.Generator().manual_seed(0)
    lookup = PromptLookup(Config(max_ngram=3, min_ngram=1))
    for sequence in range(2):  # the second sequence arrives without reset(): the index must start over
        tokens = torch.randint(0, 6, (5,), generator=generator)
        while tokens.numel() < 120:
            for length, limit in [(4, 1), (3, 5)]:
                ours = [(n, follow.tolist()) for n, follow in lookup.continuations(tokens, length, limit)]
                assert ours == brute_force_continuations(tokens, [3, 2, 1], length, limit)
            grow = int(torch.randint(1, 6, (1,), generator=generator))
            tokens = torch.cat([tokens, torch.randint(0, 6, (grow,), generator=generator)])
    listed = sum(len(positions) for positions in lookup.live.where.values())
    assert listed == lookup.live.length == tokens.numel() - grow  # indexed once each, not once per cycle


def brute_force_lookup(tokens: list[int], length: int, counts: dict, last_full: bool, cost) -> tuple[list[int], tuple]:
    """Prompt lookup's chain, written out: the most recent match of the longest n-gram (3 down to 1) with a
    full-length continuation (else its longest), cut to the length whose expected tokens per unit of verify cost
    are best at the running acceptance rate of its (n, last draft whole) class, from 3 of 4. (draft, class)."""
    found = brute_force_continuations(torch.tensor(tokens), [3, 2, 1], length, 1)
    if not found:
        return [], None
    n, draft = found[0]
    key = (n, last_full)
    if cost is not None:
        accepted, offered = counts.get(key, (0, 0))
        rate = (accepted + 3) / (offered + 4)
        draft = draft[: best_length([rate**k for k in range(1, length + 1)], cost)]
    return draft, key


def test_the_preset_drafts_prompt_lookups_chains():
    """The suffix drafter's preset drafts prompt lookup's chains, adaptive lengths included, as drafts are partly
    accepted along random sequences (its acceptance learned off the committed tokens, as prompt lookup learns it)."""
    generator = torch.Generator().manual_seed(0)
    for cost in (None, CPU_LIKE):
        lookup = PromptLookup(verify_cost=cost)
        tokens = torch.randint(0, 4, (3,), generator=generator)
        lengths, counts, last_full, pending = set(), {}, False, None
        while tokens.numel() < 300:
            if pending is not None:  # what the brute force learns from its previous draft
                at, draft, key = pending
                after = tokens[at : at + len(draft)].tolist()
                accepted = next((i for i, (a, b) in enumerate(zip(draft, after)) if a != b), len(after))
                count = counts.setdefault(key, [0, 0])
                count[0], count[1] = count[0] + accepted, count[1] + min(len(draft), accepted + 1)
                last_full = accepted == len(draft)
            want, key = brute_force_lookup(tokens.tolist(), 4, counts, last_full, cost)
            pending = (tokens.numel(), want, key) if want else None
            got = lookup.propose(DecodeState(tokens[None]), DraftShape(4), Sampling()).tokens
            assert got.tolist() == want
            lengths.add(len(want))
            kept = int(torch.randint(0, len(want) + 1, (1,), generator=generator))  # the target agrees so far
            tokens = torch.cat([tokens, got[:kept], torch.randint(0, 4, (1,), generator=generator)])
        assert len(lengths) >= (3 if cost else 2)
    assert PromptLookup().config == Config().suffix_config() == SuffixConfig(
        max_match=3, min_match=1, choose="recent", trees="recent")


def test_bad_ngram_config():
    with pytest.raises(DraftsmithError, match="min_ngram"):
        PromptLookup(Config(max_ngram=1, min_ngram=2))


# --------------------------------------------------------------------------- adaptive length
CPU_LIKE = {1: 1.0, **{n: 1.5 for n in range(2, 12)}}  # one extra token costs half a pass, then flat


def test_without_a_cost_curve_or_with_flat_costs_every_draft_is_full_length():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    for lookup in (PromptLookup(), PromptLookup(verify_cost={n: 1.0 for n in range(1, 12)}),
                   PromptLookup(Config(adaptive=False), verify_cost={n: float(n) for n in range(1, 12)})):
        assert lookup.propose(state(tokens), DraftShape(5), Sampling()).tokens.tolist() == [4, 5, 6, 7, 8]


def test_costly_passes_mean_no_draft():
    # t(n) = n: a pass over L + 1 tokens never pays for itself unless every token is surely right
    lookup = PromptLookup(verify_cost={n: float(n) for n in range(1, 12)})
    assert len(lookup.propose(state([1, 2, 3, 4, 5, 6, 1, 2, 3]), DraftShape(5), Sampling())) == 0


def test_learns_per_match_length_which_drafts_pay():
    """Misses on 1-gram matches stop 1-gram drafting; hits on 3-gram matches keep full-length drafts."""
    lookup = PromptLookup(verify_cost=CPU_LIKE)
    history = [7, 1, 100, 4, 1]  # "1" seen before, followed by 100: a 1-gram match
    for new in range(101, 107):
        draft = lookup.propose(state(history), DraftShape(1), Sampling())
        if len(draft) == 0:
            break
        assert draft.tokens.tolist()[0] == new - 1
        history = history + [new, 1]  # the target said something new; the context ends in "1" again
    assert len(draft) == 0, "drafting kept going after repeated misses on 1-gram matches"
    rate = lookup.describe()["acceptance_by_match"]["n=1, after full accept=False"]
    assert rate == 0.0

    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] * 3
    for at in range(15, 30, 4):
        draft = lookup.propose(state(text[:at]), DraftShape(4), Sampling())
        assert draft.tokens.tolist() == text[at : at + 4]  # 3-gram matches, always right: always 4 tokens


def test_acceptance_counts_survive_reset_but_the_pending_draft_does_not():
    lookup = PromptLookup(verify_cost=CPU_LIKE)
    lookup.propose(state([1, 2, 3, 4, 1, 2, 3]), DraftShape(2), Sampling())
    lookup.reset()  # a new request: nothing of the old draft is scored against it
    lookup.propose(state([9, 9, 9, 9]), DraftShape(2), Sampling())
    assert lookup.counts == {}


def test_verify_cost_curve_measures_each_size(tiny_qwen3):
    context = torch.randint(0, 200, (1, 40))
    cost = verify_cost_curve(tiny_qwen3, [1, 2, 4], context, repeats=3)
    assert sorted(cost) == [1, 2, 4] and all(t > 0 for t in cost.values())
    lookup = PromptLookup()
    assert sorted(lookup.calibrate(tiny_qwen3, 3, context_tokens=16)) == [1, 2, 3, 4]
    assert lookup.describe()["adaptive"] is True


@pytest.mark.parametrize("shape, cost", [(DraftShape(5), None), (DraftShape(tree=(4, 3, 12)), None),
                                         (DraftShape(5), CPU_LIKE)], ids=["chain", "tree", "adaptive-chain"])
def test_prompt_lookup_decoding_is_exact(tiny_qwen3, shape, cost):
    prompt = torch.tensor([[257, 40, 41, 42, 43, 40, 41, 42, 44, 40, 41]])
    plain = plain_generate(tiny_qwen3, prompt, Sampling(), 40, eos=set())
    out = speculative_generate(tiny_qwen3, PromptLookup(verify_cost=cost), prompt, shape, Sampling(), 40, eos=set())
    assert out.tokens == plain.tokens
    assert sum(c.accepted for c in out.cycles) > 0  # the random model repeats itself: lookup must help


def test_the_stopping_rule_keeps_a_position_only_while_some_length_pays():
    from draftsmith.cost import StoppingRule, best_length

    cpu_like = {1: 1.0, 2: 1.5, 3: 1.55, 4: 1.6, 5: 1.65}
    rule = StoppingRule(cpu_like, 4)
    assert [rule.keep(0.9) for _ in range(4)] == [True] * 4  # confident: the whole chain
    assert StoppingRule(cpu_like, 4).keep(0.2) is False  # 1.2 tokens for 1.5x the cost of one: a plain step
    rule = StoppingRule(cpu_like, 4)
    kept = [rule.keep(c) for c in (0.9, 0.9, 0.05, 0.9)]
    assert kept[:3] == [True, True, False]  # a doubtful third position ends it (the rule is never asked again)
    for c in (0.3, 0.5, 0.7):  # with one confidence throughout, it is the best length of its projection
        rule, n = StoppingRule(cpu_like, 4), 0
        while n < 4 and rule.keep(c):
            n += 1
        assert n == best_length([c**k for k in range(1, 5)], cpu_like)
