"""Exports checked against the real `speculators` library (vLLM's format): its model class, loading our
folder, computes our drafter's logits (EAGLE-3: at every TTT step; DFlash: every block position); an export it
would read differently fails."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith import export as ex
from draftsmith.drafters import dflash, eagle
from draftsmith.export import dflash as dflash_export
from draftsmith.export.check import to_format_layer_ids
from speculators_parity import (
    compare, compare_blocks, compare_keyed, load_speculators_dflash, ours_dflash_logits, ours_eagle3_logits,
    ours_peagle_logits, speculators_dflash_logits, speculators_eagle3_logits, speculators_peagle_logits,
)
from test_export_support import draft_vocab
from tiny import save_target, tiny_target

pytest.importorskip("speculators", reason="the parity harness needs `pip install --no-deps speculators==0.9.0`")

STEPS = 3


def export_eagle3(root, **options):
    """A tiny Llama target saved as a folder (the export's verifier), an EAGLE-3 drafter with weights unlike
    its initialisation for it (`options`: its Config's), that drafter's speculators export, and sequences."""
    target = tiny_target("llama")
    target.name = save_target(target, root / "target")
    torch.manual_seed(0)
    drafter = eagle.create(eagle.Config(ttt_steps=STEPS, **options), target, draft_vocab())
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    drafter.save_pretrained(root / "best")
    out = ex.export(root / "best", "speculators", root / "export", verifier=target.name)
    sequences = torch.randint(0, target.vocab_size, (3, 24), generator=torch.Generator().manual_seed(1))
    return target, drafter, out, sequences


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_eagle3(tmp_path_factory.mktemp("parity"))


def parity(target, drafter, folder, sequences) -> list[dict]:
    return [compare(ours_eagle3_logits(drafter, target, ids[None], STEPS),
                    speculators_eagle3_logits(folder, target, ids[None], STEPS)) for ids in sequences]


def test_speculators_computes_our_eagle3_export_exactly(exported):
    results = parity(*exported)
    assert all(r["steps"] == STEPS for r in results)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results


def rewrite_config(source, destination, change) -> None:
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



@pytest.fixture(scope="module")
def exported31(tmp_path_factory):
    """As `exported`, for an EAGLE 3.1 drafter (a norm per feature layer before fc, final-normed outputs fed on)."""
    return export_eagle3(tmp_path_factory.mktemp("parity31"), fc_norm=True, norm_output=True)


def test_speculators_computes_our_eagle31_export_exactly(exported31, tmp_path):
    target, drafter, out, sequences = exported31
    config = json.loads((out / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(load_file(str(out / "model.safetensors")))
    results = parity(*exported31)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    with pytest.raises(ex.DraftsmithError, match="EAGLE 3.1"):
        ex.export(out.parent / "best", "sglang", tmp_path / "sg", verifier=target.name)


@pytest.mark.parametrize("flag", ["fc_norm", "norm_output"])
def test_an_eagle31_export_read_without_either_flag_fails_the_harness(exported31, tmp_path, flag):
    target, drafter, out, sequences = exported31
    rewrite_config(out, tmp_path / flag, lambda c: c.update({flag: False}))
    results = parity(target, drafter, tmp_path / flag, sequences)
    assert max(r["max_abs_difference"] for r in results) > 1e-2

# --------------------------------------------------------------------------- P-EAGLE (speculators `peagle` layout)
@pytest.fixture(scope="module")
def peagle_exported(tmp_path_factory):
    """As `exported`, for a P-EAGLE drafter (mask token and learned mask hidden at the steps after the first)."""
    return export_eagle3(tmp_path_factory.mktemp("peagle"), variant="peagle")


def peagle_parity(target, drafter, folder, sequences) -> list[dict]:
    return [compare_keyed(ours_peagle_logits(drafter, target, ids[None], STEPS),
                          speculators_peagle_logits(folder, target, ids[None], STEPS)) for ids in sequences]


def test_speculators_computes_our_peagle_export_exactly(peagle_exported, tmp_path):
    target, drafter, out, sequences = peagle_exported
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["speculators_config"]["algorithm"] == "peagle"
    assert config["mask_token_id"] == drafter.config.mask_token_id
    stored = load_file(str(out / "model.safetensors"))
    assert torch.equal(stored["mask_hidden"], drafter.mask_hidden.detach())
    results = peagle_parity(*peagle_exported)
    assert all(r["steps"] == STEPS and r["pairs"] > 2 * sequences.shape[1] for r in results), results
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    card = (out / "README.md").read_text()
    assert "parallel_drafting" in card and "--format sglang" not in card and "no SGLang export" in card
    with pytest.raises(ex.DraftsmithError, match="P-EAGLE"):
        ex.export(out.parent / "best", "sglang", tmp_path / "sg", verifier=target.name)
    with pytest.raises(ex.DraftsmithError, match="trained to draft 3 positions"):
        ex.export(out.parent / "best", "speculators", tmp_path / "long", verifier=target.name, speculative_tokens=5)


def test_peagle_misreadings_fail_the_harness_and_the_validator(peagle_exported, tmp_path):
    """Another mask token fails the harness; a folder without mask_hidden, which the library loads without a word
    (its mask_hidden is then whatever the allocation held: random, or by chance a freed copy of ours, so the harness
    cannot be relied on to tell), is refused by our validator; the folder reads back as the drafter we trained."""
    from draftsmith.export import readers
    from draftsmith.export.check import validate_export

    target, drafter, out, sequences = peagle_exported
    other = (drafter.config.mask_token_id + 1) % target.vocab_size
    rewrite_config(out, tmp_path / "token", lambda c: c.update(mask_token_id=other))
    assert max(r["max_abs_difference"] for r in peagle_parity(target, drafter, tmp_path / "token", sequences)) > 1e-2
    shutil.copytree(out, tmp_path / "bare")
    tensors = load_file(str(out / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != "mask_hidden"}, str(tmp_path / "bare" / "model.safetensors"))
    assert peagle_parity(target, drafter, tmp_path / "bare", sequences[:1])[0]["pairs"] > 0  # loads and computes
    with pytest.raises(ex.DraftsmithError, match="no 'mask_hidden'"):
        validate_export(tmp_path / "bare")
    proposer = readers.load_proposer(out, target)
    assert proposer.drafter.parallel and proposer.longest_draft == STEPS
    assert torch.equal(proposer.drafter.mask_hidden, drafter.mask_hidden.detach())


# --------------------------------------------------------------------------- more than one decoder layer
@pytest.fixture(scope="module", params=["eagle3", "peagle"])
def deep_exported(request, tmp_path_factory):
    """As `exported`, for a drafter of two decoder layers (the EAGLE-3 first layer and a plain Llama layer)."""
    return request.param, export_eagle3(tmp_path_factory.mktemp(f"deep-{request.param}"), variant=request.param,
                                        num_layers=2)


def test_speculators_computes_our_two_layer_export_exactly(deep_exported, tmp_path):
    """The library builds its first layer and a Llama decoder layer from num_hidden_layers = 2 and computes our
    logits; read as one layer (the second's weights ignored) it does not; SGLang's one-layer model is refused."""
    variant, (target, drafter, out, sequences) = deep_exported
    check = peagle_parity if variant == "peagle" else parity
    config = json.loads((out / "config.json").read_text())
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert "layers.1.self_attn.q_proj.weight" in load_file(str(out / "model.safetensors"))
    results = check(target, drafter, out, sequences)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    rewrite_config(out, tmp_path / "one", lambda c: c["transformer_layer_config"].update(num_hidden_layers=1))
    assert max(r["max_abs_difference"] for r in check(target, drafter, tmp_path / "one", sequences[:1])) > 1e-2
    refusal = "P-EAGLE drafter" if variant == "peagle" else "2 decoder layers"  # P-EAGLE is refused before depth
    with pytest.raises(ex.DraftsmithError, match=refusal):
        ex.export(out.parent / "best", "sglang", tmp_path / "sg", verifier=target.name)
    from draftsmith.export import readers

    proposer = readers.load_proposer(out, target)  # read back from the export: the same two layers
    assert proposer.drafter.config.num_layers == 2
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(proposer.drafter.state_dict()[name], tensor), name


# --------------------------------------------------------------------------- DFlash (speculators `dflash` layout)
ANCHORS = [2, 7, 11]


def trained_dflash(target, folder, vocab=None, **options):
    """A DFlash drafter with weights moved off their initialisation (norms not all ones), saved to `folder` (`vocab`:
    a draft vocabulary)."""
    target.model.requires_grad_(False)
    drafter = dflash.create(dflash.Config(**options), target, draft_vocab=vocab)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    drafter.save_pretrained(folder)
    return drafter


@pytest.fixture(scope="module", params=[("qwen3", 8, 2), ("llama", 4, 1)], ids=["qwen3", "llama"])
def dflash_exported(request, tmp_path_factory):
    """A tiny target saved as a folder (the verifier the library fills embedding and lm_head from), a DFlash
    drafter for it, its speculators export, and sequences long enough for blocks at ANCHORS."""
    arch, block_size, num_layers = request.param
    root = tmp_path_factory.mktemp(f"dflash-{arch}")
    target = tiny_target(arch)
    target.name = save_target(target, root / "target")
    drafter = trained_dflash(target, root / "best", block_size=block_size, num_layers=num_layers)
    out = ex.export(root / "best", "speculators", root / "export")
    sequences = torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(1))
    return target, drafter, out, sequences


def dflash_parity(target, drafter, folder, sequences) -> list[dict]:
    model = load_speculators_dflash(folder)
    return [compare_blocks(ours_dflash_logits(drafter, target, ids[None], ANCHORS),
                           speculators_dflash_logits(model, target, ids[None], ANCHORS)) for ids in sequences]


def test_speculators_computes_our_dflash_export_exactly(dflash_exported):
    from safetensors.torch import load_file
    from speculators.models.dflash import DFlashDraftModel

    target, drafter, out, sequences = dflash_exported
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["sample_from_anchor"] is False
    assert config["aux_hidden_state_layer_ids"] == to_format_layer_ids("speculators", drafter.layer_ids) \
        == [i + 1 for i in drafter.layer_ids]
    assert (config["block_size"], config["mask_token_id"]) == (drafter.config.block_size, drafter.mask_token_id)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == drafter.config.block_size - 1
    assert not any("embed" in name or "lm_head" in name for name in load_file(str(out / "model.safetensors")))
    model = load_speculators_dflash(out)
    assert type(model) is DFlashDraftModel
    # neither is stored: the library fills both from the verifier folder the config names
    assert torch.equal(model.embed_tokens.weight, target.model.get_input_embeddings().weight)
    assert torch.equal(model.lm_head.weight, target.model.get_output_embeddings().weight)
    results = dflash_parity(target, drafter, out, sequences)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    readme = (out / "README.md").read_text()
    assert "DFlashDraftModel.from_pretrained" in readme and "fills both from the verifier" in readme


def test_dflash_layer_ids_in_the_reference_convention_fail_the_harness_and_the_round_trip(dflash_exported, tmp_path):
    """The DFlash reference's ids (layer outputs, unshifted) written into the speculators layout: the library reads
    the stream entering each layer, one layer early, and drafts other logits."""
    target, drafter, out, sequences = dflash_exported
    rewrite_config(out, tmp_path / "off", lambda c: c.update(aux_hidden_state_layer_ids=list(drafter.layer_ids)))
    assert max(r["max_abs_difference"] for r in dflash_parity(target, drafter, tmp_path / "off", sequences)) > 1e-2
    from safetensors.torch import load_file

    meta = json.loads((out.parent / "best" / "config.json").read_text())
    with pytest.raises(ex.DraftsmithError, match="does not convert back"):
        dflash_export.check_speculators_round_trip(tmp_path / "off", meta,
                                                   load_file(str(out.parent / "best" / "model.safetensors")))


BROKEN_DFLASH = {
    "sample_from_anchor left to the default": (lambda c: c.pop("sample_from_anchor"), "config keys must be exactly"),
    "an unknown key": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 4]), "unknown"),
    "sample_from_anchor true": (lambda c: c.update(sample_from_anchor=True), "sample_from_anchor .* must be written"),
    "a draft vocabulary without its head": (lambda c: c.update(draft_vocab_size=100), "lm_head.weight: missing"),
    "a vocabulary larger than the target's": (lambda c: c.update(draft_vocab_size=10**6), "draft_vocab_size must be"),
    "the last layer's output": (lambda c: c["aux_hidden_state_layer_ids"].append(8), "aux_hidden_state_layer_ids"),
    "sliding-window draft layers": (lambda c: c["transformer_layer_config"].update(layer_types=["sliding_attention"]),
                                    "attend fully"),
    "a llama layer config": (lambda c: c["transformer_layer_config"].update(model_type="llama"), "qwen3 config"),
    "a block too small": (lambda c: c.update(block_size=1), "block_size"),
    "more tokens than the block drafts": (
        lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=9), "speculative_tokens"),
}


@pytest.mark.parametrize("case", list(BROKEN_DFLASH))
def test_the_speculators_dflash_validator_refuses_what_the_library_would_read_otherwise(dflash_exported, tmp_path, case):
    target, drafter, out, _ = dflash_exported
    change, message = BROKEN_DFLASH[case]
    rewrite_config(out, tmp_path / "broken", change)
    with pytest.raises(ex.DraftsmithError, match=message):
        dflash_export.validate_speculators(tmp_path / "broken", target.num_layers)
    dflash_export.validate_speculators(out, target.num_layers)  # the export itself passes


def test_the_speculators_dflash_validator_refuses_stored_target_parts_and_missing_weights(dflash_exported, tmp_path):
    from safetensors.torch import load_file, save_file

    target, _, out, _ = dflash_exported
    for name, change in {"embed_tokens.weight: not a parameter": lambda t: t.update(
            {"embed_tokens.weight": target.model.get_input_embeddings().weight.detach().clone()}),
            "fc.weight: missing": lambda t: t.pop("fc.weight")}.items():
        shutil.rmtree(tmp_path / "broken", ignore_errors=True)
        shutil.copytree(out, tmp_path / "broken")
        tensors = load_file(str(out / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
        with pytest.raises(ex.DraftsmithError, match=name):
            dflash_export.validate_speculators(tmp_path / "broken", target.num_layers)


def test_a_speculators_dflash_export_refuses_include_embedding_and_a_longer_draft(dflash_exported, tmp_path):
    target, drafter, out, _ = dflash_exported
    best = out.parent / "best"
    with pytest.raises(ex.DraftsmithError, match="refills it"):
        ex.export(best, "speculators", tmp_path / "a", include_embedding=True)
    with pytest.raises(ex.DraftsmithError, match=f"drafts {drafter.config.block_size - 1} tokens at most"):
        ex.export(best, "speculators", tmp_path / "b", speculative_tokens=drafter.config.block_size)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --------------------------------------------------------------------------- DFlash / DSpark over a draft vocabulary
@pytest.fixture(scope="module", params=["dflash", "dspark"])
def draft_vocab_exported(request, tmp_path_factory):
    """A DFlash (or DSpark) drafter with its own head over a 64-token draft vocabulary, and its speculators export."""
    root = tmp_path_factory.mktemp(f"{request.param}-vocab")
    target = tiny_target("qwen3")
    target.name = save_target(target, root / "target")
    drafter = trained_dflash(target, root / "best", vocab=draft_vocab(size=64, vocab=target.vocab_size), block_size=6,
                             num_layers=1, variant=request.param, markov_rank=16)
    out = ex.export(root / "best", "speculators", root / "export")
    sequences = torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(1))
    return target, drafter, out, sequences


def test_speculators_computes_our_draft_vocabulary_export_exactly(draft_vocab_exported, tmp_path):
    """The library keeps the stored head and its d2t/t2d (it refills only the embedding) and gives our logits over
    the draft rows; a folder whose d2t no longer matches t2d is refused; the reference layout has no such head."""
    target, drafter, out, sequences = draft_vocab_exported
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 64 and config["transformer_layer_config"]["vocab_size"] == target.vocab_size
    model = load_speculators_dflash(out)
    assert model.use_draft_vocab and torch.equal(model.t2d, drafter.t2d) and torch.equal(model.d2t, drafter.d2t)
    torch.testing.assert_close(model.lm_head.weight, drafter.lm_head.weight)
    results = dflash_parity(target, drafter, out, sequences)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    assert "a draft vocabulary of 64 tokens" in (out / "README.md").read_text()
    shutil.copytree(out, tmp_path / "broken")
    tensors = load_file(str(out / "model.safetensors"))
    tensors["d2t"] = tensors["d2t"].flip(0)
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    with pytest.raises(ex.DraftsmithError, match="d2t .* and t2d .* must mark the same tokens"):
        dflash_export.validate_speculators(tmp_path / "broken", target.num_layers)
    if drafter.config.variant == "dflash":
        with pytest.raises(ex.DraftsmithError, match="draft vocabulary of 64 tokens.*--format speculators"):
            ex.export(out.parent / "best", "dflash", tmp_path / "ref")


# --------------------------------------------------------------------------- DSpark (speculators `dspark` layout)
@pytest.fixture(scope="module")
def dspark_exported(tmp_path_factory):
    """A tiny Qwen3 target saved as the verifier, a DSpark drafter whose Markov head is large enough to move the
    logits (its training starts it at zero), and its speculators export."""
    root = tmp_path_factory.mktemp("dspark")
    target = tiny_target("qwen3")
    target.name = save_target(target, root / "target")
    drafter = trained_dflash(target, root / "best", block_size=6, num_layers=1, variant="dspark", markov_rank=16)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in (drafter.markov_w1.weight, drafter.markov_w2.weight):
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    drafter.save_pretrained(root / "best")
    out = ex.export(root / "best", "speculators", root / "export")
    sequences = torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(1))
    return target, drafter, out, sequences


def test_speculators_computes_our_dspark_export_exactly(dspark_exported):
    """The library's DSparkDraftModel gives our Markov-biased logits and our confidence logits at every position."""
    from speculators.models.dspark import DSparkDraftModel

    target, drafter, out, sequences = dspark_exported
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dspark" and config["sample_from_anchor"] is False
    assert (config["markov_rank"], config["markov_head_type"], config["confidence_head_with_markov"]) == \
        (16, "vanilla", True)
    model = load_speculators_dflash(out)
    assert type(model) is DSparkDraftModel
    with torch.no_grad():
        bias, _ = drafter.markov(torch.zeros(3, drafter.sizes["hidden_size"]), torch.tensor([5, 6, 7]))
    assert float(bias.std()) > 0.1  # the comparison below sees the Markov head, not a bias near zero
    results = dflash_parity(target, drafter, out, sequences)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_difference"] < 1e-3 for r in results), results
    assert "DSparkDraftModel.from_pretrained" in (out / "README.md").read_text()


def test_dspark_misreadings_fail_the_harness(dspark_exported, tmp_path):
    """sample_from_anchor left to the library's DSpark default (true: each position's previous token one later)
    changes the Markov bias; confidence weights over [markov; hidden] instead of [hidden; markov] change the
    confidence logits."""
    from safetensors.torch import load_file, save_file

    target, drafter, out, sequences = dspark_exported
    rewrite_config(out, tmp_path / "anchor", lambda c: c.pop("sample_from_anchor"))
    assert max(r["max_abs_difference"] for r in dflash_parity(target, drafter, tmp_path / "anchor", sequences)) > 1e-2
    shutil.copytree(out, tmp_path / "order")
    tensors = load_file(str(out / "model.safetensors"))
    name, H = "confidence_head.proj.weight", drafter.sizes["hidden_size"]
    tensors[name] = torch.cat([tensors[name][:, H:], tensors[name][:, :H]], 1).contiguous()
    save_file(tensors, str(tmp_path / "order" / "model.safetensors"))
    model = load_speculators_dflash(tmp_path / "order")
    ours = ours_dflash_logits(drafter, target, sequences[:1], ANCHORS)
    theirs = speculators_dflash_logits(model, target, sequences[:1], ANCHORS)
    assert torch.allclose(ours["logits"], theirs["logits"], atol=1e-3)  # the draft itself is unchanged
    assert float((ours["confidence"] - theirs["confidence"]).abs().max()) > 1e-2


def test_the_card_of_a_dspark_export_takes_no_results_of_a_dflash_drafter(dspark_exported, tmp_path):
    _, _, out, _ = dspark_exported
    results = {"acceptance_length": 2.5, "drafter": {"kind": "dflash", "variant": "dflash"}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    with pytest.raises(ex.DraftsmithError, match="does not hold results of this drafter.*is a dspark drafter"):
        ex.export(out.parent / "best", "speculators", tmp_path / "card", eval_results=str(tmp_path / "results.json"))
    results["drafter"]["variant"] = "dspark"
    (tmp_path / "results.json").write_text(json.dumps(results))
    card = ex.export(out.parent / "best", "speculators", tmp_path / "card", eval_results=str(tmp_path / "results.json"))
    assert "2.5" in (card / "README.md").read_text()


def test_a_dspark_drafter_has_no_reference_layout(dspark_exported, tmp_path):
    _, _, out, _ = dspark_exported
    with pytest.raises(ex.DraftsmithError, match="no Markov or confidence head.*--format speculators"):
        ex.export(out.parent / "best", "dflash", tmp_path / "ref")
