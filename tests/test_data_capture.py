"""capture: offline shards == online batches, resume after a real kill -9, verify, refusals, DP."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from draftsmith.data.capture import (
    FeatureShards, TokenDataset, batches_by_tokens, capture_batch, collate, parse_layers, read_safetensors_mmap,
)
from draftsmith.data.offline import CaptureConfig, verify_capture, write_capture
from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare
from draftsmith.errors import DraftsmithError


ROOT = Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex my bad job".split()


def conversations(count: int, seed: int = 0):
    """Deterministic synthetic chats of varied length (byte tokenizer: 1 token per byte)."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(count):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        rows.append({"messages": [{"role": "user", "content": f"{i}: {question}?"},
                                  {"role": "assistant", "content": answer}]})
    return rows


def make_prepared(directory: Path, target, count: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "chats.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in conversations(count)))
    prepare(PrepareConfig(input=[str(source)], out=str(directory / "data"), eval_fraction=0.1), target=target)
    return directory / "data"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny Llama target saved as a model folder, so subprocesses can load it by path."""
    from tiny import tiny_target

    from draftsmith.target import load_target

    folder = tmp_path_factory.mktemp("tiny-llama")
    target = tiny_target("llama")
    target.model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return folder, load_target(str(folder))


@pytest.fixture(scope="module")
def prepared(tiny_folder, tmp_path_factory):
    return make_prepared(tmp_path_factory.mktemp("prep"), tiny_folder[1], 40)


def config(data, out, **extra):
    settings = dict(layers="1,4,7", samples_per_shard=8, max_batch_tokens=1024, max_batch_size=4)
    return CaptureConfig(data=str(data), out=str(out), **{**settings, **extra})


def test_capture_in_another_dtype_uses_a_copy_and_leaves_the_target_as_it_was(tiny_folder, prepared, tmp_path):
    from draftsmith.target import in_dtype

    _, target = tiny_folder
    write_capture(config(prepared, tmp_path / "feat", target_dtype="bfloat16"), target=target)
    assert target.dtype == torch.float32  # the caller's target keeps its float32 weights
    tokens, pad = TokenDataset(load_prepared(prepared)["train"]), target.tokenizer.pad_token_id
    shards = FeatureShards(tmp_path / "feat", expect_fingerprint=target.fingerprint(), expect_layers=[1, 4, 7])
    group = batches_by_tokens(load_prepared(prepared)["train"]["length"], range(8), 1024, 4)[0]
    batch = collate([tokens[i] for i in group], pad)
    in_bf16 = capture_batch(in_dtype(target, torch.bfloat16), batch, [1, 4, 7], "bf16")
    in_fp32 = capture_batch(target, batch, [1, 4, 7], "bf16")
    offline = collate([shards[i] for i in group], pad)
    assert torch.equal(offline["features"][7], in_bf16["features"][7])  # computed by the bf16 copy...
    assert not torch.equal(offline["features"][7], in_fp32["features"][7])  # ...not by the float32 target


# --------------------------------------------------------------------------- layer specs
def test_parse_layers(tiny_llama, smollm2):
    assert parse_layers("eagle3", smollm2) == [1, 14, 26, 29]
    assert parse_layers("last", smollm2) == [29]
    assert parse_layers("3, 1,3", smollm2) == [1, 3]
    assert parse_layers("dflash:5", smollm2) == [1, 8, 14, 20, 27, 29]
    assert parse_layers("eagle3", tiny_llama) == [1, 3, 4, 7]
    for bad in ("1,99", "nonsense", "dflash:1"):
        with pytest.raises(DraftsmithError):
            parse_layers(bad, smollm2)


# --------------------------------------------------------------------------- offline == online
def test_offline_batches_equal_online_batches(tiny_folder, prepared, tmp_path):
    _, target = tiny_folder
    manifest = write_capture(config(prepared, tmp_path / "feat", topk_logits=3), target=target)
    split = load_prepared(prepared)["train"]
    assert manifest["num_samples"] == len(split) and manifest["num_tokens"] == sum(split["length"])
    assert manifest["layers"] == [1, 4, 7] and manifest["target"] == target.fingerprint()
    shards = FeatureShards(tmp_path / "feat", expect_fingerprint=target.fingerprint(), expect_layers=[1, 4, 7])
    fewer = FeatureShards(tmp_path / "feat", expect_fingerprint=target.fingerprint(), expect_layers=[7, 1])
    assert sorted(fewer[3]["features"]) == [1, 7]  # a drafter's batches hold the layers it reads, not the whole capture
    assert torch.equal(fewer[3]["features"][7], shards[3]["features"][7])
    assert sorted(FeatureShards(tmp_path / "feat")[3]["features"]) == [1, 4, 7]  # no expectation: every layer
    tokens = TokenDataset(split)
    assert len(shards) == len(tokens)
    assert shards.lengths() == tokens.lengths() == [len(tokens[i]["input_ids"]) for i in range(len(tokens))]
    pad = target.tokenizer.pad_token_id
    # the same groups the capture used: bit-identical batches
    for group in batches_by_tokens(split["length"], range(8), 1024, 4):
        online = capture_batch(target, collate([tokens[i] for i in group], pad), [1, 4, 7], "bf16", topk_logits=3)
        offline = collate([shards[i] for i in group], pad)
        for key in ("input_ids", "loss_mask", "attention_mask", "sample_ids"):
            assert torch.equal(online[key], offline[key]), key
        for layer in (1, 4, 7):
            assert offline["features"][layer].dtype == torch.bfloat16
            assert torch.equal(online["features"][layer], offline["features"][layer])
        for key in ("values", "indices"):
            assert torch.equal(online["target_topk"][key], offline["target_topk"][key])
    # any other grouping (as a shuffling trainer makes): same values up to bf16 rounding
    group = [12, 3, 30, 7]
    online = capture_batch(target, collate([tokens[i] for i in group], pad), [1, 4, 7], "bf16")
    offline = collate([shards[i] for i in group], pad)
    assert torch.equal(online["input_ids"], offline["input_ids"])
    for layer in (1, 4, 7):
        torch.testing.assert_close(online["features"][layer].float(), offline["features"][layer].float(),
                                   rtol=1e-2, atol=1e-2)
    # the stored feature of the last layer gives the target's own logits through the head
    item = shards[5]
    logits = target.forward(item["input_ids"][None], layers=[]).logits[0]
    assert (target.head(item["features"][7].float()).argmax(-1) == logits.argmax(-1)).float().mean() > 0.95


def test_bytes_on_disk_close_to_raw_and_verify(tiny_folder, prepared, tmp_path):
    _, target = tiny_folder
    manifest = write_capture(config(prepared, tmp_path / "feat"), target=target)
    on_disk = sum(shard["bytes"] for shard in manifest["shards"])
    raw = manifest["num_tokens"] * 3 * target.hidden_size * 2
    assert raw < on_disk < raw * 1.05  # ids + mask + headers; H=64 makes the overhead look bigger than it is
    assert verify_capture(tmp_path / "feat")["ok"]
    shard = tmp_path / "feat" / manifest["shards"][1]["file"]
    blob = bytearray(shard.read_bytes())
    blob[-10] ^= 0xFF
    shard.write_bytes(bytes(blob))
    with pytest.raises(DraftsmithError, match="sha256 mismatch"):
        verify_capture(tmp_path / "feat")


@pytest.mark.parametrize("dtype, topk", [("bf16", 0), ("fp32", 4), ("fp8", 4)])
def test_the_bytes_per_token_formula_is_what_the_shards_hold(tiny_folder, prepared, tmp_path, dtype, topk):
    from draftsmith.data.capture import feature_bytes_per_token

    _, target = tiny_folder
    manifest = write_capture(config(prepared, tmp_path / "feat", dtype=dtype, topk_logits=topk), target=target)
    per_token = feature_bytes_per_token(target.hidden_size, 3, dtype, topk)
    for shard in manifest["shards"]:
        tensors, _ = read_safetensors_mmap(tmp_path / "feat" / shard["file"])
        samples = len(shard["sample_ids"])
        assert sum(t.nbytes for t in tensors.values()) == shard["num_tokens"] * per_token + 16 * samples + 8


def test_reader_refuses_other_target_or_missing_layers(tiny_folder, prepared, tmp_path, tiny_qwen3):
    _, target = tiny_folder
    write_capture(config(prepared, tmp_path / "feat"), target=target)
    with pytest.raises(DraftsmithError, match="cannot train a drafter for this target"):
        FeatureShards(tmp_path / "feat", expect_fingerprint=tiny_qwen3.fingerprint())
    with pytest.raises(DraftsmithError, match=r"missing \[2\]"):
        FeatureShards(tmp_path / "feat", expect_layers=[1, 2])
    with pytest.raises(DraftsmithError, match="different settings"):
        write_capture(CaptureConfig(**{**config(prepared, tmp_path / "feat").__dict__, "layers": "1,2"}), target=target)
    with pytest.raises(DraftsmithError, match="not a finished capture"):
        FeatureShards(tmp_path)


# --------------------------------------------------------------------------- kill -9 and resume
def test_fp8_capture_is_near_half_of_bf16_reads_back_within_e4m3_rounding_and_verifies(tiny_folder, prepared, tmp_path):
    _, target = tiny_folder
    half = write_capture(config(prepared, tmp_path / "bf16"), target=target)
    fp8 = write_capture(config(prepared, tmp_path / "fp8", dtype="fp8"), target=target)
    assert fp8["dtype"] == "float8_e4m3fn" and verify_capture(tmp_path / "fp8")["ok"]
    features = {name: 3 * manifest["num_tokens"] * target.hidden_size * width
                for name, manifest, width in (("bf16", half, 2), ("fp8", fp8, 1))}
    size = {name: sum(shard["bytes"] for shard in manifest["shards"]) for name, manifest in (("bf16", half), ("fp8", fp8))}
    assert size["bf16"] - size["fp8"] > 0.9 * (features["bf16"] - features["fp8"])  # 1 byte a value + a scale a token
    bf16, quantised = FeatureShards(tmp_path / "bf16"), FeatureShards(tmp_path / "fp8")
    errors = []
    for i in range(len(bf16)):
        for layer in (1, 4, 7):
            x, y = bf16[i]["features"][layer].float(), quantised[i]["features"][layer]
            assert y.dtype == torch.bfloat16 and not torch.equal(y.float(), x)
            error, row_max = (y.float() - x).abs(), x.abs().amax(-1, keepdim=True)
            assert (error <= 0.07 * x.abs() + row_max * 1e-5).all()  # e4m3: 3 mantissa bits, scaled per token
            errors.append(error.sum() / x.abs().sum())
    assert 0.005 < float(torch.stack(errors).mean()) < 0.04
    with pytest.raises(DraftsmithError, match="fp8"):
        write_capture(config(prepared, tmp_path / "bad", dtype="int4"), target=target)


def capture_command(target_dir, data, out, *extra):
    return [sys.executable, "-m", "draftsmith.data.commands", "capture", "--target", str(target_dir),
            "--data", str(data), "--out", str(out), "--layers", "1,4,7", "--samples-per-shard", "2",
            "--max-batch-size", "1", *extra]


def test_capture_survives_kill_9_and_resumes(tiny_folder, tmp_path):
    folder, target = tiny_folder
    data = make_prepared(tmp_path, target, 250)
    out = tmp_path / "feat"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(capture_command(folder, data, out), env=env, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out.glob("shard-*.json"))) < 5:
        time.sleep(0.02)
    time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "manifest.json").exists(), "capture finished before the kill; make it longer"
    # every visible shard is complete: it parses and holds exactly its samples
    visible = sorted(out.glob("shard-*.safetensors"))
    assert visible
    for shard in visible:
        tensors, _ = read_safetensors_mmap(shard)
        k = int(shard.stem.split("-")[1])
        assert tensors["sample_ids"].tolist() == [2 * k, 2 * k + 1]
        assert tensors["features.7"].shape[0] == tensors["offsets"][-1]
    result = subprocess.run(capture_command(folder, data, out), env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert verify_capture(out)["ok"]
    # the resumed capture equals an uninterrupted one, every sample exactly once
    reference = write_capture(config(data, tmp_path / "ref", samples_per_shard=2, max_batch_size=1), target=target)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["sample_ids"] for s in manifest["shards"]] == [s["sample_ids"] for s in reference["shards"]]
    assert manifest["num_tokens"] == reference["num_tokens"]
    resumed, fresh = FeatureShards(out), FeatureShards(tmp_path / "ref")
    for i in range(0, len(fresh), 37):
        assert torch.equal(resumed[i]["input_ids"], fresh[i]["input_ids"])
        torch.testing.assert_close(resumed[i]["features"][4].float(), fresh[i]["features"][4].float(),
                                   rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- data parallel
def test_data_parallel_capture_equals_single_process(tiny_folder, prepared, tmp_path):
    folder, target = tiny_folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
              "draftsmith.data.commands", "capture", "--target", str(folder), "--data", str(prepared),
              "--out", str(tmp_path / "dp"), "--layers", "1,4,7", "--samples-per-shard", "4"]
    result = subprocess.run(launch, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    single = write_capture(config(prepared, tmp_path / "one", samples_per_shard=4,
                                  max_batch_tokens=8192, max_batch_size=16), target=target)
    manifest = json.loads((tmp_path / "dp" / "manifest.json").read_text())
    assert [s["sample_ids"] for s in manifest["shards"]] == [s["sample_ids"] for s in single["shards"]]
    parallel, one = FeatureShards(tmp_path / "dp"), FeatureShards(tmp_path / "one")
    assert len(parallel) == len(one)
    for i in range(len(one)):
        assert torch.equal(parallel[i]["input_ids"], one[i]["input_ids"])
        torch.testing.assert_close(parallel[i]["features"][7].float(), one[i]["features"][7].float(),
                                   rtol=1e-2, atol=1e-2)


def test_capture_command_line_and_verify(tiny_folder, prepared, tmp_path, capsys):
    import pickle

    from draftsmith.data.commands import main

    folder, _ = tiny_folder
    out = tmp_path / "feat"
    assert main(["capture", "--target", str(folder), "--data", str(prepared), "--out", str(out),
                 "--layers", "eagle3", "--dtype", "fp16", "--samples-per-shard", "16"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layers"] == [1, 3, 4, 7] and manifest["dtype"] == "float16" and manifest["num_shards"] == 3
    assert main(["capture", "--verify", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ok"]
    shards = pickle.loads(pickle.dumps(FeatureShards(out)))  # what DataLoader workers receive
    assert shards[0]["features"][3].dtype == torch.float16
    (out / "shard-00001.safetensors").unlink()
    assert main(["capture", "--verify", str(out)]) == 2
    assert "missing" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_eagle3_capture_gives_the_targets_own_predictions(smollm2, tmp_path):
    """Real target: prepare 6 builtin:stdlib conversations, capture eagle3, head(layer 29) == logits."""
    prepare(PrepareConfig(input=["builtin:stdlib"], out=str(tmp_path / "data"), max_rows=6, eval_fraction=0.0,
                          max_length=256), target=smollm2)
    manifest = write_capture(CaptureConfig(data=str(tmp_path / "data"), out=str(tmp_path / "feat"), dtype="fp32"),
                             target=smollm2)
    assert manifest["layers"] == [1, 14, 26, 29] and manifest["num_samples"] == 6
    shards = FeatureShards(tmp_path / "feat", expect_fingerprint=smollm2.fingerprint(), expect_layers=[1, 14, 26, 29])
    item = shards[2]
    logits = smollm2.forward(item["input_ids"][None], layers=[]).logits[0]
    torch.testing.assert_close(smollm2.head(item["features"][29]), logits, rtol=1e-3, atol=1e-3)
    assert verify_capture(tmp_path / "feat")["ok"]
