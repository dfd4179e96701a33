"""Held-out coverage of the draft vocabulary (data/vocab_coverage.py): ranks in build_draft_vocab's order, coverage
per category, the ladder `auto` chooses from, and prepare's report (the held-out share, not the training split's)."""

import json

import pytest
import torch

from draftsmith.data.vocab import build_draft_vocab, load_draft_vocab
from draftsmith.data.vocab_coverage import (
    choose_size,
    coverage_at,
    coverage_curve,
    held_out_report,
    ladder_sizes,
    token_ranks,
)


def test_ranks_follow_build_draft_vocab_and_coverage_is_per_category():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[3, 7, 8, 15, 19]] = torch.tensor([10, 50, 5, 30, 5])
    ranks = token_ranks(counts)
    # order 7, 15, 3, 8, 19 (tie 8/19 -> lower id first); unseen tokens rank outside every vocabulary
    assert ranks[[7, 15, 3, 8, 19]].tolist() == [0, 1, 2, 3, 4] and ranks[0] == 20
    for size in range(1, 6):  # the same tokens as the vocabulary build_draft_vocab makes
        held = build_draft_vocab(counts, size).t2d
        assert torch.equal(held, ranks < size)
    answers = {"code": torch.tensor([7, 7, 3, 0]), "math": torch.tensor([19, 8]), "empty": torch.tensor([])}
    point = coverage_at(ranks, answers, 3)  # holds 7, 15, 3
    assert point["per_category"] == {"code": 0.75, "math": 0.0}  # a category with no tokens is left out
    assert point["overall"] == pytest.approx(3 / 6, abs=1e-4)  # tokens pooled, not categories averaged
    assert coverage_at(ranks, answers, 4)["per_category"]["math"] == 0.5  # 8 comes before 19


def test_ladder_stops_at_what_the_training_split_holds():
    assert ladder_sizes(100_000) == [1024, 2048, 4096, 8192, 16384, 32768]
    assert ladder_sizes(3000) == [1024, 2048, 3000]
    assert ladder_sizes(2048) == [1024, 2048]
    assert ladder_sizes(5) == [5]


def _curve(*points):
    return [{"size": size, "overall": None, "per_category": shares} for size, shares in points]


def test_auto_takes_the_smallest_size_every_category_reaches():
    curve = _curve((1024, {"code": 0.97, "math": 0.90}), (2048, {"code": 0.98, "math": 0.95}),
                   (4096, {"code": 0.99, "math": 0.99}))
    size, why = choose_size(curve, 0.95)
    assert size == 2048 and "math at 0.95" in why and "1024 reaches 0.9 in math" in why
    assert choose_size(curve, 0.90)[0] == 1024
    size, why = choose_size(curve, 0.995)  # none reaches it: the largest, saying so and naming the lowest
    assert size == 4096 and "no size" in why and "0.99" in why


def test_report_curve_chooses_on_prompt_sets_and_shows_the_eval_split():
    vocab_size = 40_000
    counts = torch.zeros(vocab_size, dtype=torch.long)
    counts[:10_000] = torch.arange(10_000, 0, -1)  # token i ranks i: a vocabulary of N holds ids < N
    prompts = {"chat": torch.arange(0, 1000), "code": torch.cat([torch.arange(0, 900), torch.arange(3000, 3100)])}
    evals = {"eval:x.jsonl": torch.tensor([20_000] * 10)}  # outside everything: shown, never decides
    size, report = held_out_report(counts, prompts, evals, "auto", 0.95)
    assert [point["size"] for point in report["curve"]] == [1024, 2048, 4096, 8192, 10_000]
    # 1024 and 2048 hold 90% of code's answers; 4096 every one
    assert size == report["size"] == 4096 and "2048 reaches 0.9 in code" in report["why"]
    at_4096 = report["curve"][2]
    assert at_4096["per_category"] == {"chat": 1.0, "code": 1.0, "eval:x.jsonl": 0.0}
    assert report["coverage"] == at_4096["overall"] == pytest.approx(2000 / 2010, abs=1e-4)
    assert report["answer_tokens"] == {"chat": 1000, "code": 1000, "eval:x.jsonl": 10}
    size, report = held_out_report(counts, prompts, evals, 1500, 0.95)  # a size asked for: on the curve too
    assert size == 1500 and 1500 in [point["size"] for point in report["curve"]] and report["why"] == "asked for"
    assert report["coverage"] == pytest.approx(1900 / 2010, abs=1e-4)
    size, report = held_out_report(counts, prompts, evals, 50_000, 0.95)
    assert size == 10_000 and "10000 distinct" in report["why"]


def test_prepare_reports_held_out_coverage_not_the_training_splits(tmp_path, tiny_llama):
    """The training split's own coverage reads 1.0 here (the vocabulary holds every token it has); the reported
    coverage is the share of the target's own greedy answers to the held-out prompts, recomputed here from those
    answers and the saved vocabulary."""
    from draftsmith.data.prepared import PrepareConfig, prepare
    from draftsmith.data.regenerate import write_tokens
    from draftsmith.data.templates import encode_prompt

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abcab"}]}] * 4
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = [{"category": "code", "prompt": "def f(x):"}, {"category": "code", "prompt": "import os"},
            {"category": "chat", "prompt": "Hello there"}, {"category": "chat", "prompt": "Goodbye"},
            {"category": "code", "prompt": "third code, ignored"}]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    report = prepare(PrepareConfig(input=[str(tmp_path / "c.jsonl")], out=str(tmp_path / "out"), eval_fraction=0.0,
                                   draft_vocab_size="auto", draft_vocab_prompts=[str(tmp_path / "held.jsonl")],
                                   draft_vocab_prompts_per_category=2, draft_vocab_answer_tokens=8),
                     target=tiny_llama)
    assert report["draft_vocab_train_coverage"] == 1.0
    assert report["draft_vocab_size_requested"] == "auto" and report["draft_vocab_size"] == 3  # a, b, c
    vocab = load_draft_vocab(tmp_path / "out")
    tokenizer, eos = tiny_llama.tokenizer, tiny_llama.tokenizer.eos_token_id
    answers = {}
    for row in held[:4]:  # two of each category, in order
        ids = encode_prompt(tokenizer, [{"role": "user", "content": row["prompt"]}])
        written = write_tokens(tiny_llama, [ids], 0.0, 8)[0]
        answers.setdefault(row["category"], []).extend(t for t in written if t != eos)
    share = {name: sum(bool(vocab.t2d[t]) for t in tokens) / len(tokens) for name, tokens in answers.items()}
    pooled = sum(bool(vocab.t2d[t]) for tokens in answers.values() for t in tokens) / sum(map(len, answers.values()))
    section = report["draft_vocab"]
    assert report["draft_vocab_coverage"] == section["coverage"] == pytest.approx(pooled, abs=1e-4)
    assert section["curve"][-1]["per_category"] == pytest.approx(share, abs=1e-4)
    assert section["answer_tokens"] == {name: len(tokens) for name, tokens in answers.items()}
    assert report["draft_vocab_coverage"] < 1.0  # a random tiny target says tokens no training answer holds
    assert section["prompt_sets"] == [str(tmp_path / "held.jsonl")] and section["eval_split"] is None


def test_prepare_measures_the_eval_splits_regenerated_answers(tmp_path, tiny_llama):
    """Regenerated eval rows are the target's own answers: their loss-masked tokens are measured as they are, by
    input, beside the prompt sets."""
    from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare

    rows = [{"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": "x"}]}
            for i in range(6)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prepare(PrepareConfig(input=[str(tmp_path / "c.jsonl")], out=str(tmp_path / "out"), eval_fraction=0.34,
                                   regenerate=True, max_new_tokens=6, draft_vocab_size=2,
                                   draft_vocab_prompts_per_category=0), target=tiny_llama)
    evals = load_prepared(tmp_path / "out")["eval"]
    vocab = load_draft_vocab(tmp_path / "out")
    tokens = [t for ids, mask in zip(evals["input_ids"], evals["loss_mask"]) for t, m in zip(ids, mask) if m]
    name = f"eval:{tmp_path / 'c.jsonl'}"
    section = report["draft_vocab"]
    assert section["answer_tokens"] == {name: len(tokens)} and section["eval_split"] == "its regenerated answers"
    assert report["draft_vocab_coverage"] == pytest.approx(sum(bool(vocab.t2d[t]) for t in tokens) / len(tokens),
                                                           abs=1e-4)


def test_auto_needs_prompt_sets():
    from draftsmith.data.prepared import PrepareConfig
    from draftsmith.errors import DraftsmithError

    with pytest.raises(DraftsmithError, match="auto chooses by coverage of held-out prompts"):
        PrepareConfig(draft_vocab_size="auto", draft_vocab_prompts_per_category=0).validate()
    PrepareConfig(draft_vocab_size="auto").validate()


def test_auto_parses_from_the_command_line():
    import argparse

    from draftsmith.config import add_arguments, from_flags
    from draftsmith.data.prepared import PrepareConfig

    parser = argparse.ArgumentParser()
    add_arguments(parser, PrepareConfig)
    assert from_flags(PrepareConfig, parser.parse_args(["--draft-vocab-size", "auto"])).draft_vocab_size == "auto"
    assert from_flags(PrepareConfig, parser.parse_args(["--draft-vocab-size", "2048"])).draft_vocab_size == 2048


def test_coverage_curve_of_unseen_answers_is_zero():
    counts = torch.zeros(10, dtype=torch.long)
    counts[1] = 4
    assert coverage_curve(counts, {"a": torch.tensor([2, 3])}, [1])[0]["per_category"] == {"a": 0.0}
