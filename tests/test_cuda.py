"""Every drafter kind trained and decoded on a CUDA GPU: the recipe (mixed precision, the target moved to the
accelerator), its final report and `draftsmith eval --device` must work there and stay lossless.

These tests run only where torch sees a GPU (CI has none); on a CPU machine only the refusal of
`--device cuda` is checked. They are run on a lent GPU machine with

    PYTHONPATH=. python3 -m pytest -q tests/test_cuda.py
"""

import json

import pytest
import torch
import yaml

from draftsmith.cli import main
from test_train import reset_accelerate_state, write_target_and_conversations

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

KINDS = {  # recipe drafter sections, small enough for a tiny target
    "eagle3": {"kind": "eagle", "variant": "eagle3", "ttt_steps": 3},
    "medusa": {"kind": "medusa", "num_heads": 2},
    "mtp": {"kind": "mtp", "num_modules": 2},
    "dflash": {"kind": "dflash", "block_size": 4, "anchors_per_sequence": 4},
    "draft_lm": {"kind": "draft_lm", "num_layers": 2},
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    write_target_and_conversations(root)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"count from {k}"}) + "\n" for k in (3, 11, 19)))
    return root


def recipe(root, name: str, drafter: dict) -> str:
    data = {
        "target": {"name": str(root / "target")},
        "prepare": {"input": [str(root / "conversations.jsonl")], "max_length": 96, "eval_fraction": 0.2},
        "data": {"prepared": str(root / "data"), "online": True, "batch_size": 2, "max_length": 48},
        "drafter": drafter,
        "train": {"max_steps": 6, "lr": 1e-3, "warmup_steps": 1, "precision": "auto", "eval_every": 3,
                  "checkpoint_every": 3},
        "eval": {"batches": 1, "num_prompts": 1, "max_new_tokens": 8, "draft_length": 3},
        "report": {"num_prompts": 3, "prompts": str(root / "prompts.jsonl"), "max_new_tokens": 16, "draft_length": 3},
        "tracking": {"report_to": []},
        "output_dir": str(root / name),
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@needs_gpu
@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_trains_on_the_gpu_and_decodes_losslessly_there(assets, name):
    reset_accelerate_state()
    assert main(["train", recipe(assets, name, KINDS[name])]) == 0
    log = [json.loads(line) for line in (assets / name / "metrics.jsonl").read_text().splitlines()]
    assert any(r["split"] == "eval" for r in log)
    report = json.loads((assets / name / "eval" / "results.json").read_text())
    assert report["environment"]["device"].startswith("cuda")
    assert report["lossless"] == {"checked": 3, "identical": 3}

    # the saved folder, decoded by `draftsmith eval` on the GPU: chains, trees (DFlash: from one block), sampling
    for index, shape in enumerate([["--draft-length", "3"], ["--tree", "3,2,6"]]):
        out = assets / name / f"eval-{index}"
        assert main(["eval", "--target", str(assets / "target"), "--drafter", str(assets / name / "best"),
                     "--prompts", str(assets / "prompts.jsonl"), "--num-prompts", "3", "--max-new-tokens", "16",
                     "--device", "cuda", "--out", str(out), *shape]) == 0
        results = json.loads((out / "results.json").read_text())
        assert results["environment"]["device"].startswith("cuda")
        assert results["lossless"] == {"checked": 3, "identical": 3}, shape
    out = assets / name / "eval-sampled"
    assert main(["eval", "--target", str(assets / "target"), "--drafter", str(assets / name / "best"),
                 "--prompts", str(assets / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "16",
                 "--temperature", "1.0", "--device", "cuda", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["acceptance_length"] >= 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_eval_device_cuda_without_a_gpu_fails_before_loading_anything(tmp_path, capsys):
    for device, message in (("cuda", "torch sees no CUDA GPU"), ("tpu", "Unknown device 'tpu'")):
        assert main(["eval", "--target", "nowhere", "--drafter", "prompt-lookup", "--device", device,
                     "--out", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@needs_gpu
def test_dflash_flex_attention_gives_the_sdpa_loss_and_gradients_on_the_gpu():
    from tiny import byte_tokenizer, tiny_model

    from draftsmith.drafters import dflash
    from draftsmith.target import Target

    target = Target(tiny_model("qwen3").cuda(), byte_tokenizer(), name="tiny-qwen3")
    target.model.requires_grad_(False)
    drafters = [dflash.create(dflash.Config(block_size=4, num_layers=2, attention=a), target) for a in ("sdpa", "flex")]
    drafters[1].load_state_dict(drafters[0].state_dict())
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0)).cuda()
    features = target.forward(ids, layers=drafters[0].required_layers, logits=False).features
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids), "attention_mask": torch.ones_like(ids),
             "features": features}
    anchors = torch.tensor([[4, 9, 17, 30], [6, 12, 25, -1]]).cuda()
    losses = []
    for drafter in drafters:
        loss, _ = drafter(batch, target.head, anchors=anchors)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-4)
    for (name, a), b in zip(drafters[0].named_parameters(), drafters[1].parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4, msg=name)
