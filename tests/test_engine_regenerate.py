"""Regeneration through vLLM (prepare.engine = vllm): the engine writes the answers' tokens; rows, chat template,
on-policy turn order, batches, the resumable cache and the budget stay draftsmith's.

The bookkeeping runs everywhere against a stand-in worker (tests/fake_regenerate_worker.py) launched as the real one
is, through engine_process; the last test runs vLLM itself on the built-in target (marker `engine`, skipped without
`.venv-engine`, as in tests/test_engine.py) and asks for the answers our own loop writes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from draftsmith.data.general import awaiting_target
from draftsmith.data.regenerate import read_cache, regenerate_conversations
from draftsmith.data.regenerate_engine import EngineWriter
from draftsmith.errors import DraftsmithError

ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).with_name("fake_regenerate_worker.py")
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"


@pytest.fixture
def fake_engine(tiny_llama, tmp_path):
    """A factory of EngineWriters running the stand-in worker over the tiny target's tokenizer."""
    folder = tmp_path / "target"
    tiny_llama.tokenizer.save_pretrained(folder)

    def make(workdir: Path, **settings) -> EngineWriter:
        writer = EngineWriter(str(folder), "float32", workdir, python=Path(sys.executable), worker=FAKE)
        writer.settings.update(seen=str(workdir / "seen.jsonl"), **settings)
        return writer

    return make


def seen(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "seen.jsonl").read_text().splitlines()]


def single_turns(count: int) -> list[tuple[str, list[dict]]]:
    return [(f"f:{i}", awaiting_target([f"question {i} " + "x" * i])) for i in range(count)]


# --------------------------------------------------------------------------- options
def test_the_engine_option_is_checked_and_a_missing_engine_venv_says_make_engine(tmp_path, monkeypatch):
    import draftsmith.engine_process as engine_process
    from draftsmith.cli import build_parser
    from draftsmith.config import from_flags
    from draftsmith.data.prepared import PrepareConfig, prepare

    with pytest.raises(DraftsmithError, match="engines are vllm"):
        PrepareConfig(engine="sglang", regenerate=True).validate()
    with pytest.raises(DraftsmithError, match="needs --regenerate"):
        PrepareConfig(engine="vllm").validate()
    args = build_parser().parse_args(["prepare", "--regenerate", "--engine", "vllm", "--engine-eager"])
    config = from_flags(PrepareConfig, args)
    assert (config.engine, config.engine_eager, config.regenerate) == ("vllm", True, True)
    assert from_flags(PrepareConfig, build_parser().parse_args(["prepare"])).engine is None

    monkeypatch.delenv(engine_process.ENGINE_PYTHON_VARIABLE, raising=False)
    monkeypatch.setattr(engine_process, "__file__", str(tmp_path / "draftsmith" / "engine_process.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DraftsmithError, match=r"prepare.engine \(--engine vllm\) needs vLLM's venv.*run `make engine`"):
        prepare(PrepareConfig(input=["builtin:general"], regenerate=True, engine="vllm", out=str(tmp_path / "d")),
                target=object())  # fails before the target is touched


# --------------------------------------------------------------------------- the engine path's bookkeeping
def test_the_engine_answers_turn_by_turn_each_turn_given_its_own_earlier_answers(fake_engine, tiny_llama, tmp_path):
    from draftsmith.data.templates import encode_prompt

    rows = [("a:1", awaiting_target(["q1", "q2"])), ("a:2", awaiting_target(["p1"]))]
    with fake_engine(tmp_path) as engine:
        records = regenerate_conversations(tiny_llama, rows, tmp_path / "cache.jsonl", max_new_tokens=40,
                                           batch_size=4, engine=engine)
    assert [[m["content"] for m in r if m["role"] == "assistant"] for r in records] == [["A(q1)", "A(q2)"], ["A(p1)"]]
    batches = seen(tmp_path)
    assert [len(b["prompts"]) for b in batches] == [2, 1]  # turn 1 of both rows together, then turn 2
    assert {b["max_tokens"] for b in batches} == {40} and {b["temperature"] for b in batches} == {0.0}
    # turn 2's prompt is the chat template over the target's own turn 1, as our loop encodes it
    turn_two = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "A(q1)"},
                {"role": "user", "content": "q2"}]
    assert batches[1]["prompts"][0] == tiny_llama.tokenizer.decode(encode_prompt(tiny_llama.tokenizer, turn_two))


def test_an_engine_crash_leaves_whole_rows_and_a_rerun_writes_what_an_uninterrupted_run_writes(fake_engine,
                                                                                                tiny_llama, tmp_path):
    rows = single_turns(6)
    kwargs = dict(max_new_tokens=30, batch_size=2, seed=3)
    with fake_engine(tmp_path / "whole") as engine:
        whole = regenerate_conversations(tiny_llama, rows, tmp_path / "whole.jsonl", engine=engine, **kwargs)
    cache = tmp_path / "cache.jsonl"
    with pytest.raises(DraftsmithError, match="exited with 3"):
        with fake_engine(tmp_path / "crash", die_after=2) as engine:
            regenerate_conversations(tiny_llama, rows, cache, engine=engine, **kwargs)
    assert len(read_cache(cache)) == 2  # the first batch, whole; nothing of the second
    with fake_engine(tmp_path / "resume") as engine:
        resumed = regenerate_conversations(tiny_llama, rows, cache, engine=engine, **kwargs)
    assert resumed == whole
    assert sum(len(b["prompts"]) for b in seen(tmp_path / "resume")) == 4  # only the rows left
    keys = [json.loads(line)["key"] for line in cache.read_text().splitlines()]
    assert sorted(keys) == sorted(key for key, _ in rows)


def test_a_budget_counts_the_engines_start_and_a_spent_one_never_starts_it_again(fake_engine, tiny_llama, tmp_path):
    rows, cache = single_turns(6), tmp_path / "cache.jsonl"
    kwargs = dict(max_new_tokens=30, batch_size=2, max_seconds=1e-6)
    with fake_engine(tmp_path / "first") as engine:
        records = regenerate_conversations(tiny_llama, rows, cache, engine=engine, **kwargs)
        assert engine.load_seconds is not None
    assert sum(r is not None for r in records) == 2  # the batch that spent the budget (start-up included) is the last
    assert json.loads(cache.with_name(cache.name + ".budget.json").read_text())["seconds"] > 1e-6
    with fake_engine(tmp_path / "again") as engine:
        again = regenerate_conversations(tiny_llama, rows, cache, engine=engine, **kwargs)
        assert engine.process is None and engine.load_seconds is None  # nothing to write: no engine
    assert again == records


def test_an_engine_that_refuses_to_load_is_reported_with_its_error(fake_engine, tiny_llama, tmp_path):
    with pytest.raises(DraftsmithError, match="vLLM failed loading the target for regeneration: ValueError: no CPU"):
        with fake_engine(tmp_path, refuse="no CPU") as engine:
            regenerate_conversations(tiny_llama, single_turns(2), tmp_path / "cache.jsonl", engine=engine)


def test_prepare_with_engine_vllm_has_the_engine_write_every_answer_and_says_so(fake_engine, tiny_llama, tmp_path,
                                                                                  monkeypatch):
    import draftsmith.data.regenerate_engine as regenerate_engine
    from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare

    monkeypatch.setenv("DRAFTSMITH_ENGINE_PYTHON", sys.executable)  # prepare checks for the venv first
    made = []

    def writer(target, dtype, workdir, eager=False):
        made.append((target, dtype, eager))
        return fake_engine(Path(workdir))

    monkeypatch.setattr(regenerate_engine, "EngineWriter", writer)
    out = tmp_path / "data"
    report = prepare(PrepareConfig(target="tiny", input=["builtin:general"], max_rows=4, regenerate=True,
                                   engine="vllm", engine_eager=True, max_new_tokens=4096, out=str(out),
                                   eval_fraction=0.0), target=tiny_llama)
    assert made == [("tiny", "float32", True)]
    assert (report["regenerated_by"], report["rows_kept"]) == ("vllm", 4)
    cached = read_cache(out / "regenerated.jsonl")
    assert all(m["content"] == f"A({record[i - 1]['content']})" for record in cached.values()
               for i, m in enumerate(record) if m["role"] == "assistant")
    assert len(load_prepared(out)["train"]) == 4


# --------------------------------------------------------------------------- vLLM itself
@pytest.mark.engine
def test_vllm_writes_the_greedy_answers_our_loop_writes(smollm2, tmp_path):
    """Six builtin:general rows (multi-turn ones among them), 16 new tokens, greedy, float32: the same answers,
    turn by turn, from vLLM (eager) and from our batched loop."""
    if not ENGINE_PYTHON.is_file():
        if os.environ.get("CI"):
            pytest.fail("CI run without .venv-engine: `make engine` makes it (.ci/run runs it before the tests).")
        pytest.skip("needs vLLM's venv: `make engine`")
    from draftsmith.data.prepared import _Rejections, read_conversations

    _, rows = read_conversations(["builtin:general"], _Rejections(strict=True), max_rows=6)
    rows = [(f"{source}:{line}", record) for source, line, record in rows]
    assert any(sum(m["role"] == "assistant" for m in record) > 1 for _, record in rows)
    kwargs = dict(max_new_tokens=16, batch_size=4)
    ours = regenerate_conversations(smollm2, rows, tmp_path / "ours.jsonl", **kwargs)
    with EngineWriter("smollm2-135m-instruct", "float32", tmp_path / "engine", eager=True) as engine:
        theirs = regenerate_conversations(smollm2, rows, tmp_path / "engine.jsonl", engine=engine, **kwargs)
    answers = [[[m["content"] for m in record if m["role"] == "assistant"] for record in side]
               for side in (ours, theirs)]
    print(json.dumps(answers[1], indent=1))
    assert answers[0] == answers[1]


# --------------------------------------------------------------------------- the bench's table
def test_the_regeneration_table_shows_both_sides_their_ratio_and_identity():
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "bench" / "results_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    side = {"seconds": 120.0, "rows": 64, "answer_tokens": 7000, "rows_per_minute": 32.0,
            "answer_tokens_per_minute": 3500.0, "cpu_seconds": 230.5, "rows_per_cpu_minute": 16.66}
    result = {"rows": 64, "inputs": ["builtin:general", "builtin:exercises"], "max_new_tokens": 128,
              "batch_size": 32, "dtype": "float32", "vllm_version": "0.32.0", "engine_eager": True,
              "sides": {"draftsmith": side, "vllm": {**side, "seconds": 80.0, "rows_per_minute": 48.0,
                                                     "start_seconds": 31.0, "cpu_seconds": 150.25}},
              "engine_ratio": 1.5, "engine_ratio_without_start": 2.449, "engine_ratio_cpu": 1.534,
              "identical_rows": 62, "differing": {"a:1": {"our_logit_gap": 0.0123}, "b:2": {"our_logit_gap": 0.5}}}
    text = "\n".join(tables.regeneration(result))
    for figure in ("| vllm | 80.0 | 48.00 |", "| draftsmith | 120.0 | 32.00 | 3500 | 7000 | 230.5 | 16.66 |",
                   "1.50×", "2.45×", "1.53× per CPU second", "62/64", "0.012, 0.500", "(eager)", "31 s"):
        assert figure in text, figure
