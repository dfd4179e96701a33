"""`dflash` exports: a DFlash drafter in the layout of the DFlash reference code (`DFlashDraftModel`, DESIGN §4).

The reference builds `DFlashDraftModel` from a Qwen3 config with `num_hidden_layers` draft layers, top-level
`block_size`, `dflash_config: {mask_token_id, target_layer_ids}` (and `num_target_layers`, its fallback), and
loads `fc`, `hidden_norm`, `norm` and `layers.{i}.{self_attn,mlp,input_layernorm,post_attention_layernorm}.*`;
the target's embedding and lm_head are not stored (it reads them from the target). Our draft layers use the
same names and compute the same thing, so the tensors go across unchanged. The validator checks the folder
against exactly the parameters that config builds; the round trip gives back the checkpoint's tensors and ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import card

FORMATS = ("dflash",)
LAYER_ID_OFFSET = 0
"""DFlash configs list the layers whose *outputs* are read (`hidden_states[id + 1]`): our convention, unshifted"""
DFLASH_KEYS = {"mask_token_id", "target_layer_ids"}


@dataclass(kw_only=True)
class DFlashCard(card.SharedFacts):
    """What the card of a DFlash export states."""

    block_size: int
    num_layers: int
    target_layer_ids: list[int]
    parameters: int


def reference_config(meta: dict) -> dict:
    """config.json of the DFlash reference layout for a draftsmith dflash folder's config.json."""
    config = {k: v for k, v in meta["layer_config"].items() if k not in ("architectures", "transformers_version")}
    ids = [i + LAYER_ID_OFFSET for i in meta["target_layer_ids"]]
    return {**config, "architectures": ["DFlashDraftModel"], "num_hidden_layers": meta["config"]["num_layers"],
            "num_target_layers": meta["num_target_layers"], "block_size": meta["config"]["block_size"],
            "dflash_config": {"mask_token_id": meta["mask_token_id"], "target_layer_ids": ids}}


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter the reference's `DFlashDraftModel` builds from `config`, with its shape."""
    H, d = config["hidden_size"], config["head_dim"]
    q, kv, inner = config["num_attention_heads"] * d, config["num_key_value_heads"] * d, config["intermediate_size"]
    n = len(config["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (H, n * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                       p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (inner, H), p + "mlp.up_proj.weight": (inner, H),
                       p + "mlp.down_proj.weight": (H, inner), p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,)})
    return shapes


def validate(folder: Path) -> None:
    """The folder is what the reference loads: its keys, a full-attention Qwen3 config, exactly its parameters."""
    config = json.loads((folder / "config.json").read_text())
    problems = []
    if config.get("architectures") != ["DFlashDraftModel"]:
        problems.append(f"architectures is {config.get('architectures')}, not ['DFlashDraftModel']")
    if set(config.get("dflash_config") or {}) != DFLASH_KEYS:
        problems.append(f"dflash_config must hold exactly {sorted(DFLASH_KEYS)}")
    if not isinstance(config.get("block_size"), int) or config["block_size"] < 2:
        problems.append("block_size must be an integer >= 2")
    if config.get("attention_bias") or config.get("use_sliding_window") or config.get("is_causal"):
        problems.append("the draft layers attend fully, without bias (attention_bias, use_sliding_window, is_causal)")
    if not problems:
        ids = config["dflash_config"]["target_layer_ids"]
        if any(not 0 <= i < config["num_target_layers"] for i in ids):
            problems.append(f"target_layer_ids {ids} outside the target's layers 0..{config['num_target_layers'] - 1}")
        expected = expected_shapes(config)
        shapes = {name: tuple(t.shape) for name, t in load_file(str(folder / "model.safetensors")).items()}
        problems += [f"{name}: missing" for name in sorted(set(expected) - set(shapes))]
        problems += [f"{name}: not a parameter DFlashDraftModel has" for name in sorted(set(shapes) - set(expected))]
        problems += [f"{name}: shape {shapes[name]}, expected {shape}" for name, shape in expected.items()
                     if name in shapes and shapes[name] != shape]
    if problems:
        raise DraftsmithError(f"The dflash export in '{folder}' is not what DFlashDraftModel loads: " + "; ".join(problems))


def check_round_trip(folder: Path, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The folder's tensors, layer ids, mask id and block size are the checkpoint's."""
    config = json.loads((folder / "config.json").read_text())
    back = load_file(str(folder / "model.safetensors"))
    same = set(back) == set(tensors) and all(torch.equal(back[n], tensors[n]) for n in tensors)
    ids = [i - LAYER_ID_OFFSET for i in config["dflash_config"]["target_layer_ids"]]
    same &= ids == meta["target_layer_ids"] and config["dflash_config"]["mask_token_id"] == meta["mask_token_id"]
    if not same or config["block_size"] != meta["config"]["block_size"]:
        raise DraftsmithError(f"The dflash export in '{folder}' does not convert back to the checkpoint.")


def write(checkpoint: Path, fmt: str, staging: Path, options) -> DFlashCard:
    """Write the DFlash reference layout into `staging`, validate it, check the round trip, add the card."""
    meta = json.loads((checkpoint / "config.json").read_text())
    tensors = load_file(str(checkpoint / "model.safetensors"))
    (staging / "config.json").write_text(json.dumps(reference_config(meta), indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging / "model.safetensors"),
              metadata={"format": "pt"})
    validate(staging)
    check_round_trip(staging, meta, tensors)
    shared, results_path = card.shared_facts(checkpoint, options, "dflash", "is DFlash", meta.get("target_name"))
    facts = DFlashCard(**shared, block_size=meta["config"]["block_size"], num_layers=meta["config"]["num_layers"],
                       target_layer_ids=meta["target_layer_ids"], parameters=sum(t.numel() for t in tensors.values()))
    return card.finish_card(staging, facts, results_path, render_card)


def render_card(facts: DFlashCard) -> str:
    """README.md of a DFlash export: metadata, what it is, training, results, loading."""
    about = [
        f"# DFlash drafter for {facts.verifier}", "",
        (f"A DFlash block-diffusion drafter trained with draftsmith on the frozen `{facts.verifier}`: from the target's "
        f"features at layers {facts.target_layer_ids} (layer outputs) it drafts a block of {facts.block_size - 1} tokens "
        "in one forward pass; the target verifies them in one pass, so the output is exactly the target's own."), "",
        "| | |", "|---|---|", f"| block size | {facts.block_size} |", f"| draft layers | {facts.num_layers} |",
        f"| parameters | {facts.parameters:,} |", "| format | DFlash reference (`DFlashDraftModel`) |", ""]
    loading = ["## Loading", "", "```python", "from dflash.model import DFlashDraftModel", "",
               f"drafter = DFlashDraftModel.from_pretrained({facts.model_ref!r})",
               "# drafter.spec_generate(target, input_ids, max_new_tokens, stop_token_ids)", "```", ""]
    tags = ["speculative-decoding", "dflash", "draftsmith"]
    return "\n".join([card.front_matter(tags, facts.verifier, card.is_hub_id(facts.verifier), facts.license),
                      "\n".join(about), card.training_section(facts.training),
                      card.results_section(facts.results, facts.results_source, facts.plots),
                      card.verifier_section(facts.training, facts.verifier), "\n".join(loading)])
