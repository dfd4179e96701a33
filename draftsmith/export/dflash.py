"""`dflash` and `speculators` exports of DFlash drafters (DESIGN §4): the DFlash reference layout, and the speculators
library's `dflash` layout (its `dspark` layout for variant dspark).

Reference layout (`--format dflash`): the reference builds `DFlashDraftModel` from a Qwen3 config with
`num_hidden_layers` draft layers, top-level `block_size`, `dflash_config: {mask_token_id, target_layer_ids}` (and
`num_target_layers`, its fallback), and loads `fc`, `hidden_norm`, `norm` and
`layers.{i}.{self_attn,mlp,input_layernorm,post_attention_layernorm}.*`; the target's embedding and lm_head are not
stored (it reads them from the target). Our draft layers use the same names and compute the same thing, so the
tensors go across unchanged.

speculators layout (`--format speculators`, speculators 0.9.0 `models/dflash`, `models/dspark`): `config.json` holds
`speculators_model_type`, `transformer_layer_config` (the draft layers' Qwen3 config), `aux_hidden_state_layer_ids` in
the library's convention (`check.LAYER_ID_SHIFT["speculators"]`), `mask_token_id`, `block_size`, `draft_vocab_size`,
and `sample_from_anchor: false`: block position 0 is the last committed token and positions 1..B-1 are drafted, our
layout (the library's DSpark defaults to true, so it is always written). The body keeps our tensor names; DSpark's
heads are renamed into the library's `markov_head` / `confidence_head` (vanilla Markov head, confidence on [normed
hidden; markov_w1 row]). The embedding is never stored: each time the library loads the folder it refills it from
the verifier named in the config. A full-vocabulary drafter (`draft_vocab_size` = the target's vocabulary) stores no
lm_head either (the library refills it from the verifier too, overwriting any stored copy); a draft-vocabulary
drafter stores its own `lm_head` with `d2t` / `t2d`, which the library keeps.

Each layout is validated against exactly the parameters its config builds, and the round trip gives back the
checkpoint's tensors, layer ids, mask id and block size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import card, skeleton
from draftsmith.export.check import format_layer_id_range, from_format_layer_ids, to_format_layer_ids
from draftsmith.export.skeleton import Layout, RoundTrip, config_fields, read_folder

FORMATS = ("dflash", "speculators")
LAYER_ID_OFFSET = 0
"""DFlash configs list the layers whose *outputs* are read (`hidden_states[id + 1]`): our convention, unshifted"""
DFLASH_KEYS = {"mask_token_id", "target_layer_ids"}
SPECULATORS_KEYS = {"speculators_model_type", "architectures", "transformer_layer_config", "draft_vocab_size",
                    "target_hidden_size", "block_size", "aux_hidden_state_layer_ids", "mask_token_id",
                    "sliding_window_non_causal", "sample_from_anchor", "speculators_config"}
"""what speculators' DFlashSpeculatorConfig saves (its `to_diff_dict`, less the version stamps)"""
DSPARK_HEADS = {"markov_rank": None, "markov_head_type": "vanilla", "enable_confidence_head": True,
                "confidence_head_with_markov": True}
"""DSparkSpeculatorConfig's extra keys, with the values our DSpark heads are (markov_rank: the checkpoint's)"""
ARCHITECTURES = {"dflash": "DFlashSpeculator", "dspark": "DSparkSpeculator"}
HEAD_NAMES = {"markov_w1.weight": "markov_head.markov_w1.weight", "markov_w2.weight": "markov_head.markov_w2.weight",
              "confidence.weight": "confidence_head.proj.weight", "confidence.bias": "confidence_head.proj.bias"}
"""our DSpark heads' tensors -> the speculators library's names"""


def variant(meta: dict) -> str:
    """dflash or dspark (checkpoints written before DSpark existed are dflash)."""
    return meta["config"].get("variant", "dflash")


# --------------------------------------------------------------------------- what each layout builds
def layer_shapes(layer: dict, num_context_layers: int) -> dict[str, tuple[int, ...]]:
    """The DFlash body (fc, hidden_norm, norm, draft layers) that a Qwen3 `layer` config builds, with shapes."""
    H, d = layer["hidden_size"], layer["head_dim"]
    q, kv, inner = layer["num_attention_heads"] * d, layer["num_key_value_heads"] * d, layer["intermediate_size"]
    shapes = {"fc.weight": (H, num_context_layers * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(layer["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                       p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (inner, H), p + "mlp.up_proj.weight": (inner, H),
                       p + "mlp.down_proj.weight": (H, inner), p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,)})
    return shapes


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter the reference's `DFlashDraftModel` builds from `config`, with its shape."""
    return layer_shapes(config, len(config["dflash_config"]["target_layer_ids"]))


def speculators_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter speculators' DFlash/DSpark model builds from `config` and saves (never the embedding or the
    verifier's copies; the lm_head with d2t/t2d only over a draft vocabulary), with its shape."""
    layer = config["transformer_layer_config"]
    shapes = layer_shapes(layer, len(config["aux_hidden_state_layer_ids"]))
    if config["draft_vocab_size"] < layer["vocab_size"]:  # the drafter's own head over its draft vocabulary
        shapes.update({"lm_head.weight": (config["draft_vocab_size"], layer["hidden_size"]),
                       "d2t": (config["draft_vocab_size"],), "t2d": (layer["vocab_size"],)})
    if config["speculators_model_type"] == "dspark":
        r, H = config["markov_rank"], layer["hidden_size"]
        shapes.update({"markov_head.markov_w1.weight": (layer["vocab_size"], r),
                       "markov_head.markov_w2.weight": (config["draft_vocab_size"], r),
                       "confidence_head.proj.weight": (1, H + r), "confidence_head.proj.bias": (1,)})
    return shapes


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], model: str) -> list[str]:
    """Problems of an export's `tensors` against exactly `expected` (names, shapes, finite values)."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    problems = [f"{name}: missing" for name in sorted(set(expected) - set(shapes))]
    problems += [f"{name}: not a parameter {model} has" for name in sorted(set(shapes) - set(expected))]
    problems += [f"{name}: shape {shapes[name]}, expected {shape}" for name, shape in expected.items()
                 if name in shapes and shapes[name] != shape]
    return problems + [f"{name} holds NaN or inf" for name, t in tensors.items()
                       if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def full_attention_problems(layer: dict) -> list[str]:
    """The draft layers must attend fully and without bias, as ours do."""
    sliding = layer.get("use_sliding_window") or any(t != "full_attention" for t in layer.get("layer_types") or [])
    if layer.get("attention_bias") or sliding or layer.get("is_causal"):
        return ["the draft layers attend fully, without bias (attention_bias, use_sliding_window, layer_types, "
                "is_causal)"]
    return []


# --------------------------------------------------------------------------- the DFlash reference layout
def reference_config(meta: dict) -> dict:
    """config.json of the DFlash reference layout for a draftsmith dflash folder's config.json."""
    config = {k: v for k, v in meta["layer_config"].items() if k not in ("architectures", "transformers_version")}
    ids = [i + LAYER_ID_OFFSET for i in meta["target_layer_ids"]]
    return {**config, "architectures": ["DFlashDraftModel"], "num_hidden_layers": meta["config"]["num_layers"],
            "num_target_layers": meta["num_target_layers"], "block_size": meta["config"]["block_size"],
            "dflash_config": {"mask_token_id": meta["mask_token_id"], "target_layer_ids": ids}}


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
    problems += full_attention_problems(config)
    if not problems:
        ids = config["dflash_config"]["target_layer_ids"]
        if any(not 0 <= i < config["num_target_layers"] for i in ids):
            problems.append(f"target_layer_ids {ids} outside the target's layers 0..{config['num_target_layers'] - 1}")
        tensors = load_file(str(folder / "model.safetensors"))
        problems += check_tensors(tensors, expected_shapes(config), "DFlashDraftModel")
    if problems:
        raise DraftsmithError(f"The dflash export in '{folder}' is not what DFlashDraftModel loads: " + "; ".join(problems))


def check_round_trip(folder: Path, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The reference folder reads back as the checkpoint: its tensors, layer ids, mask id, block size, layer config."""
    skeleton.check_round_trip(folder, round_trip("dflash", meta, tensors))


# --------------------------------------------------------------------------- the speculators dflash / dspark layouts
def speculators_config(meta: dict, verifier: str, speculative_tokens: int) -> dict:
    """config.json of speculators' `dflash` layout (`dspark` for variant dspark) for a draftsmith dflash folder."""
    kind, size = variant(meta), meta["config"]["block_size"]
    layer = {k: v for k, v in meta["layer_config"].items() if k not in ("architectures", "transformers_version")}
    config = {
        "speculators_model_type": kind, "architectures": [ARCHITECTURES[kind]],
        "transformer_layer_config": {**layer, "num_hidden_layers": meta["config"]["num_layers"]},
        "draft_vocab_size": meta.get("draft_vocab_size") or meta["vocab_size"], "target_hidden_size": meta["hidden_size"],
        "block_size": size,
        "aux_hidden_state_layer_ids": to_format_layer_ids("speculators", meta["target_layer_ids"]),
        "mask_token_id": meta["mask_token_id"], "sliding_window_non_causal": False, "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": kind, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": list(meta.get("target_architectures") or [])},
        },
    }
    if kind == "dspark":
        config.update({**DSPARK_HEADS, "markov_rank": meta["config"]["markov_rank"]})
    return config


def validate_speculators(folder: Path, num_target_layers: int) -> None:
    """The folder is what speculators' DFlash/DSpark model loads, read as we mean it: exactly its keys, our block
    layout, the target's vocabulary or a consistent draft vocabulary, capturable layer ids, a full-attention Qwen3
    layer config, its parameters."""
    config = json.loads((folder / "config.json").read_text())
    kind, problems = config.get("speculators_model_type"), []
    if kind not in ARCHITECTURES:
        raise DraftsmithError(f"'{folder}' is not a speculators dflash or dspark export (speculators_model_type "
                              f"{kind!r}).")
    keys = SPECULATORS_KEYS | (set(DSPARK_HEADS) if kind == "dspark" else set())
    if set(config) != keys:
        problems.append(f"config keys must be exactly {sorted(keys)} (missing {sorted(keys - set(config))}, unknown "
                        f"{sorted(set(config) - keys)})")
    layer, spec = config.get("transformer_layer_config") or {}, config.get("speculators_config") or {}
    if config.get("architectures") != [ARCHITECTURES[kind]] or spec.get("algorithm") != kind:
        problems.append(f"architectures and speculators_config.algorithm must be [{ARCHITECTURES[kind]!r}] and {kind!r}")
    if layer.get("model_type") != "qwen3":
        problems.append("transformer_layer_config must be a qwen3 config (the library's DFlash layers are Qwen3 layers)")
    problems += full_attention_problems(layer)
    if config.get("sample_from_anchor") is not False or config.get("sliding_window_non_causal") is not False:
        problems.append("sample_from_anchor and sliding_window_non_causal must be written as false (block position 0 "
                        "is the last committed token; the DSpark default is true)")
    vocab = layer.get("vocab_size") or 0
    if not isinstance(config.get("draft_vocab_size"), int) or not 1 <= config["draft_vocab_size"] <= vocab:
        problems.append(f"draft_vocab_size must be an integer in 1..{vocab}, the target's vocabulary")
    if config.get("target_hidden_size") != layer.get("hidden_size"):
        problems.append("target_hidden_size must be the target's hidden size (the drafter reads its embedding)")
    size = config.get("block_size")
    if not isinstance(size, int) or size < 2:
        problems.append("block_size must be an integer >= 2")
    elif not 1 <= ((spec.get("proposal_methods") or [{}])[0].get("speculative_tokens") or 0) <= size - 1:
        problems.append(f"speculative_tokens must lie in 1..{size - 1} (block_size - 1 positions are drafted)")
    if not isinstance(config.get("mask_token_id"), int) or not 0 <= config["mask_token_id"] < (layer.get("vocab_size") or 0):
        problems.append("mask_token_id must be a token id of the target's vocabulary")
    ids, valid = config.get("aux_hidden_state_layer_ids"), format_layer_id_range("speculators", num_target_layers)
    if not isinstance(ids, list) or not ids or len(set(ids)) != len(ids) or any(i not in valid for i in ids):
        problems.append(f"aux_hidden_state_layer_ids {ids} must be distinct ids in {valid.start}..{valid.stop - 1} "
                        f"for a {num_target_layers}-layer target")
    if not (spec.get("verifier") or {}).get("name_or_path"):
        problems.append("speculators_config.verifier.name_or_path is missing (the library reads the embedding and "
                        "lm_head from it)")
    if kind == "dspark" and any(config.get(k) != v for k, v in DSPARK_HEADS.items() if v is not None):
        problems.append(f"the DSpark heads must be {', '.join(f'{k}: {v}' for k, v in DSPARK_HEADS.items() if v is not None)}")
    if not problems:
        tensors = load_file(str(folder / "model.safetensors"))
        problems += check_tensors(tensors, speculators_shapes(config), f"speculators' {kind} model")
    if not problems and config["draft_vocab_size"] < vocab:
        d2t, t2d = tensors["d2t"], tensors["t2d"]
        if d2t.dtype != torch.long or t2d.dtype != torch.bool or not torch.equal(
                torch.arange(d2t.numel()) + d2t, t2d.nonzero().flatten()):
            problems.append("d2t (int64 offsets) and t2d (bool) must mark the same tokens: t2d true exactly at "
                            "i + d2t[i], in increasing order")
    if problems:
        raise DraftsmithError(f"The speculators {kind} export in '{folder}' is not what the library loads as this "
                              "drafter: " + "; ".join(problems))


def speculators_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors in the library's names (the body keeps ours; DSpark's heads move into its head modules)."""
    return {HEAD_NAMES.get(name, name): tensor.contiguous() for name, tensor in tensors.items()}


def check_speculators_round_trip(folder: Path, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The speculators folder reads back as the checkpoint (from the library's fields only): tensors, layer ids, mask
    id, block size, variant, Markov rank, draft vocabulary and the draft-layer config."""
    skeleton.check_round_trip(folder, round_trip("speculators", meta, tensors))


# --------------------------------------------------------------------------- reading either layout back
def _body(layer: dict, kind: str) -> dict:
    """A draft-layer config rebuilt whole as the Qwen3 config both layouts' models build (library-written configs hold
    only what differs from the defaults), refused unless it attends as ours do."""
    from transformers import Qwen3Config

    layer = {k: v for k, v in layer.items() if k not in ("model_type", "architectures", "transformers_version")}
    layer = Qwen3Config(**layer).to_dict()
    problems = full_attention_problems(layer)
    if problems:
        raise DraftsmithError(f"This {kind} folder's draft layers do not compute what draftsmith's do: {problems[0]}.")
    return layer


def from_reference(config: dict, num_target_layers: int) -> dict:
    """The DFlash reference layout's config.json -> a draftsmith dflash folder's config.json (the tensors keep their
    names). Read as the reference reads it: `dflash_config` first, then the top level, then its defaults (block 16,
    layer ids spread over `num_target_layers`, the folder's own or else the target's)."""
    from draftsmith.drafters.dflash import default_layer_ids

    options = config.get("dflash_config") or {}
    layer = _body({k: v for k, v in config.items() if k not in ("dflash_config", "block_size", "num_target_layers",
                                                                "auto_map", "mask_token_id", "target_layer_ids")},
                  "dflash")
    target_layers = int(config.get("num_target_layers") or num_target_layers)
    draft_layers = layer["num_hidden_layers"]
    ids = options.get("target_layer_ids", config.get("target_layer_ids")) or (
        [target_layers // 2] if draft_layers == 1 else default_layer_ids(target_layers, draft_layers))
    mask = options.get("mask_token_id", config.get("mask_token_id"))
    if mask is None:
        raise DraftsmithError("This DFlash folder names no mask_token_id (dflash_config.mask_token_id), which drafting "
                              "needs.")
    ids = [int(i) - LAYER_ID_OFFSET for i in ids]
    block = int(options.get("block_size", config.get("block_size", 16)))
    return {"draftsmith_kind": "dflash",
            "config": {"block_size": block, "num_layers": draft_layers, "num_target_layers": len(ids),
                       "target_layer_ids": ids, "mask_token_id": int(mask), "variant": "dflash"},
            "hidden_size": layer["hidden_size"], "vocab_size": layer["vocab_size"], "num_target_layers": target_layers,
            "target_layer_ids": ids, "mask_token_id": int(mask), "layer_config": layer}


def from_speculators(config: dict, tensors: dict[str, torch.Tensor], num_target_layers: int) -> tuple[dict, dict]:
    """speculators' `dflash` / `dspark` layout -> (a draftsmith dflash folder's config.json, tensors in our names).
    Refused unless the library computes with it what our drafter does: block position 0 the last committed token
    (`sample_from_anchor: false`), the vanilla Markov head and the confidence head on [hidden; Markov row]. Any copy
    of the verifier's embedding or full-vocabulary lm_head stays in the tensors for the caller to check and drop."""
    kind = config["speculators_model_type"]
    layer = config.get("transformer_layer_config") or {}
    if layer.get("model_type", "qwen3") != "qwen3":
        raise DraftsmithError(f"This speculators {kind} folder has {layer.get('model_type')} draft layers; ours are "
                              "Qwen3's.")
    layer = _body(layer, f"speculators {kind}")
    refused = ["sample_from_anchor: true (the anchor position drafts too)"] if config.get(
        "sample_from_anchor", kind == "dspark") else []  # the library's defaults: false for dflash, true for dspark
    if kind == "dspark":
        refused += [f"{key}: {config.get(key, value)}" for key, value in DSPARK_HEADS.items()
                    if value is not None and config.get(key, value) != value]
    ids, mask = config.get("aux_hidden_state_layer_ids"), config.get("mask_token_id")
    if not ids or mask is None:
        refused.append("no aux_hidden_state_layer_ids or mask_token_id")
    if refused:
        raise DraftsmithError(f"This speculators {kind} folder has {'; '.join(refused)}, which draftsmith's {kind} "
                              "drafter does not compute.")
    ids, V = from_format_layer_ids("speculators", ids), layer["vocab_size"]
    rows = int(config.get("draft_vocab_size") or V)
    options = {"block_size": int(config.get("block_size", 8)), "num_layers": layer["num_hidden_layers"],
               "num_target_layers": len(ids), "target_layer_ids": ids, "mask_token_id": int(mask), "variant": kind}
    if kind == "dspark":
        options["markov_rank"] = int(config["markov_rank"])
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    meta = {"draftsmith_kind": "dflash", "config": options, "hidden_size": config.get("target_hidden_size") or
            layer["hidden_size"], "vocab_size": V, "num_target_layers": num_target_layers, "target_layer_ids": ids,
            "mask_token_id": int(mask), "layer_config": layer, "target_name": verifier.get("name_or_path"),
            "target_architectures": verifier.get("architectures", [])}
    if rows < V:
        meta["draft_vocab_size"] = rows
    ours = {v: k for k, v in HEAD_NAMES.items()}
    return meta, {ours.get(name, name): tensor for name, tensor in tensors.items()}


def round_trip(fmt: str, meta: dict, tensors: dict[str, torch.Tensor]) -> RoundTrip:
    """What of the checkpoint (`meta`, its config.json; `tensors`) must come back when the `fmt` folder is read back as
    `draftsmith eval` reads it."""
    options = meta["config"]
    fields = {**config_fields("layer_config", meta["layer_config"]), "config.variant": variant(meta),
              "config.block_size": options["block_size"], "config.num_layers": options["num_layers"],
              "config.markov_rank": options["markov_rank"] if variant(meta) == "dspark" else None,
              **{key: meta.get(key) for key in ("hidden_size", "vocab_size", "num_target_layers", "target_layer_ids",
                                                "mask_token_id", "draft_vocab_size")}}
    return RoundTrip(partial(read_back, fmt, meta["num_target_layers"]), tensors, fields)


def read_back(fmt: str, num_target_layers: int, folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A written `fmt` folder -> (a draftsmith dflash folder's config.json, tensors in our names)."""
    config, tensors = read_folder(folder)
    if fmt == "speculators":
        return from_speculators(config, tensors, num_target_layers)
    return from_reference(config, num_target_layers), tensors


# --------------------------------------------------------------------------- export
def layout(checkpoint: Path, fmt: str, options) -> Layout:
    """`fmt` of the DFlash checkpoint: the config and tensors the layout holds, its validator, its round trip."""
    meta = json.loads((checkpoint / "config.json").read_text())
    tensors = load_file(str(checkpoint / "model.safetensors"))
    if options.include_embedding:
        raise DraftsmithError("--include-embedding is for EAGLE-3 drafters: the DFlash reference reads the target's "
                              "embedding, and speculators' DFlash/DSpark model refills it (and the lm_head) from the "
                              "verifier every time it loads, overwriting a stored copy.")
    kind, size = variant(meta), meta["config"]["block_size"]
    shared = card.shared_facts(checkpoint, options, "dflash", f"is a {kind} drafter", meta.get("target_name"),
                               variant=kind)
    if fmt == "speculators":
        tokens = options.speculative_tokens or size - 1
        if not 1 <= tokens <= size - 1:
            raise DraftsmithError(f"--speculative-tokens {tokens}: a block of {size} drafts {size - 1} tokens at most.")
        config = speculators_config(meta, shared["verifier"], tokens)
        exported, ids = speculators_tensors(tensors), config["aux_hidden_state_layer_ids"]
        check = partial(validate_speculators, num_target_layers=meta["num_target_layers"])
    else:
        if kind != "dflash":
            raise DraftsmithError(f"'{checkpoint}' is a {kind} drafter; the DFlash reference layout has no Markov or "
                                  "confidence head. Export it with --format speculators (the speculators dspark layout).")
        if meta.get("draft_vocab_size"):
            raise DraftsmithError(f"'{checkpoint}' drafts over a draft vocabulary of {meta['draft_vocab_size']} tokens "
                                  "through its own head; the DFlash reference layout reads the target's lm_head over the "
                                  "whole vocabulary. Export it with --format speculators (which stores the head with "
                                  "d2t/t2d).")
        tokens, config, exported, check = size - 1, reference_config(meta), tensors, validate
        ids = config["dflash_config"]["target_layer_ids"]
    facts = DFlashCard(**shared, fmt=fmt, variant=kind, block_size=size, speculative_tokens=tokens,
                       num_layers=meta["config"]["num_layers"], target_layer_ids=meta["target_layer_ids"],
                       format_layer_ids=ids, draft_vocab_size=meta.get("draft_vocab_size"),
                       parameters=sum(t.numel() for t in tensors.values() if t.is_floating_point()))
    return Layout(validate=check, round_trip=round_trip(fmt, meta, tensors), facts=facts, render=render_card,
                  config=config, tensors=exported)


# --------------------------------------------------------------------------- the model card
@dataclass(kw_only=True)
class DFlashCard(card.SharedFacts):
    """What the card of a DFlash (or DSpark) export states."""

    fmt: str
    variant: str
    block_size: int
    speculative_tokens: int
    num_layers: int
    target_layer_ids: list[int]
    format_layer_ids: list[int]
    draft_vocab_size: int | None  # None: the target's whole vocabulary through its lm_head
    parameters: int


def render_card(facts: DFlashCard) -> str:
    """README.md of a DFlash export: metadata, what it is, training, results, loading."""
    name = "DSpark" if facts.variant == "dspark" else "DFlash"
    layout = "DFlash reference (`DFlashDraftModel`)" if facts.fmt == "dflash" else f"speculators `{facts.variant}`"
    about = [
        (f"A {name} block-diffusion drafter trained with draftsmith on the frozen `{facts.verifier}`: from the "
         f"target's features at layers {facts.target_layer_ids} (layer outputs) it drafts a block of "
         f"{facts.block_size - 1} tokens in one forward pass; the target verifies them in one pass, so the output is "
         "exactly the target's own."), ""]
    if facts.variant == "dspark":
        about += ["Its two small heads: a Markov head adds a low-rank logit bias from the token drafted just before "
                  "each position, and a confidence head predicts whether each position will be accepted.", ""]
    convention = "layer outputs, as the reference reads them" if facts.fmt == "dflash" else \
        "+1: the library reads HF `hidden_states[id]`, the stream entering layer id"
    vocabulary = (f"a draft vocabulary of {facts.draft_vocab_size:,} tokens, its own lm_head (`d2t`/`t2d` map its rows "
                  "to target ids)" if facts.draft_vocab_size else "the target's whole vocabulary, through the target's "
                  "lm_head")
    about += [*card.table([("block size", facts.block_size), ("draft layers", facts.num_layers),
                           ("target layer ids in config.json", f"{facts.format_layer_ids} ({convention})"),
                           ("parameters", f"{facts.parameters:,}"), ("format", layout), ("vocabulary", vocabulary)]), ""]
    if facts.fmt == "speculators":
        stored = ("The target's embedding is not stored: each time the library loads this folder it fills it from "
                  if facts.draft_vocab_size else
                  "The target's embedding and lm_head are not stored, as in the speculators library's own "
                  "full-vocabulary checkpoints: each time the library loads this folder it fills both from ")
        about += [stored + f"the verifier named in config.json (`{facts.verifier}`), which must then be readable (a hub "
                  "id with network access, or a local folder); it would overwrite a stored copy. Block position 0 is "
                  "the last accepted token (`sample_from_anchor: false`).", ""]
        module = "dspark" if facts.variant == "dspark" else "dflash"
        model = "DSparkDraftModel" if facts.variant == "dspark" else "DFlashDraftModel"
        loading = ["## Loading", "", "```python", f"from speculators.models.{module} import {model}", "",
                   f"drafter = {model}.from_pretrained({facts.model_ref!r})", "```", "",
                   "This folder is checked against the speculators library (0.9.0) only. vLLM reads speculators "
                   f"`{facts.variant}` folders in the versions that support the type:", "", "```bash",
                   f"vllm serve {facts.verifier} --speculative-config '{{\"model\": \"{facts.model_ref}\", "
                   f"\"num_speculative_tokens\": {facts.speculative_tokens}}}'", "```", ""]
    else:
        about += ["The target's embedding and lm_head are not stored; the reference reads them from the target.", ""]
        loading = ["## Loading", "", "```python", "from dflash.model import DFlashDraftModel", "",
                   f"drafter = DFlashDraftModel.from_pretrained({facts.model_ref!r})",
                   "# drafter.spec_generate(target, input_ids, max_new_tokens, stop_token_ids)", "```", ""]
    tags = ["speculative-decoding", facts.variant, "draftsmith"] + (["speculators"] if facts.fmt == "speculators" else [])
    return card.compose(facts, tags, f"{name} drafter", about, loading)
