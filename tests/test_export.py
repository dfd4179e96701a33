"""Export formats, layer-id conventions, the validator, atomicity and the round trip of tensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_export_support import (
    DRAFT_VOCAB, HIDDEN, LAYERS, TARGET_HUB_ID, TARGET_LAYERS, VOCAB, make_checkpoint, rewrite,
)

from draftsmith import export as ex
from draftsmith.export import eagle3
from draftsmith.export import check as export_check
from draftsmith.errors import DraftsmithError


@pytest.fixture
def checkpoint(tmp_path):
    return make_checkpoint(tmp_path / "run")


def exported(checkpoint, tmp_path, fmt, name=None):
    return ex.export(checkpoint, fmt, tmp_path / (name or fmt))


def expected():
    return eagle3.Expected(TARGET_LAYERS, LAYERS, HIDDEN, VOCAB)


# --------------------------------------------------------------------------- conventions
def test_layer_id_conventions_follow_design_section_4():
    # EAGLE-3 default for a 30-layer target in our convention: 1, L/2-1, L-4
    ours = [1, 14, 26]
    assert eagle3.to_format_layer_ids("speculators", ours) == [2, 15, 27]  # vLLM's own fallback: 2, L/2, L-3
    assert eagle3.to_format_layer_ids("sglang", ours) == [1, 14, 26]
    for fmt in eagle3.FORMATS:
        assert eagle3.from_format_layer_ids(fmt, eagle3.to_format_layer_ids(fmt, ours)) == ours
    # the last layer's output cannot be captured by either engine (they capture before a layer runs)
    assert export_check.format_layer_id_range("speculators", 30) == range(1, 30)
    assert export_check.format_layer_id_range("sglang", 30) == range(0, 29)


# --------------------------------------------------------------------------- writers
def test_speculators_folder_has_the_fields_vllm_reads(checkpoint, tmp_path):
    out = exported(checkpoint, tmp_path, "speculators")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["target_hidden_size"] == HIDDEN
    assert config["norm_before_residual"] is False
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1 and layer["vocab_size"] == VOCAB
    assert layer["rope_theta"] == layer["rope_parameters"]["rope_theta"]
    assert layer["num_key_value_heads"] == 2 and layer["head_dim"] == HIDDEN // 4
    assert not set(layer) & {"draft_vocab_size", "target_num_layers", "target_hidden_size"}
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["verifier"]["name_or_path"] == TARGET_HUB_ID
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["fc.weight"].shape == (HIDDEN, 3 * HIDDEN)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * HIDDEN
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]


def test_sglang_folder_has_the_fields_sglang_reads(checkpoint, tmp_path):
    out = exported(checkpoint, tmp_path, "sglang")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert config["tie_word_embeddings"] is False and config["draft_vocab_size"] == DRAFT_VOCAB
    tensors = load_file(str(out / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in tensors and not any(n.startswith("layers.") for n in tensors)
    assert "embed_tokens.weight" not in tensors  # a frozen copy of the target's: engines share the target's
    original = load_file(str(checkpoint / "model.safetensors"))
    assert torch.equal(tensors["midlayer.mlp.down_proj.weight"], original["layers.0.mlp.down_proj.weight"])


def test_sglang_refuses_layer_ids_its_versions_disagree_on(tmp_path):
    ckpt = make_checkpoint(tmp_path / "run", layers=[2, 3, 4])
    with pytest.raises(DraftsmithError, match="25454"):
        ex.export(ckpt, "sglang", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    out = ex.export(ckpt, "speculators", tmp_path / "ok")  # vLLM reads ids one way only
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [3, 4, 5]


def test_sglang_refuses_a_residual_convention_it_does_not_implement(tmp_path):
    ckpt = make_checkpoint(tmp_path / "run", norm_before_residual=True)
    with pytest.raises(DraftsmithError, match="norm_before_residual"):
        ex.export(ckpt, "sglang", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    out = ex.export(ckpt, "speculators", tmp_path / "ok")
    assert json.loads((out / "config.json").read_text())["norm_before_residual"] is True


def test_target_name_comes_from_the_run_or_the_command_line(tmp_path):
    ckpt = make_checkpoint(tmp_path / "run", training={})
    meta = json.loads((ckpt / "config.json").read_text())
    assert meta.pop("target_name") == "tiny-llama"  # an in-memory test target; drop it to leave no name at all
    (ckpt / "config.json").write_text(json.dumps(meta))
    with pytest.raises(DraftsmithError, match="--verifier"):
        ex.export(ckpt, "speculators", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    out = ex.export(ckpt, "speculators", tmp_path / "out", verifier="org/model")
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == "org/model"
    alias = make_checkpoint(tmp_path / "alias", training={"target": "smollm2-135m-instruct"})
    config = json.loads((ex.export(alias, "speculators", tmp_path / "a") / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_round_trip_gives_back_the_checkpoint(checkpoint, tmp_path):
    original = load_file(str(checkpoint / "model.safetensors"))
    assert "embed_tokens.weight" not in original  # the drafter folder never stores the frozen embedding
    for fmt in eagle3.FORMATS:
        found, meta, tensors = eagle3.to_checkpoint(exported(checkpoint, tmp_path, fmt))
        assert found == fmt and meta["config"]["layers"] == TARGET_LAYERS
        assert meta["transformer_layer_config"]["draft_vocab_size"] == DRAFT_VOCAB
        assert meta["transformer_layer_config"]["num_key_value_heads"] == 2
        assert set(tensors) == set(original)
        assert all(torch.equal(tensors[n], original[n]) for n in original)
        assert eagle3.is_export(tmp_path / fmt)
    assert not eagle3.is_export(checkpoint)


def test_non_eagle3_checkpoints_are_refused(tmp_path):
    ckpt = make_checkpoint(tmp_path / "run", variant="eagle1")
    with pytest.raises(DraftsmithError, match="EAGLE-3"):
        ex.export(ckpt, "speculators", tmp_path / "out")
    with pytest.raises(DraftsmithError, match="not a draftsmith drafter checkpoint"):
        ex.export(tmp_path / "missing", "speculators", tmp_path / "out")


# --------------------------------------------------------------------------- validator
DEFECTS = {
    # name: (format, config edit, tensor edit, message fragment)
    "missing aux ids (speculators)": ("speculators", lambda c: c.pop("eagle_aux_hidden_state_layer_ids"), None,
                                      "eagle_aux_hidden_state_layer_ids"),
    "missing aux ids (sglang)": ("sglang", lambda c: c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids"), None,
                                 "three integers"),
    "two aux ids": ("speculators", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4]), None, "three"),
    "off-by-one ids (ours written to speculators)": (
        "speculators", lambda c: c.update(eagle_aux_hidden_state_layer_ids=TARGET_LAYERS), None, "do not match"),
    "off-by-one ids (+1 written to sglang)": (
        "sglang", lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 4, 5]), None, "do not match"),
    "sglang ids read differently across versions": (
        "sglang", lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 3, 4]), None,
        "must start at 1"),
    "aux id out of range": ("speculators", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, LAYERS]), None,
                            "out of range"),
    "unsorted aux ids": ("speculators", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[4, 2, 5]), None,
                         "increasing"),
    "arange d2t": ("speculators", None, lambda t: t.update(d2t=torch.arange(DRAFT_VOCAB)), "arange"),
    "raw-id d2t": ("sglang", None, lambda t: t.update(d2t=torch.nonzero(t["t2d"]).flatten()), "raw target ids"),
    "missing d2t": ("speculators", None, lambda t: t.pop("d2t"), "no 'd2t'"),
    "t2d not bool": ("speculators", None, lambda t: t.update(t2d=t["t2d"].to(torch.int64)), "t2d must be bool"),
    "wrong fc width": ("speculators", None, lambda t: t.update({"fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN)}),
                       "fc input width"),
    "lm_head rows != draft vocab": ("sglang", lambda c: c.update(draft_vocab_size=DRAFT_VOCAB + 1), None,
                                    "lm_head has"),
    "unknown config key": ("speculators", lambda c: c.update(eagle_layers=[1, 2, 3]), None, "unknown keys"),
    "unknown nested key": ("sglang", lambda c: c["eagle_config"].update(layer_ids=[1]), None, "unknown keys"),
    "unknown tensor": ("speculators", None, lambda t: t.update(extra=torch.zeros(1)), "unknown keys"),
    "norm_before_residual left to the engine default": ("speculators", lambda c: c.pop("norm_before_residual"), None,
                                                        "norm_before_residual"),
    "tied embeddings": ("sglang", lambda c: c.update(tie_word_embeddings=True), None, "tie_word_embeddings"),
    "rope theta disagreement": ("speculators", lambda c: c["transformer_layer_config"].update(rope_theta=500.0), None,
                                "rope_theta"),
    "no verifier": ("speculators", lambda c: c["speculators_config"]["verifier"].pop("name_or_path"), None,
                    "verifier.name_or_path"),
    "embedding shipped": ("sglang", None, lambda t: t.update({"embed_tokens.weight": torch.zeros(VOCAB, HIDDEN)}),
                          "unknown keys in model.safetensors"),
    "embedding of the wrong size": ("speculators", None,
                                    lambda t: t.update({"embed_tokens.weight": torch.zeros(VOCAB - 1, HIDDEN)}),
                                    "embed_tokens.weight has shape"),
    "unknown LlamaConfig key": ("sglang", lambda c: c.update(eagle_layer_ids=[1, 3, 4]), None,
                                "unknown keys in the LlamaConfig"),
    "attention bias without bias tensors": ("speculators",
                                            lambda c: c["transformer_layer_config"].update(attention_bias=True), None,
                                            "attention_bias must be false"),
    "d2t and t2d disagree": ("speculators", None, lambda t: t.update(d2t=t["d2t"].roll(1)), "do not map"),
    "NaN weight": ("speculators", None, lambda t: t["norm.weight"].fill_(float("nan")), "NaN"),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_validator_catches(defect, checkpoint, tmp_path):
    fmt, config_edit, tensor_edit, message = DEFECTS[defect]
    out = exported(checkpoint, tmp_path, fmt)
    assert eagle3.validate_export(out, fmt, expected()) == fmt  # the clean export passes
    rewrite(out, config_edit, tensor_edit)
    with pytest.raises(DraftsmithError, match=message):
        eagle3.validate_export(out, fmt, expected())


def test_validator_without_expectations_still_catches_speculators_layer_zero(checkpoint, tmp_path):
    out = exported(checkpoint, tmp_path, "speculators")
    rewrite(out, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 3, 4]))
    with pytest.raises(DraftsmithError, match="below what speculators can capture"):
        eagle3.validate_export(out)


def test_validator_accepts_offsets_that_happen_to_be_arange(checkpoint, tmp_path):
    # used tokens 0, 2, 4, ... give d2t = arange: legitimate offsets, consistent with t2d
    problems = []
    used = torch.arange(DRAFT_VOCAB) * 2
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    export_check.check_vocab_map(used - torch.arange(DRAFT_VOCAB), t2d, problems)
    assert problems == []


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model-00001.safetensors", "notes.txt"])
def test_validator_requires_safetensors_only(name, checkpoint, tmp_path):
    out = exported(checkpoint, tmp_path, "speculators")
    (out / name).write_bytes(b"x")
    with pytest.raises(DraftsmithError, match=name.replace(".", r"\.")):
        eagle3.validate_export(out)


# --------------------------------------------------------------------------- atomicity
def test_failed_export_leaves_no_folder_behind(tmp_path, monkeypatch):
    ckpt = make_checkpoint(tmp_path / "run", layers=[1, 3, LAYERS - 1])  # last layer: engines cannot capture it
    with pytest.raises(DraftsmithError, match="out of range"):
        ex.export(ckpt, "speculators", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_writer_bug_is_caught_by_the_round_trip_check(checkpoint, tmp_path, monkeypatch):
    def swapped(ckpt):  # a plausible bug: k and v swapped; every shape still checks out
        tensors = eagle3.speculators_tensors(ckpt)
        k, v = "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight"
        tensors[k], tensors[v] = tensors[v], tensors[k]
        return tensors

    monkeypatch.setitem(eagle3.WRITERS, "speculators", (eagle3.speculators_config, swapped))
    with pytest.raises(DraftsmithError, match="changed in the round trip"):
        ex.export(checkpoint, "speculators", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force_and_survives_a_failed_replace(checkpoint, tmp_path):
    out = exported(checkpoint, tmp_path, "speculators", name="out")
    with pytest.raises(DraftsmithError, match="--force"):
        ex.export(checkpoint, "speculators", out)
    bad = make_checkpoint(tmp_path / "bad", layers=[4, 1, 3])  # engines concatenate in layer order
    with pytest.raises(DraftsmithError):
        ex.export(bad, "speculators", out, force=True)
    assert eagle3.validate_export(out, "speculators", expected()) == "speculators"  # the old export is intact
    ex.export(checkpoint, "sglang", out, force=True)
    assert eagle3.validate_export(out) == "sglang"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "out", "run"]


def test_cli_runs_end_to_end(checkpoint, tmp_path, capsys):
    from draftsmith.cli import main

    assert main(["export", str(checkpoint), "--format", "sglang", "--out", str(tmp_path / "cli")]) == 0
    assert "validated" in capsys.readouterr().out
    assert main(["export", str(checkpoint), "--format", "sglang", "--out", str(tmp_path / "cli")]) == 2
    assert "--force" in capsys.readouterr().err
