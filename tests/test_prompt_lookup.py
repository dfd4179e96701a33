"""Prompt lookup: which match it copies, tree drafts as tries, and exactness through the decoder."""

import pytest
import torch

from draftsmith.drafters import DecodeState, DraftShape, Sampling
from draftsmith.drafters.prompt_lookup import Config, PromptLookup
from draftsmith.errors import DraftsmithError
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


def test_bad_ngram_config():
    with pytest.raises(DraftsmithError, match="min_ngram"):
        PromptLookup(Config(max_ngram=1, min_ngram=2))


@pytest.mark.parametrize("shape", [DraftShape(5), DraftShape(tree=(4, 3, 12))], ids=["chain", "tree"])
def test_prompt_lookup_decoding_is_exact(tiny_qwen3, shape):
    prompt = torch.tensor([[257, 40, 41, 42, 43, 40, 41, 42, 44, 40, 41]])
    plain = plain_generate(tiny_qwen3, prompt, Sampling(), 40, eos=set())
    out = speculative_generate(tiny_qwen3, PromptLookup(), prompt, shape, Sampling(), 40, eos=set())
    assert out.tokens == plain.tokens
    assert sum(c.accepted for c in out.cycles) > 0  # the random model repeats itself: lookup must help
