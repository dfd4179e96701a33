"""MTP exports in speculators' `mtp` layout, checked against the real library: its MTPDraftModel, loading our
folder, computes our drafter's logits at every step; an export it would read differently fails."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith import export as ex
from draftsmith.drafters import mtp
from draftsmith.errors import DraftsmithError
from speculators_parity import compare, ours_mtp_logits, speculators_mtp_logits
from tiny import save_target, tiny_target

STEPS = 3


def perturb(module, seed, scale=0.05):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny random Qwen3 target (norm weights unlike ones, so a lost norm shows) saved as the verifier folder, a
    shared MTP drafter with weights unlike its initialisation, and its speculators export."""
    pytest.importorskip("speculators", reason="the parity harness needs `pip install --no-deps speculators==0.9.0`")
    root = tmp_path_factory.mktemp("mtp-parity")
    target = tiny_target("qwen3")
    with torch.no_grad():
        target.final_norm.weight.add_(torch.rand(target.hidden_size, generator=torch.Generator().manual_seed(3)))
    target.name = save_target(target, root / "target")
    torch.manual_seed(0)
    drafter = mtp.create(mtp.Config(num_modules=STEPS, shared=True), target)
    perturb(drafter, seed=1)
    drafter.save_pretrained(root / "best")
    out = ex.export(root / "best", "speculators", root / "export")
    sequences = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(1))
    return target, drafter, out, sequences


def parity(target, drafter, folder, sequences) -> list[dict]:
    return [compare(ours_mtp_logits(drafter, target, ids[None], STEPS),
                    speculators_mtp_logits(folder, target, ids[None])) for ids in sequences]


def test_speculators_computes_our_mtp_export_exactly(exported):
    target, drafter, out, sequences = exported
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "mtp" and config["num_nextn_predict_layers"] == 1
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == STEPS
    assert not any("embed_tokens" in name or "lm_head" in name for name in load_file(str(out / "model.safetensors")))
    assert (out / "README.md").is_file()
    results = parity(*exported)
    assert all(r["steps"] == STEPS for r in results)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results


def rewrite_tensors(source, destination, change) -> None:
    import shutil

    shutil.copytree(source, destination)
    tensors = load_file(str(destination / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(destination / "model.safetensors"))


def test_swapped_input_halves_or_a_lost_final_norm_fail_the_harness(exported, tmp_path):
    target, drafter, out, sequences = exported
    name = "mtp_layers.0.input_proj.weight"
    rewrite_tensors(out, tmp_path / "swap", lambda t: t.update({name: torch.cat(t[name].chunk(2, dim=1)[::-1], 1)}))
    assert max(r["max_abs_difference"] for r in parity(target, drafter, tmp_path / "swap", sequences)) > 1e-2
    norm = "mtp_layers.0.final_layernorm.weight"
    rewrite_tensors(out, tmp_path / "norm", lambda t: t.update({norm: torch.ones_like(t[norm])}))
    assert max(r["max_abs_difference"] for r in parity(target, drafter, tmp_path / "norm", sequences)) > 1e-2


def test_what_speculators_cannot_hold_is_refused_before_writing(tmp_path):
    qwen3 = tiny_target("qwen3")
    qwen3.name = save_target(qwen3, tmp_path / "qwen3")
    mtp.create(mtp.Config(num_modules=2), qwen3).save_pretrained(tmp_path / "separate")
    with pytest.raises(DraftsmithError, match="2 separate modules.*drafter.shared=true"):
        ex.export(tmp_path / "separate", "speculators", tmp_path / "out1")
    llama = tiny_target("llama")
    llama.name = save_target(llama, tmp_path / "llama")
    mtp.create(mtp.Config(num_modules=2, shared=True), llama).save_pretrained(tmp_path / "llama-mtp")
    with pytest.raises(DraftsmithError, match="'llama'"):
        ex.export(tmp_path / "llama-mtp", "speculators", tmp_path / "out2")
    with pytest.raises(DraftsmithError, match="--format sglang is for eagle drafters.*exports as speculators"):
        ex.export(tmp_path / "llama-mtp", "sglang", tmp_path / "out3")
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists()
