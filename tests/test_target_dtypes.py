"""A target's dtype is the target's business: fp32, bf16 and fp16 targets prepare (with regeneration), capture,
train online and offline, and decode losslessly with every trained kind, and the drafter keeps its own precision.

The tiny target is a Gemma: its final norm returns its input's dtype, so bf16 features meet the fp32 head there
(the crash a Gemma/OLMo-2 user hit with bf16 feature shards on a CPU without bf16 autocast)."""

import json
import math

import pytest
import torch
import yaml

from draftsmith.cli import main
from draftsmith.data.capture import capture_batch, collate
from draftsmith.drafters import kind_module
from draftsmith.target import Target, load_target
from draftsmith.train.config import drafter_config
from tiny import byte_tokenizer, tiny_model

KINDS = {
    "eagle3": {"kind": "eagle", "variant": "eagle3", "ttt_steps": 2},
    "eagle1": {"kind": "eagle", "variant": "eagle1"},
    "medusa1": {"kind": "medusa", "num_heads": 2, "num_layers": 1},
    "medusa2": {"kind": "medusa", "num_heads": 2, "num_layers": 1, "lora_rank": 2, "lora_target_modules": "all-linear"},
    "mtp": {"kind": "mtp", "num_modules": 2},
    "dflash": {"kind": "dflash", "block_size": 4, "num_layers": 1, "num_target_layers": 2, "anchors_per_sequence": 2},
    "dspark": {"kind": "dflash", "variant": "dspark", "block_size": 4, "num_layers": 1, "num_target_layers": 2,
               "anchors_per_sequence": 2, "markov_rank": 4},
    "draft_lm": {"kind": "draft_lm", "num_layers": 1},
}


def gemma_target(dtype: torch.dtype = torch.float32) -> Target:
    model = tiny_model("gemma", head_dim=16, num_layers=8).to(dtype)
    return Target(model, byte_tokenizer(), name=f"tiny-gemma-{dtype}")


def conversations(count: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"count from {k}"},
                          {"role": "assistant", "content": " ".join(str(k + i) for i in range(8))}]}
            for k in range(count)]


@pytest.mark.parametrize("arch", ["gemma", "olmo2", "llama"])
def test_bf16_features_meet_a_float32_head_whatever_the_norm_returns(arch):
    """The reported crash, at its root: `TargetHead` gets bf16 features (the storage dtype) and an fp32 head."""
    target = Target(tiny_model(arch, head_dim=16), byte_tokenizer(), name=arch)
    features = torch.randn(3, target.hidden_size)
    expected = target.head(features)
    rows = torch.tensor([1, 5, 9])
    for given in (features.bfloat16(), features.half()):
        assert target.head(given).dtype == torch.float32
        logits, argmax = target.head.draft_targets(given, rows)
        assert logits.dtype == torch.float32 and logits.shape == (3, 3)
        torch.testing.assert_close(logits, target.head(given)[:, rows])
        assert torch.equal(argmax, target.head(given).argmax(-1))
    torch.testing.assert_close(target.head(features.bfloat16()), expected, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_trains_in_float32_on_a_target_of_any_dtype(name, dtype):
    """Drafter parameters are float32 whatever the target computes in; one online loss and backward is finite."""
    target = gemma_target(dtype)
    target.model.requires_grad_(False)
    kind, options = drafter_config(dict(KINDS[name]))
    drafter = kind_module(kind).create(options, target, None)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    generator = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(0, 250, (24,), generator=generator), "loss_mask": torch.ones(24, dtype=torch.long)}
             for _ in range(2)]
    batch = capture_batch(target, collate(items), drafter.required_layers, topk_logits=0)
    loss, _ = drafter.loss(batch, target.head)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in trainable)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)


def run_recipe(tmp_path, target_folder: str, drafter: dict, dtype: str, online: bool, name: str) -> dict:
    recipe = {
        "target": {"name": target_folder, "dtype": dtype},
        "prepare": {"input": [str(tmp_path / "chats.jsonl")], "regenerate": True, "max_new_tokens": 12,
                    "batch_size": 4, "max_length": 64, "eval_fraction": 0.2},
        "data": {"prepared": str(tmp_path / "data"), "online": online,
                 "features": None if online else str(tmp_path / f"features-{name}"),
                 "topk_logits": 0 if online else 4, "batch_size": 2, "max_length": 48},
        "drafter": drafter,
        "train": {"max_steps": 2, "lr": 1e-3, "warmup_steps": 1, "precision": "fp32", "eval_every": 2,
                  "checkpoint_every": 2},
        "eval": {"batches": 1, "num_prompts": 1, "max_new_tokens": 6, "draft_length": 2},
        "report": {"num_prompts": 2, "prompts": str(tmp_path / "prompts.jsonl"), "max_new_tokens": 10,
                   "draft_length": 2, "transformers_baseline": False},
        "output_dir": str(tmp_path / f"run-{name}"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    return json.loads((tmp_path / f"run-{name}" / "eval" / "results.json").read_text())


@pytest.fixture(scope="module")
def bf16_gemma_folder(tmp_path_factory):
    """A bf16 Gemma target as users download one (weights stored in bf16), its conversations and prompts."""
    root = tmp_path_factory.mktemp("bf16")
    target = gemma_target(torch.bfloat16)
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    (root / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in conversations(12)))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"count from {k}"}) + "\n" for k in (3, 7)))
    return root


@pytest.mark.parametrize("name", list(KINDS))
def test_a_bf16_target_regenerates_captures_trains_and_decodes_losslessly(bf16_gemma_folder, name):
    """The whole recipe with a target loaded in bf16: regeneration, offline capture (EAGLE-3; online for the
    others, as their shipped recipes train) and training, and a report whose every output equals plain decoding."""
    root = bf16_gemma_folder
    assert load_target(str(root / "target"), dtype="bfloat16").dtype == torch.bfloat16
    results = run_recipe(root, str(root / "target"), dict(KINDS[name]), "bfloat16", online=name != "eagle3", name=name)
    assert results["lossless"] == {"checked": 2, "identical": 2}
    assert results["acceptance_length"] >= 1.0


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_eagle3_trains_offline_and_online_on_float32_and_float16_targets(tmp_path, dtype):
    """The reported path itself (float32 target, bf16 feature shards, fp32 training), and an fp16 target."""
    target = gemma_target(torch.float32)
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in conversations(10)))
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "count from 4"}) + "\n" + json.dumps({"prompt": "hi"}) + "\n")
    for online in (False, True):
        results = run_recipe(tmp_path, str(tmp_path / "target"), dict(KINDS["eagle3"]), dtype, online,
                             name=f"eagle3-{'online' if online else 'offline'}")
        assert results["lossless"] == {"checked": 2, "identical": 2}


def test_the_real_target_as_a_bf16_copy_captures_trains_and_decodes_losslessly(smollm2, tmp_path):
    """SmolLM2-135M in bf16 (a copy; the session's float32 target is untouched): EAGLE-3 trains a few steps on its
    captured features, then speculative greedy decoding on it equals its plain greedy decoding."""
    from draftsmith.drafters import DraftShape, Sampling, eagle
    from draftsmith.eval.decoder import plain_generate, speculative_generate
    from draftsmith.target import in_dtype

    own = smollm2.dtype
    target = in_dtype(smollm2, torch.bfloat16)
    assert target.dtype == torch.bfloat16 and smollm2.dtype == own
    target.model.requires_grad_(False)
    kind, options = drafter_config(dict(KINDS["eagle3"]))
    drafter = kind_module(kind).create(options, target, None)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)
    text = target.tokenizer("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n")["input_ids"]
    batch = capture_batch(target, collate([{"input_ids": torch.tensor(text), "loss_mask": torch.ones(len(text), dtype=torch.long)}]),
                          drafter.required_layers)
    losses = []
    for _ in range(3):
        loss, _ = drafter.loss(batch, target.head)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0]
    drafter.save_pretrained(tmp_path / "drafter")
    proposer = eagle.load_proposer(tmp_path / "drafter", target)
    prompt = torch.tensor([text[:12]])
    plain = plain_generate(target, prompt, Sampling(), 16)
    fast = speculative_generate(target, proposer, prompt, DraftShape(length=3), Sampling(), 16)
    assert fast.tokens == plain.tokens
