"""prepare.max_minutes: regeneration for a wall-clock budget, sampled over every input, resumable, counted once."""

import json
import types

from draftsmith.data.general import awaiting_target
from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare
from draftsmith.data.regenerate import read_cache, regenerate_conversations


def rows(count=24):
    """Prompts of growing size, so the size-sorted batches are the rows in order, two by two."""
    return [(f"f:{i}", awaiting_target([f"question {i} " + "x" * i])) for i in range(count)]


def ten_seconds_a_batch(monkeypatch):
    """A fake clock under regeneration: every batch takes 10 s."""
    import draftsmith.data.regenerate as regenerate

    clock = {"now": 0.0}
    real = regenerate.regenerate_batch

    def timed(*args, **kwargs):
        clock["now"] += 10.0
        return real(*args, **kwargs)

    monkeypatch.setattr(regenerate, "regenerate_batch", timed)
    monkeypatch.setattr(regenerate, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))


def answered(records):
    return [i for i, record in enumerate(records) if record is not None]


def test_a_spent_budget_stops_after_the_batch_that_spends_it_with_a_sample_of_every_size(tmp_path, tiny_llama,
                                                                                            monkeypatch):
    ten_seconds_a_batch(monkeypatch)
    kwargs = dict(max_new_tokens=3, batch_size=2, seed=0)
    records = regenerate_conversations(tiny_llama, rows(), tmp_path / "cache.jsonl", max_seconds=35, **kwargs)
    done = answered(records)
    assert len(done) == 8  # 10, 20, 30 s: not spent; the fourth batch spends it and is the last
    assert done != list(range(8)) and max(done) > 8  # not the shortest prompts: batches went in a seeded order
    assert all(done[k + 1] == done[k] + 1 for k in range(0, 8, 2))  # whole batches of neighbours in size
    assert json.loads((tmp_path / "cache.jsonl.budget.json").read_text())["seconds"] == 40.0
    # the same order for the same seed, without a budget the whole input (and no budget file)
    again = regenerate_conversations(tiny_llama, rows(), tmp_path / "again.jsonl", max_seconds=35, **kwargs)
    assert answered(again) == done and again == records
    everything = regenerate_conversations(tiny_llama, rows(), tmp_path / "all.jsonl", **kwargs)
    assert answered(everything) == list(range(24)) and not (tmp_path / "all.jsonl.budget.json").exists()
    assert all(everything[i] == records[i] for i in done)  # greedy: a row's answer does not depend on the order


def test_a_resumed_run_counts_the_time_already_spent(tmp_path, tiny_llama, monkeypatch):
    ten_seconds_a_batch(monkeypatch)
    cache = tmp_path / "cache.jsonl"
    kwargs = dict(max_new_tokens=3, batch_size=2, seed=1)
    first = answered(regenerate_conversations(tiny_llama, rows(), cache, max_seconds=35, **kwargs))
    lines = cache.read_text()
    same = regenerate_conversations(tiny_llama, rows(), cache, max_seconds=35, **kwargs)
    assert answered(same) == first and cache.read_text() == lines  # spent: nothing more is written
    more = answered(regenerate_conversations(tiny_llama, rows(), cache, max_seconds=55, **kwargs))
    assert set(first) < set(more) and len(more) == 12  # 40 s spent, two more batches to 60 s
    assert len(read_cache(cache)) == 12 and len(cache.read_text().splitlines()) == 12  # every row once


def test_prepare_leaves_unanswered_rows_out_and_reports_them(tmp_path, tiny_llama, monkeypatch):
    ten_seconds_a_batch(monkeypatch)
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"messages": record}) + "\n" for _, record in rows(10)))
    config = PrepareConfig(input=[str(source)], out=str(tmp_path / "out"), eval_fraction=0.0, regenerate=True,
                           max_new_tokens=3, batch_size=2, max_minutes=0.5)  # 30 s: three batches
    report = prepare(config, target=tiny_llama)
    assert (report["rows_kept"], report["rows_unanswered"]) == (6, 4)
    lines = sorted(load_prepared(tmp_path / "out")["train"]["line"])
    assert len(lines) == 6 and len(set(lines)) == 6
    assert json.loads((tmp_path / "out" / "prepare_report.json").read_text())["rows_unanswered"] == 4
