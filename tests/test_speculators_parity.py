"""Exports checked against the real `speculators` library (vLLM's format): its model class, loading our
folder, computes our drafter's logits at every TTT step; an export it would read differently fails."""

import json

import pytest
import torch

from draftsmith import export as ex
from draftsmith.drafters import eagle
from draftsmith.export.check import to_format_layer_ids
from speculators_parity import compare, ours_eagle3_logits, speculators_eagle3_logits
from test_export_support import draft_vocab
from tiny import save_target, tiny_target

pytest.importorskip("speculators", reason="the parity harness needs `pip install --no-deps speculators==0.9.0`")

STEPS = 3


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny Llama target saved as a folder (the export's verifier), an EAGLE-3 drafter with weights unlike
    its initialisation for it, and that drafter's speculators export."""
    root = tmp_path_factory.mktemp("parity")
    target = tiny_target("llama")
    target.name = save_target(target, root / "target")
    torch.manual_seed(0)
    drafter = eagle.create(eagle.Config(ttt_steps=STEPS), target, draft_vocab())
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    drafter.save_pretrained(root / "best")
    out = ex.export(root / "best", "speculators", root / "export", verifier=target.name)
    sequences = torch.randint(0, target.vocab_size, (3, 24), generator=torch.Generator().manual_seed(1))
    return target, drafter, out, sequences


def parity(target, drafter, folder, sequences) -> list[dict]:
    return [compare(ours_eagle3_logits(drafter, target, ids[None], STEPS),
                    speculators_eagle3_logits(folder, target, ids[None], STEPS)) for ids in sequences]


def test_speculators_computes_our_eagle3_export_exactly(exported):
    results = parity(*exported)
    assert all(r["steps"] == STEPS for r in results)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results


def rewrite_config(source, destination, change) -> None:
    import shutil

    shutil.copytree(source, destination)
    config = json.loads((destination / "config.json").read_text())
    change(config)
    (destination / "config.json").write_text(json.dumps(config))


def test_an_off_by_one_in_the_layer_ids_fails_the_harness(exported, tmp_path):
    target, drafter, out, sequences = exported
    ours = drafter.config.layers
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == \
        to_format_layer_ids("speculators", ours) == [i + 1 for i in ours]
    rewrite_config(out, tmp_path / "off", lambda c: c.update(eagle_aux_hidden_state_layer_ids=list(ours)))
    results = parity(target, drafter, tmp_path / "off", sequences)
    assert max(r["max_abs_difference"] for r in results) > 1e-2  # "layer i" read as the stream entering it


def test_a_flipped_norm_before_residual_fails_the_harness(exported, tmp_path):
    target, drafter, out, sequences = exported
    assert json.loads((out / "config.json").read_text())["norm_before_residual"] is False
    rewrite_config(out, tmp_path / "flip", lambda c: c.update(norm_before_residual=True))
    results = parity(target, drafter, tmp_path / "flip", sequences)
    assert max(r["max_abs_difference"] for r in results) > 1e-2


def test_include_embedding_stores_the_targets_embedding_and_the_library_computes_our_logits(exported, tmp_path):
    """`--include-embedding` writes the target's own embedding; the library, given nothing else, computes ours."""
    from safetensors.torch import load_file

    target, drafter, out, sequences = exported
    assert "embed_tokens.weight" not in load_file(str(out / "model.safetensors"))
    whole = ex.export(out.parent / "best", "speculators", tmp_path / "whole", verifier=target.name, include_embedding=True)
    stored = load_file(str(whole / "model.safetensors"))["embed_tokens.weight"]
    assert torch.equal(stored, target.model.get_input_embeddings().weight.float())
    results = [compare(ours_eagle3_logits(drafter, target, ids[None], STEPS),
                       speculators_eagle3_logits(whole, target, ids[None], STEPS, share_embedding=False))
               for ids in sequences]
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    assert "`embed_tokens.weight` is the target's own input embedding" in (whole / "README.md").read_text()
    assert "--include-embedding" in (out / "README.md").read_text()
    with pytest.raises(ex.DraftsmithError, match="--include-embedding is for --format speculators"):
        ex.export(out.parent / "best", "sglang", tmp_path / "sg", verifier=target.name, include_embedding=True)
