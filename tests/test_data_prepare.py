"""prepare: loss masks on real chat templates, bad-row reporting, inputs of every kind, the report."""

import json
from pathlib import Path

import pytest

from draftsmith.data.prepared import (PrepareConfig, _Rejections, load_prepared, load_token_counts, prepare,
                                      read_conversations)
from draftsmith.data.templates import RowError, normalize_row, tokenize_conversation
from draftsmith.errors import DraftsmithError


# Llama-3 style: bos, header tokens, trimmed contents, <|eot_id|>; no generation markers.
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Qwen style: default system prompt when none is given, ChatML, an empty think block on the last reply.
QWEN = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{% endif %}{% for message in messages %}"
    "{% if message['role'] == 'assistant' and loop.last %}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' "
    "+ message['content'] + '<|im_end|>\\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# A plain template with no special tokens and no generation prompt at all.
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}],  # 'a' also in headers
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "assistant"},  # a user text equal to a role name
        {"role": "assistant", "content": "You said assistant.\n```python\nprint('héllo')\n```"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "You are welcome! 😀"},
    ],
    [{"role": "user", "content": "repeat: ok"}, {"role": "assistant", "content": "ok"}],
]


def masked_runs(ids, mask):
    """Contiguous runs of trainable tokens."""
    runs, current = [], []
    for token, keep in zip(ids, mask):
        if keep:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.mark.parametrize("template", [None, LLAMA3, QWEN, PLAIN], ids=["smollm2", "llama3", "qwen", "plain"])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_masked_tokens_decode_to_exactly_the_assistant_texts(smollm2, template, conversation):
    tokenizer = smollm2.tokenizer
    messages = CONVERSATIONS[conversation]
    tokens = tokenize_conversation(tokenizer, messages, chat_template=template)
    runs = masked_runs(tokens.input_ids, tokens.loss_mask)
    expected = [m["content"] for m in messages if m["role"] == "assistant"]
    if template == LLAMA3:
        expected = [text.strip() for text in expected]
    decoded = [tokenizer.decode(run) for run in runs]
    if template == PLAIN:  # 'assistant: a' may tokenize as ' a': the separator space rides along
        decoded = [text[1:] if text.startswith(" ") and not want.startswith(" ") else text
                   for text, want in zip(decoded, expected)]
    assert decoded == expected
    # and the full token sequence is exactly the template's rendering
    rendered = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    assert tokenizer.decode(tokens.input_ids) == rendered


def test_last_turn_only_and_truncation(smollm2):
    messages = CONVERSATIONS[1]
    tokens = tokenize_conversation(smollm2.tokenizer, messages, last_turn_only=True)
    assert [smollm2.tokenizer.decode(r) for r in masked_runs(tokens.input_ids, tokens.loss_mask)] == [messages[-1]["content"]]
    full = tokenize_conversation(smollm2.tokenizer, messages)
    cut = tokenize_conversation(smollm2.tokenizer, messages, max_length=len(full.input_ids) - 3)
    assert cut.truncated and cut.input_ids == full.input_ids[:-3] and cut.loss_mask == full.loss_mask[:-3]
    with pytest.raises(RowError, match="no trainable"):
        tokenize_conversation(smollm2.tokenizer, messages, max_length=5)


def test_template_that_rewrites_assistant_text_is_a_row_error(smollm2):
    upper = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    with pytest.raises(RowError, match="changes the text"):
        tokenize_conversation(smollm2.tokenizer, CONVERSATIONS[1], chat_template=upper)


def test_template_that_raises_is_a_row_error(smollm2):
    strict = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}{{ m['content'] + '\\n' }}{% endfor %}")
    with pytest.raises(RowError, match="refused this conversation.*alternate"):
        tokenize_conversation(smollm2.tokenizer, CONVERSATIONS[1], chat_template=strict)
    tokens = tokenize_conversation(smollm2.tokenizer, CONVERSATIONS[0], chat_template=strict)
    assert smollm2.tokenizer.decode([t for t, m in zip(tokens.input_ids, tokens.loss_mask) if m]) == "a"


@pytest.mark.parametrize("row, reason", [
    ([1, 2], "not a JSON object"),
    ({"body": "x"}, "none of 'messages', 'conversations', 'text'"),
    ({"completion": "x"}, "needs a 'prompt' string too"),
    ({"text": "  "}, "the text to train on is empty"),
    ({"text": 3}, "'text' is not a string"),
    ({"messages": []}, "empty"),
    ({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}, "unknown role"),
    ({"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "y"}]}, "empty content"),
    ({"messages": [{"role": "user", "content": ["x"]}, {"role": "assistant", "content": "y"}]}, "not a string"),
    ({"messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
])
def test_bad_rows_have_reasons(row, reason):
    with pytest.raises(RowError, match=reason):
        normalize_row(row)


def test_sharegpt_rows_and_trailing_user_turn():
    row = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                             {"from": "gpt", "value": "a"}, {"from": "human", "value": "more?"}]}
    assert normalize_row(row) == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                  {"role": "assistant", "content": "a"}]


# --------------------------------------------------------------------------- the prepare command
GOOD = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"},
                              {"from": "human", "value": "3+3?"}, {"from": "gpt", "value": "6"}]}


def write_jsonl(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_prepare_reports_every_bad_row_with_file_and_line(tmp_path, tiny_llama):
    source = write_jsonl(tmp_path / "chats.jsonl", [
        GOOD, SHAREGPT, '{"messages": [', "[1, 2]",
        {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]},
        {"messages": [{"role": "user", "content": "q"}]}, GOOD,
    ])
    report = prepare(PrepareConfig(input=[str(source)], out=str(tmp_path / "out"), eval_fraction=0.34,
                                   max_length=40), target=tiny_llama)
    assert (report["rows_read"], report["rows_kept"], report["rows_rejected"]) == (7, 3, 4)
    assert [(r["file"], r["line"]) for r in report["rejected"]] == [(str(source), n) for n in (3, 4, 5, 6)]
    assert "broken JSON" in report["rejected"][0]["reason"] and "unknown role" in report["rejected"][2]["reason"]
    on_disk = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    assert on_disk["rejected"] == report["rejected"] and on_disk["truncated"] == report["truncated"] == 1
    data = load_prepared(tmp_path / "out")
    assert set(data) == {"train", "eval"} and len(data["train"]) + len(data["eval"]) == 3
    assert len(data["eval"]) == 1
    rows = list(data["train"]) + list(data["eval"])
    assert sum(r["length"] for r in rows) == report["tokens"]
    assert sum(sum(r["loss_mask"]) for r in rows) == report["trainable_tokens"]
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) == r["length"] <= 40 for r in rows)
    counts = load_token_counts(tmp_path / "out")
    assert int(counts.sum()) == sum(sum(r["loss_mask"]) for r in data["train"])

    with pytest.raises(DraftsmithError, match=r"chats.jsonl:3: broken JSON"):
        prepare(PrepareConfig(input=[str(source)], out=str(tmp_path / "strict"), strict=True), target=tiny_llama)


def test_prepare_reads_json_parquet_and_saved_datasets(tmp_path, tiny_llama):
    import datasets

    (tmp_path / "rows.json").write_text(json.dumps([GOOD, SHAREGPT, "oops"]))
    datasets.Dataset.from_list([GOOD, GOOD]).to_parquet(str(tmp_path / "rows.parquet"))
    datasets.Dataset.from_list([SHAREGPT]).save_to_disk(str(tmp_path / "saved"))
    report = prepare(PrepareConfig(input=[str(tmp_path / "rows.json"), str(tmp_path / "rows.parquet"),
                                          str(tmp_path / "saved")], out=str(tmp_path / "out"), eval_fraction=0.0),
                     target=tiny_llama)
    assert (report["rows_read"], report["rows_kept"]) == (6, 5)
    assert report["rejected"] == [{"file": str(tmp_path / "rows.json"), "line": 3,
                                   "reason": "row is not a JSON object but str"}]


def test_a_mix_takes_the_first_rows_of_each_input_up_to_its_share(tmp_path, tiny_llama):
    def numbered(name, count):
        return write_jsonl(tmp_path / f"{name}.jsonl", [{"messages": [
            {"role": "user", "content": f"{name} {i}?"}, {"role": "assistant", "content": f"{name} answer {i}"}]}
            for i in range(count)])

    inputs = [str(numbered("first", 5)), str(numbered("second", 2)), str(numbered("third", 4))]
    rows_read, rows = read_conversations(inputs, _Rejections(strict=True), max_rows_per_input=3)
    assert rows_read == 8
    assert [(Path(source).stem, line) for source, line, _ in rows] == [
        ("first", 1), ("first", 2), ("first", 3), ("second", 1), ("second", 2),
        ("third", 1), ("third", 2), ("third", 3)]
    _, rows = read_conversations(inputs, _Rejections(strict=True), max_rows=6, max_rows_per_input=3)
    assert [(Path(source).stem, line) for source, line, _ in rows][-1] == ("third", 1)

    report = prepare(PrepareConfig(input=inputs, out=str(tmp_path / "out"), eval_fraction=0.0, max_rows_per_input=1),
                     target=tiny_llama)
    assert (report["rows_read"], report["max_rows_per_input"]) == (3, 1)
    with pytest.raises(DraftsmithError, match="count rows"):
        PrepareConfig(input=inputs, max_rows_per_input=-1).validate()


def test_prepare_refuses_empty_or_missing_files(tmp_path, tiny_llama):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DraftsmithError, match="empty"):
        prepare(PrepareConfig(input=[str(tmp_path / "empty.jsonl")], out=str(tmp_path / "o")), target=tiny_llama)
    with pytest.raises(DraftsmithError, match="does not exist"):
        prepare(PrepareConfig(input=[str(tmp_path / "nope.jsonl")], out=str(tmp_path / "o")), target=tiny_llama)
