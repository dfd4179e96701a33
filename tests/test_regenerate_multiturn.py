"""On-policy multi-turn regeneration: every answer follows the target's own earlier answers; resume is exact."""

import json

import pytest
from tiny import tiny_target

from draftsmith.data.general import awaiting_target, general_conversations
from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare
from draftsmith.data.regenerate import PENDING, generate, read_cache, regenerate_batch, regenerate_conversations
from draftsmith.errors import DraftsmithError


def user(text):
    return {"role": "user", "content": text}


@pytest.fixture
def talkative():
    """A tiny target whose greedy answers change with the conversation before them (many seeds repeat one token)."""
    return tiny_target("qwen3", seed=0)


def test_second_answer_is_generated_from_the_targets_own_first_answer(talkative):
    pending = awaiting_target(["tell me about boats", "now shorter"])
    dataset = [user("what is a kite?"), {"role": "assistant", "content": "a dataset answer about kites"},
               user("and why do they fly?"), {"role": "assistant", "content": "a dataset answer"}]
    single = awaiting_target(["hello there"])
    new = regenerate_batch(talkative, [pending, dataset, single], 0.0, 10)
    for row, (first, second) in ((new[0], ("tell me about boats", "now shorter")),
                                 (new[1], ("what is a kite?", "and why do they fly?"))):
        # the same answers, written one conversation at a time from the target's own first answer
        own = generate(talkative, [[user(first)]], 0.0, 10)[0]
        follow = generate(talkative, [[user(first), {"role": "assistant", "content": own}, user(second)]], 0.0, 10)[0]
        assert [m["content"] for m in row if m["role"] == "assistant"] == [own, follow]
    after_dataset = generate(talkative, [dataset[:3]], 0.0, 10)[0]
    assert after_dataset != new[1][3]["content"]  # the dataset's first answer would have led elsewhere
    assert new[2][1]["content"] == generate(talkative, [[user("hello there")]], 0.0, 10)[0]
    assert dataset[1]["content"] == "a dataset answer about kites"  # inputs are not modified


def test_pending_turns_are_replaced_even_by_an_empty_answer(monkeypatch, tiny_llama):
    import draftsmith.data.regenerate as regenerate

    monkeypatch.setattr(regenerate, "generate", lambda target, prompts, *args: [""] * len(prompts))
    old = [user("q"), {"role": "assistant", "content": "old"}]
    new = regenerate_batch(tiny_llama, [awaiting_target(["q"]), old], 0.0, 4)
    assert new[0][1]["content"] == "" and new[1][1]["content"] == "old"


def rows_to_regenerate():
    rows = [(f"f:{i}", awaiting_target([f"question {i} " + "x" * (i % 4)] + ["go on"] * (i % 3 == 0)))
            for i in range(8)]
    rows.append(("f:completion", {"prompt": "Once upon", "completion": " a time"}))
    return rows


def test_a_resumed_run_writes_what_an_uninterrupted_run_writes(tmp_path, tiny_llama):
    rows = rows_to_regenerate()
    kwargs = dict(temperature=1.0, max_new_tokens=8, batch_size=3, seed=5)  # sampled: batches and seeds must match
    whole = regenerate_conversations(tiny_llama, rows, tmp_path / "whole.jsonl", **kwargs)
    lines = (tmp_path / "whole.jsonl").read_text().splitlines(keepends=True)
    # killed after the first batch and one row of the second, in the middle of writing another line
    (tmp_path / "resumed.jsonl").write_text("".join(lines[:4]) + lines[4][:20])
    resumed = regenerate_conversations(tiny_llama, rows, tmp_path / "resumed.jsonl", **kwargs)
    assert resumed == whole
    keys = [json.loads(line)["key"] for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert sorted(keys) == sorted(key for key, _ in rows)  # every row once
    assert read_cache(tmp_path / "resumed.jsonl") == read_cache(tmp_path / "whole.jsonl")
    assert all(m["content"] != PENDING for record in whole if isinstance(record, list) for m in record)


def test_prepare_regenerates_builtin_general_rows_turn_by_turn(tmp_path, tiny_llama):
    rows = [row for row in general_conversations(count=40) if len(row["messages"]) == 4][:3]
    (tmp_path / "general.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = PrepareConfig(input=[str(tmp_path / "general.jsonl")], out=str(tmp_path / "out"), eval_fraction=0.0,
                           regenerate=True, max_new_tokens=6, batch_size=2, last_turn_only=True)
    report = prepare(config, target=tiny_llama)
    assert report["rows_kept"] == 3
    for messages in load_prepared(tmp_path / "out")["train"]["messages"]:
        messages = json.loads(messages)
        first = generate(tiny_llama, [messages[:1]], 0.0, 6)[0]
        assert messages[1]["content"] == first  # last_turn_only trains turn 2 only, but turn 1 is the target's too
        assert messages[3]["content"] == generate(tiny_llama, [messages[:3]], 0.0, 6)[0]


def test_prompt_only_rows_are_refused_without_regeneration_naming_the_row(tmp_path):
    target = tiny_target("qwen3", seed=0)
    with pytest.raises(DraftsmithError, match=r"builtin:general:1: this row holds prompts only .*prepare.regenerate"):
        prepare(PrepareConfig(target="unused", input=["builtin:general"], max_rows_per_input=4, out=str(tmp_path / "d")),
                target=target)
    assert not (tmp_path / "d").exists()  # refused before anything was written
