"""--format dflash: the DFlash reference's own `DFlashDraftModel` loads the export and gives our draft logits."""

import json

import pytest
import torch
from tiny import tiny_target

from draftsmith.drafters import DecodeState, dflash
from draftsmith.errors import DraftsmithError
from draftsmith.export import dflash as dflash_export
from draftsmith.export import export

reference = pytest.importorskip("dflash.model")


def trained_folder(target, tmp_path, **options):
    """A saved drafter with weights moved off their initialisation (norms not all ones)."""
    target.model.requires_grad_(False)
    drafter = dflash.create(dflash.Config(**options), target)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    drafter.save_pretrained(tmp_path / "best")
    return drafter


def reference_logits(folder, target, tokens):
    """The reference's draft logits [B-1, V] for the block at the last token, with its own context extraction
    (`extract_context_feature` over the target's hidden states) and its own model, config and weights."""
    model = reference.DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    size, T = model.block_size, tokens.shape[1]
    with torch.no_grad():
        hidden_states = target.model(tokens[:, :-1], output_hidden_states=True).hidden_states
        context = reference.extract_context_feature(hidden_states, model.target_layer_ids)
        block = torch.tensor([[int(tokens[0, -1])] + [model.mask_token_id] * (size - 1)])
        out = model(target_hidden=context, noise_embedding=target.model.get_input_embeddings()(block),
                    position_ids=torch.arange(T - 1 + size)[None])
        return model.compute_logits(out[:, 1:], target.model.get_output_embeddings())[0].float()


def our_logits(drafter, target, tokens):
    features = target.forward(tokens[:, :-1], layers=drafter.required_layers, logits=False).features
    return drafter.proposer(target).block_logits(DecodeState(tokens, features))


def assert_same(ours, theirs):
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1)), "argmax differs"
    assert float((ours - theirs).abs().max()) < 1e-3


@pytest.mark.parametrize("arch,block_size,num_layers", [("qwen3", 8, 2), ("llama", 4, 1)])
def test_the_reference_loads_the_export_and_drafts_our_logits(arch, block_size, num_layers, tmp_path):
    target = tiny_target(arch)
    drafter = trained_folder(target, tmp_path, block_size=block_size, num_layers=num_layers)
    out = export(tmp_path / "best", "dflash", tmp_path / "out", verifier="Qwen/Qwen3-0.6B")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == block_size
    assert config["dflash_config"] == {"mask_token_id": drafter.mask_token_id, "target_layer_ids": drafter.layer_ids}
    tokens = torch.tensor([[257, 5, 6, 7, 8, 9, 10, 11, 12, 13]])
    assert_same(our_logits(drafter, target, tokens), reference_logits(out, target, tokens))
    assert "DFlashDraftModel.from_pretrained" in (out / "README.md").read_text()


def test_layer_ids_off_by_one_give_other_logits_and_a_wrong_folder_is_refused(tmp_path):
    target = tiny_target("qwen3")
    drafter = trained_folder(target, tmp_path, block_size=4)
    out = export(tmp_path / "best", "dflash", tmp_path / "out", verifier="Qwen/Qwen3-0.6B")
    tokens = torch.tensor([[257, 5, 6, 7, 8, 9, 10, 11]])
    ours = our_logits(drafter, target, tokens)
    config = json.loads((out / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in drafter.layer_ids]  # "hidden_states index" ids
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(AssertionError):
        assert_same(ours, reference_logits(out, target, tokens))
    with pytest.raises(DraftsmithError, match="does not convert back"):
        dflash_export.check_round_trip(out, json.loads((tmp_path / "best" / "config.json").read_text()),
                                       dict(drafter.state_dict()))
    config["dflash_config"]["target_layer_ids"] = drafter.layer_ids
    config["attention_bias"] = True
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="attend fully, without bias"):
        dflash_export.validate(out)


def test_a_dflash_checkpoint_only_exports_as_dflash(tmp_path):
    trained_folder(tiny_target("qwen3"), tmp_path)
    with pytest.raises(DraftsmithError, match="--format medusa is for medusa drafters.*exports as speculators or dflash"):
        export(tmp_path / "best", "medusa", tmp_path / "out")
