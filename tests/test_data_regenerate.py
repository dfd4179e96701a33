"""Regeneration: assistant turns rewritten by the target, originals kept, resumable after kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare
from draftsmith.data.regenerate import read_cache, regenerate_batch

ROOT = Path(__file__).resolve().parents[1]


def test_multi_turn_regeneration_sees_earlier_regenerated_turns(monkeypatch, tiny_llama):
    import draftsmith.data.regenerate as regenerate

    seen = []

    def fake_generate(target, prompts, temperature, max_new_tokens, chat_template=None):
        seen.append(prompts)
        return [f"new answer to {p[-1]['content']} after {sum(m['role'] == 'assistant' for m in p)}" for p in prompts]

    monkeypatch.setattr(regenerate, "generate", fake_generate)
    chats = [[{"role": "user", "content": "q1"}, {"role": "assistant", "content": "old1"},
              {"role": "user", "content": "q2"}, {"role": "assistant", "content": "old2"}],
             [{"role": "user", "content": "p1"}, {"role": "assistant", "content": "old"}]]
    new = regenerate_batch(tiny_llama, chats, 0.0, 8)
    assert [m["content"] for m in new[0] if m["role"] == "assistant"] == ["new answer to q1 after 0", "new answer to q2 after 1"]
    assert seen[1][0][1]["content"] == "new answer to q1 after 0"  # turn 2 was conditioned on the new turn 1
    assert len(seen[0]) == 2 and len(seen[1]) == 1  # batched by turn
    assert chats[0][1]["content"] == "old1"  # inputs are not modified


def test_regeneration_with_real_generate_keeps_originals(tmp_path, tiny_llama):
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
            for i in range(5)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = PrepareConfig(input=[str(tmp_path / "c.jsonl")], out=str(tmp_path / "out"), eval_fraction=0.0,
                           regenerate=True, max_new_tokens=6, batch_size=2)
    report = prepare(config, target=tiny_llama)
    assert report["regenerated"] and report["rows_kept"] == 5
    train = load_prepared(tmp_path / "out")["train"]
    originals = [json.loads(m) for m in train["original_messages"]]
    assert [o[1]["content"] for o in originals] == [f"answer {i}" for i in range(5)]
    cache = read_cache(tmp_path / "out" / "regenerated.jsonl")
    assert len(cache) == 5
    # rerun: nothing is generated again, the same answers come back
    again = prepare(config, target=tiny_llama)
    assert again["tokens"] == report["tokens"]
    assert len((tmp_path / "out" / "regenerated.jsonl").read_text().splitlines()) == 5


def test_regeneration_survives_kill_9(tmp_path, tiny_llama):
    folder = tmp_path / "model"
    tiny_llama.model.save_pretrained(folder)
    tiny_llama.tokenizer.save_pretrained(folder)
    rows = [{"messages": [{"role": "user", "content": f"question number {i}"}, {"role": "assistant", "content": "x"}]}
            for i in range(120)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, "-m", "draftsmith.data.commands", "prepare", "--target", str(folder), "--input",
               str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "out"), "--regenerate", "--batch-size", "2",
               "--max-new-tokens", "12", "--eval-fraction", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    cache_file = tmp_path / "out" / "regenerated.jsonl"
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and (not cache_file.exists() or cache_file.read_text().count("\n") < 6):
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = cache_file.read_text().count("\n")
    assert 6 <= partial < 120, "regeneration finished before the kill; make it longer"
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    keys = [json.loads(line)["key"] for line in cache_file.read_text().splitlines()]
    assert sorted(keys) == sorted(f"{tmp_path / 'c.jsonl'}:{i + 1}" for i in range(120))  # each row exactly once
    train = load_prepared(tmp_path / "out")["train"]
    assert len(train) == 120
    assert [json.loads(m)[0]["content"] for m in train["original_messages"]] == [f"question number {i}" for i in range(120)]


def test_sampled_generation_is_batched_and_seeded(tiny_llama):
    from draftsmith.data.regenerate import generate

    prompts = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a longer question here"}]]
    torch.manual_seed(1)
    first = generate(tiny_llama, prompts, 1.0, 8)
    torch.manual_seed(1)
    assert generate(tiny_llama, prompts, 1.0, 8) == first and len(first) == 2
    greedy = generate(tiny_llama, prompts, 0.0, 8)
    assert greedy == generate(tiny_llama, prompts, 0.0, 8)
    # left padding does not change a greedy answer: the short prompt alone gives the same text
    assert generate(tiny_llama, prompts[:1], 0.0, 8) == greedy[:1]


def test_greedy_generation_drops_finished_rows_and_writes_what_transformers_generate_writes(tiny_llama):
    """Rows that reach EOS leave the batch (every later forward is smaller), and each response is the one
    transformers' generate() writes with the same prompts, padding and EOS."""
    from draftsmith.data.regenerate import generate
    from draftsmith.data.templates import encode_prompt

    tokenizer, model = tiny_llama.tokenizer, tiny_llama.model
    prompts = [[{"role": "user", "content": text}] for text in ("hi", "a longer question here", "why?", "tell me more")]
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[tokenizer.pad_token_id or 0] * (width - len(e)) + e for e in encoded])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(e) for e in encoded])[:, None]).long()
    free = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[:, width:]
    tokenizer.eos_token_id = int(free[0, 3])  # an EOS that ends the first row early and some others maybe
    assert tokenizer.eos_token_id == int(free[0, 3])
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=0)[:, width:]
    eos = tokenizer.eos_token_id
    ends = [row.tolist().index(eos) + 1 if eos in row.tolist() else len(row) for row in reference]  # pads follow EOS
    expected = [tokenizer.decode(row[:end], skip_special_tokens=True).strip() for row, end in zip(reference, ends)]
    assert min(ends) < 12  # some row ended early
    rows, forward = [], model.forward
    model.forward = lambda *args, **kwargs: rows.append(kwargs["input_ids"].shape[0]) or forward(*args, **kwargs)
    try:
        got = generate(tiny_llama, prompts, 0.0, 12)
    finally:
        del model.forward
    assert got == expected
    assert rows[0] == 4 and min(rows) < 4 and rows == sorted(rows, reverse=True)  # the batch only shrinks
    assert len(rows) <= 12


def test_regeneration_runs_in_the_asked_dtype_on_a_copy(monkeypatch, tmp_path, tiny_llama):
    import draftsmith.data.regenerate as regenerate

    writers = []

    def fake_generate(target, prompts, temperature, max_new_tokens, chat_template=None):
        writers.append(target.dtype)
        return [f"answer in {target.dtype}" for _ in prompts]

    monkeypatch.setattr(regenerate, "generate", fake_generate)
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "old"}]}
            for i in range(3)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for dtype, expected in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        config = PrepareConfig(input=[str(tmp_path / "c.jsonl")], out=str(tmp_path / dtype), eval_fraction=0.0,
                               regenerate=True, max_new_tokens=4, batch_size=3, dtype=dtype)
        report = prepare(config, target=tiny_llama)
        assert writers[-1] == expected and report["regenerated_in"] == str(expected).removeprefix("torch.")
        assert tiny_llama.dtype == torch.float32  # the caller's target keeps its weights
        answers = [json.loads(m)[1]["content"] for m in load_prepared(tmp_path / dtype)["train"]["messages"]]
        assert answers == [f"answer in {expected}"] * 3
