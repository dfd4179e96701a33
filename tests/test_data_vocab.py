"""Draft vocabulary: top-N by trainable-token frequency, d2t offsets, t2d membership, coverage."""

import pytest
import torch

from draftsmith.data.vocab import build_draft_vocab, load_draft_vocab, save_draft_vocab
from draftsmith.errors import DraftsmithError


def test_top_tokens_offsets_and_coverage(tmp_path):
    counts = torch.zeros(20, dtype=torch.long)
    counts[[3, 7, 8, 15, 19]] = torch.tensor([10, 50, 5, 30, 5])
    vocab = build_draft_vocab(counts, 4)
    # top 4 by count: 7 (50), 15 (30), 3 (10), then 8 over 19 (tie -> lower id); sorted by target id
    assert vocab.target_ids().tolist() == [3, 7, 8, 15]
    assert vocab.d2t.tolist() == [3, 6, 6, 12]  # used[i] - i
    assert vocab.t2d.nonzero().flatten().tolist() == [3, 7, 8, 15] and vocab.t2d.dtype == torch.bool
    assert vocab.coverage == pytest.approx(95 / 100)
    save_draft_vocab(tmp_path, vocab)
    loaded = load_draft_vocab(tmp_path)
    assert torch.equal(loaded.d2t, vocab.d2t) and torch.equal(loaded.t2d, vocab.t2d)
    assert loaded.coverage == pytest.approx(vocab.coverage)


def test_vocab_larger_than_distinct_tokens_names_the_number():
    counts = torch.zeros(10, dtype=torch.long)
    counts[[1, 2, 3]] = 1
    with pytest.raises(DraftsmithError, match="at most 3"):
        build_draft_vocab(counts, 4)
    assert build_draft_vocab(counts, 3).coverage == 1.0


def test_prepare_builds_vocab_from_loss_masked_tokens(tmp_path, tiny_llama):
    import json

    from draftsmith.data.prepared import PrepareConfig, load_prepared, load_token_counts, prepare

    rows = [{"messages": [{"role": "user", "content": "zzzzzzzzzzzzzzzz"}, {"role": "assistant", "content": "aab"}]}] * 3
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prepare(PrepareConfig(input=[str(tmp_path / "c.jsonl")], out=str(tmp_path / "out"),
                                   eval_fraction=0.0, draft_vocab_size=2), target=tiny_llama)
    counts = load_token_counts(tmp_path / "out")
    a, b, z = (tiny_llama.tokenizer.encode(ch, add_special_tokens=False)[0] for ch in "abz")
    assert counts[z] == 0 and counts[a] == 6 and counts[b] == 3  # user text is not counted
    assert int(counts.sum()) == report["trainable_tokens"] == 9
    assert load_draft_vocab(tmp_path / "out").target_ids().tolist() == sorted([a, b])
    assert report["draft_vocab_train_coverage"] == 1.0
    assert len(load_prepared(tmp_path / "out")["train"]) == 3


def test_prepare_caps_the_vocab_at_the_distinct_tokens_the_data_has(tmp_path, tiny_llama, capsys):
    """A regeneration budget that answers few rows (or a small input) gives fewer distinct tokens than the recipe's
    draft_vocab_size: the vocabulary holds every one of them, the report names both sizes, and the recipe that
    asked for the larger one still accepts the folder on its next run."""
    import json

    from draftsmith.data.commands import print_prepare_report
    from draftsmith.data.prepared import PrepareConfig, prepare
    from draftsmith.train.pipeline import check_prepared_matches

    rows = [{"messages": [{"role": "user", "content": "zz"}, {"role": "assistant", "content": "aab"}]}] * 3
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = PrepareConfig(input=[str(tmp_path / "c.jsonl")], out=str(tmp_path / "out"), eval_fraction=0.0,
                            draft_vocab_size=2048)
    report = prepare(options, target=tiny_llama)
    assert report["draft_vocab_size"] == 2 and report["draft_vocab_size_requested"] == 2048
    assert load_draft_vocab(tmp_path / "out").size == 2 and report["draft_vocab_train_coverage"] == 1.0
    print_prepare_report(report, options.out)
    assert "holds 2 tokens, not the 2048 asked for" in capsys.readouterr().out
    check_prepared_matches(report, options, tmp_path / "out" / "prepare_report.json")
    with pytest.raises(DraftsmithError, match="draft_vocab_size: recipe 1024, data 2048"):
        check_prepared_matches(report, PrepareConfig(**{**options.__dict__, "draft_vocab_size": 1024}),
                               tmp_path / "out" / "prepare_report.json")
