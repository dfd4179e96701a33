"""Any target, not just the built-in one: base models without a chat template, other architectures,
large vocabularies, and data that is never reused for a target it was not made for."""

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from draftsmith.cli import main
from draftsmith.config import load
from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare
from draftsmith.data.templates import tokenize_record
from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts import load_prompts
from draftsmith.target import Target, load_target, target_slug
from draftsmith.train.config import TrainConfig
from tiny import CHATML, base_tokenizer, save_target, tiny_model, tiny_target

ROOT = Path(__file__).resolve().parents[1]
LARGE_VOCAB = 131072  # a padded vocabulary much larger than the tokenizer's, as many real models have


def base_target(vocab_size: int = 320, arch: str = "qwen2") -> Target:
    """A template-less base model whose tokenizer adds a BOS (id 259) in front of every text."""
    model = tiny_model(arch, vocab_size=vocab_size, bos_token_id=259, eos_token_id=256, pad_token_id=256)
    return Target(model, base_tokenizer(), name=f"tiny-base-{arch}")


def text_rows(count: int) -> list[dict]:
    """Plain-text rows a base model trains on: documents and prompt/completion pairs."""
    rows = []
    for k in range(count):
        numbers = " ".join(str(k + i) for i in range(12))
        rows.append({"text": f"def count_{k}():\n    return '{numbers}'\n"} if k % 2 else
                    {"prompt": f"# count from {k}\n", "completion": numbers + "\n"})
    return rows


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


# --------------------------------------------------------------------------- base models
def test_text_and_completion_rows_keep_the_bos_and_train_the_right_tokens():
    tokenizer = base_tokenizer()
    text = tokenize_record(tokenizer, {"prompt": "", "completion": "ab"})
    assert text.input_ids == [259, 64, 65, 256] and text.loss_mask == [0, 1, 1, 1]  # BOS, a, b, EOS
    pair = tokenize_record(tokenizer, {"prompt": "q:", "completion": "ab"})
    assert pair.input_ids[0] == 259 and pair.input_ids[-1] == 256
    trained = [t for t, m in zip(pair.input_ids, pair.loss_mask) if m]
    assert tokenizer.decode(trained) == "ab<|endoftext|>"  # the completion and the stop, not the prompt


def test_a_base_model_prepares_plain_text_and_refuses_conversations_with_the_options_named(tmp_path):
    target = base_target()
    source = write_jsonl(tmp_path / "texts.jsonl", text_rows(10))
    report = prepare(PrepareConfig(input=[source], out=str(tmp_path / "data"), eval_fraction=0.2), target=target)
    assert report["rows_kept"] == 10 and report["chat_template_sha256"] is None
    rows = list(load_prepared(tmp_path / "data", target)["train"])
    assert all(row["input_ids"][0] == 259 and row["loss_mask"][0] == 0 for row in rows)

    chats = write_jsonl(tmp_path / "chats.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                                 {"role": "assistant", "content": "hello"}]}])
    with pytest.raises(DraftsmithError, match=r"--chat-template.*prepare\.chat_template.*\"text\"") as err:
        prepare(PrepareConfig(input=[chats], out=str(tmp_path / "chat")), target=target)
    assert "tokenizer_config.json" not in str(err.value)  # advice a .gguf user cannot follow

    template_file = tmp_path / "chatml.jinja"
    template_file.write_text(CHATML)
    for given in (CHATML, str(template_file)):
        report = prepare(PrepareConfig(input=[chats], out=str(tmp_path / "chat"), eval_fraction=0.0,
                                       chat_template=given), target=target)
        row = load_prepared(tmp_path / "chat")["train"][0]
        trained = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert target.tokenizer.decode(trained) == "hello" and report["chat_template_sha256"]
    with pytest.raises(DraftsmithError, match=r"prepare.chat_template.*neither a Jinja chat template"):
        prepare(PrepareConfig(input=[chats], out=str(tmp_path / "x"), chat_template="no/such/file.jinja"),
                target=target)


def test_eval_prompts_of_a_base_model_start_with_its_bos(tmp_path):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "def f():"}])
    base = load_prompts(prompts, base_target())
    assert base[0].token_ids[0] == 259 and len(base[0].token_ids) == 1 + len("def f():")
    templated = load_prompts(prompts, base_target(), chat_template=CHATML)
    assert 259 not in templated[0].token_ids  # a template writes its own start; nothing is added to it


# --------------------------------------------------------------------------- provenance
def test_data_made_for_one_target_is_refused_by_another(tmp_path):
    llama = tiny_target("llama")
    other = base_target()  # same vocabulary size, another tokenizer
    rows = [{"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"answer {k}"}]}
            for k in range(8)]
    source = write_jsonl(tmp_path / "chats.jsonl", rows)
    prepare(PrepareConfig(input=[source], out=str(tmp_path / "data"), draft_vocab_size=8), target=llama)
    load_prepared(tmp_path / "data", llama)  # its own target reads it
    with pytest.raises(DraftsmithError, match=r"'.*data'.*target 'tiny-base-qwen2'.*made for target 'tiny-llama'"):
        load_prepared(tmp_path / "data", other)
    from draftsmith.data.vocab import load_draft_vocab

    load_draft_vocab(tmp_path / "data", llama)
    with pytest.raises(DraftsmithError, match=r"draft vocabulary .* does not fit target 'tiny-base-qwen2'.*tokenizer"):
        load_draft_vocab(tmp_path / "data", other)
    from draftsmith.data.offline import CaptureConfig, write_capture

    with pytest.raises(DraftsmithError, match="made for target 'tiny-llama'"):
        write_capture(CaptureConfig(target="x", data=str(tmp_path / "data"), out=str(tmp_path / "feat"),
                                    layers="1,2"), target=other)


def test_recipe_paths_follow_the_target_name():
    recipe = ROOT / "recipes/smollm2-135m/eagle3.yaml"
    default = load(TrainConfig, recipe)
    assert default.data.prepared == "runs/smollm2-135m-instruct/data-mix" == default.data.draft_vocab
    assert default.data.features == "runs/smollm2-135m-instruct/features-mix-top8"
    other = load(TrainConfig, recipe, ["target.name=/models/Llama-3.2-1B.gguf"])
    assert other.data.prepared == "runs/llama-3.2-1b/data-mix" and other.output_dir == "runs/llama-3.2-1b/eagle3"
    assert target_slug("Qwen/Qwen3-0.6B") == "qwen3-0.6b" and target_slug("/a/b/base-model/") == "base-model"


# --------------------------------------------------------------------------- completion marks
def test_a_refused_or_crashed_prepare_never_looks_finished(tmp_path, monkeypatch):
    target = tiny_target()
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"ab{k}"}]}
            for k in range(6)]
    source = write_jsonl(tmp_path / "chats.jsonl", rows)
    unanswerable = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "q"}]}] * 3)
    with pytest.raises(DraftsmithError, match="No usable rows"):
        prepare(PrepareConfig(input=[unanswerable], out=str(tmp_path / "fresh")), target=target)
    assert not (tmp_path / "fresh" / "prepare_report.json").exists()

    prepare(PrepareConfig(input=[source], out=str(tmp_path / "data"), draft_vocab_size=4), target=target)
    before = {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir() if p.is_file()}
    with pytest.raises(DraftsmithError, match="No usable rows"):
        prepare(PrepareConfig(input=[unanswerable], out=str(tmp_path / "data"), draft_vocab_size=4), target=target)
    assert {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir() if p.is_file()} == before  # untouched

    import draftsmith.data.prepared as prepared_module

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(prepared_module, "save_token_counts", crash)
    with pytest.raises(OSError):
        prepare(PrepareConfig(input=[source], out=str(tmp_path / "data"), max_length=40), target=target)
    assert not (tmp_path / "data" / "prepare_report.json").exists()  # the next run prepares again


# --------------------------------------------------------------------------- end to end
def run_recipe(tmp_path: Path, target_folder: str, inputs: list[str], prompts: str, draft_vocab: int) -> dict:
    recipe = {
        "target": {"name": target_folder},
        "prepare": {"input": inputs, "max_length": 64, "eval_fraction": 0.2, "draft_vocab_size": draft_vocab},
        "data": {"prepared": f"{tmp_path}/runs/{{target}}/data", "online": True,
                 "draft_vocab": f"{tmp_path}/runs/{{target}}/data" if draft_vocab else None,
                 "batch_size": 2, "max_length": 48},
        "drafter": {"kind": "eagle", "variant": "eagle3", "ttt_steps": 2},
        "train": {"max_steps": 4, "lr": 1e-3, "warmup_steps": 1, "precision": "fp32", "eval_every": 2,
                  "checkpoint_every": 2},
        "eval": {"batches": 1, "num_prompts": 1, "max_new_tokens": 6, "draft_length": 3},
        "report": {"num_prompts": 2, "prompts": prompts, "max_new_tokens": 10, "draft_length": 3,
                   "transformers_baseline": False},
        "output_dir": f"{tmp_path}/runs/{{target}}/eagle3",
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    run = tmp_path / "runs" / target_slug(target_folder)
    results = json.loads((run / "eagle3" / "eval" / "results.json").read_text())
    assert results["lossless"] == {"checked": 2, "identical": 2}
    assert main(["export", str(run / "eagle3" / "best"), "--format", "speculators", "--out", str(tmp_path / "ex")]) == 0
    return {"run": run, "results": results, "export": json.loads((tmp_path / "ex" / "config.json").read_text())}


def test_qwen3_target_prepares_trains_evaluates_and_exports(tmp_path):
    target = tiny_target("qwen3")
    folder = save_target(target, tmp_path / "qwen3-chat")
    rows = [{"messages": [{"role": "user", "content": f"count from {k}"},
                          {"role": "assistant", "content": " ".join(str(k + i) for i in range(10))}]} for k in range(30)]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "count from 4"}, {"prompt": "count from 9"}])
    done = run_recipe(tmp_path, folder, [write_jsonl(tmp_path / "chats.jsonl", rows)], prompts, draft_vocab=8)
    assert (done["run"] / "data" / "prepare_report.json").is_file()
    assert done["export"]["transformer_layer_config"]["eos_token_id"] == target.model.config.eos_token_id


def test_large_vocabulary_base_model_end_to_end_without_storing_the_frozen_parts(tmp_path):
    target = base_target(vocab_size=LARGE_VOCAB)
    folder = save_target(target, tmp_path / "base-qwen2")
    inputs = [write_jsonl(tmp_path / "texts.jsonl", text_rows(30))]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "# count from 4\n"}, {"prompt": "def count_9():"}])
    done = run_recipe(tmp_path, folder, inputs, prompts, draft_vocab=0)
    embedding_bytes = LARGE_VOCAB * 64 * 4
    best = done["run"] / "eagle3" / "best" / "model.safetensors"
    assert "embed_tokens.weight" not in load_file(str(best))
    checkpoint = sorted((done["run"] / "eagle3").glob("checkpoint-*"))[-1]
    stored = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    # A full-vocabulary EAGLE-3 head (V x H) is the drafter's own: stored in the accelerate state and in
    # drafter/, plus AdamW's two moments = 4 heads. The frozen embedding (as large) was stored twice more.
    head_bytes = LARGE_VOCAB * 64 * 4
    assert 4 * head_bytes < stored < 4 * head_bytes + embedding_bytes / 2
    assert not any("embed" in name for name in load_file(str(checkpoint / "model.safetensors")))
    layer = done["export"]["transformer_layer_config"]
    assert (layer["bos_token_id"], layer["eos_token_id"]) == (259, 256)  # the target's, not Llama's defaults
    assert load_prompts(prompts, load_target(folder))[0].token_ids[0] == 259
    assert done["results"]["acceptance_length"] >= 1.0
