"""`speculators` exports of MTP drafters: the `mtp` layout of the speculators library (vLLM's loader).

What the layout holds (speculators 0.9.0, `models/mtp`): ONE module (`num_nextn_predict_layers: 1`) applied
at every step, i.e. our `shared: true` (or a single module); a Qwen3-family decoder layer named
`mtp_layers.0.*` with `hidden_layernorm`, `token_layernorm`, `input_proj` ([embed; hidden] order, as ours)
and its own `final_layernorm`, which is where our frozen target final norm goes; `transformer_layer_config`
is the verifier's config. The verifier's embedding and lm_head are not stored; engines share the target's.
Anything else (separate modules, other architectures) is refused with a clear error before anything is
written. The folder is validated as the library builds it, and the round trip is checked: it converts back to the
checkpoint's tensors, the target's final norm and the target's config exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import card
from draftsmith.export.skeleton import Layout, RoundTrip, config_fields, read_folder

FORMATS = ("speculators",)
SUPPORTED_MODEL_TYPES = ("qwen3",)
"""target architectures whose decoder layer speculators' `mtp` builds the same way as ours (proven by a test)"""
PREFIX = "mtp_layers.0."
TARGET_NORM = "target final norm"
"""the round trip's name for the final norm the folder carries (the target's, in our drafter)"""
CONFIG_KEYS = {"speculators_model_type", "architectures", "num_nextn_predict_layers", "transformer_layer_config",
               "speculators_config"}


@dataclass(kw_only=True)
class MTPCard(card.SharedFacts):
    """What the card of an MTP export states."""

    speculative_tokens: int


def read_checkpoint(checkpoint: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json of an mtp drafter folder, its tensors), after checking that speculators can express it."""
    meta = json.loads((checkpoint / "config.json").read_text())
    options, model_type = meta["config"], meta["target_config"].get("model_type")
    if not options.get("shared") and options.get("num_modules", 1) > 1:
        raise DraftsmithError(
            f"speculators' mtp layout holds one module applied at every step (num_nextn_predict_layers: 1); "
            f"'{checkpoint}' has {options['num_modules']} separate modules. Train with drafter.shared=true to export it.")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DraftsmithError(
            f"speculators' mtp layout is defined here for {', '.join(SUPPORTED_MODEL_TYPES)} targets only; this "
            f"drafter's target is '{model_type}' (speculators has no MTP layer for it, e.g. Llama).")
    return meta, load_file(str(checkpoint / "model.safetensors"))


def speculators_config(meta: dict, verifier: str, speculative_tokens: int) -> dict:
    """config.json of the speculators `mtp` format."""
    layer = {k: v for k, v in meta["target_config"].items() if not k.startswith("_")}
    return {
        "speculators_model_type": "mtp",
        "architectures": ["MTPDraftModel"],
        "num_nextn_predict_layers": 1,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "mtp",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": list(meta.get("target_architectures") or [])},
        },
    }


def speculators_tensors(tensors: dict[str, torch.Tensor], final_norm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our module's tensors in speculators' names, plus the target's final norm as the layer's final_layernorm."""
    out = {}
    for name, tensor in tensors.items():
        if not name.startswith("mtp_modules.0."):
            raise DraftsmithError(f"Unexpected tensor '{name}' in an MTP checkpoint.")
        out[PREFIX + name.removeprefix("mtp_modules.0.").removeprefix("block.")] = tensor
    out[PREFIX + "final_layernorm.weight"] = final_norm
    return out


def our_names(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The layout's tensors in our names, and the final norm it carries (the target's, in our drafter)."""
    tensors = dict(tensors)
    if PREFIX + "final_layernorm.weight" not in tensors:
        raise DraftsmithError(f"The mtp folder has no {PREFIX}final_layernorm.weight.")
    final_norm = tensors.pop(PREFIX + "final_layernorm.weight")
    ours = {}
    for name, tensor in tensors.items():
        if not name.startswith(PREFIX):
            raise DraftsmithError(f"Unexpected tensor '{name}' in an mtp folder (one module, {PREFIX}*).")
        rest = name.removeprefix(PREFIX)
        own = rest.split(".")[0] in ("input_proj", "token_layernorm", "hidden_layernorm")
        ours["mtp_modules.0." + (rest if own else "block." + rest)] = tensor
    return ours, final_norm


def from_format(config: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor]:
    """speculators' `mtp` layout -> (a draftsmith MTP folder's config.json, tensors in our names, the final norm the
    folder carries): one module shared by every step, the verifier's config as the target's."""
    from transformers import AutoConfig

    if config.get("num_nextn_predict_layers", 1) != 1:
        raise DraftsmithError(f"This mtp folder holds {config['num_nextn_predict_layers']} modules; the speculators "
                              "layout (and draftsmith's reading of it) has one, applied at every step.")
    layer = dict(config["transformer_layer_config"])
    # A library-written config holds only what differs from its class's defaults: rebuild it whole.
    layer = AutoConfig.for_model(layer.pop("model_type"), **layer).to_dict()
    spec = config.get("speculators_config") or {}
    steps = ((spec.get("proposal_methods") or [{}])[0]).get("speculative_tokens") or 1
    verifier = spec.get("verifier") or {}
    meta = {"draftsmith_kind": "mtp", "config": {"num_modules": int(steps), "shared": True},
            "target_config": {k: v for k, v in layer.items() if not k.startswith("_")},
            "target_name": verifier.get("name_or_path"), "target_architectures": verifier.get("architectures", [])}
    return (meta, *our_names(tensors))


def read_back(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """An exported folder -> (a draftsmith MTP folder's config.json, its tensors and, as TARGET_NORM, the final norm it
    carries)."""
    meta, tensors, final_norm = from_format(*read_folder(folder))
    return meta, {**tensors, TARGET_NORM: final_norm}


def validate(folder: Path) -> None:
    """The folder is what speculators' `mtp` model is built from: exactly its config keys, one module of a supported
    architecture, a verifier to share the embedding and lm_head with, and only that module's finite tensors."""
    config, tensors = read_folder(folder)
    problems = [f"config keys must be exactly {sorted(CONFIG_KEYS)}"] if set(config) != CONFIG_KEYS else []
    layer, spec = config.get("transformer_layer_config") or {}, config.get("speculators_config") or {}
    if config.get("num_nextn_predict_layers") != 1 or layer.get("model_type") not in SUPPORTED_MODEL_TYPES:
        problems.append(f"it must hold one module (num_nextn_predict_layers: 1) of a "
                        f"{' or '.join(SUPPORTED_MODEL_TYPES)} decoder layer")
    if not (spec.get("verifier") or {}).get("name_or_path"):
        problems.append("speculators_config.verifier.name_or_path is missing (engines take the embedding from it)")
    problems += [f"{name}: not a tensor of the one module" for name in sorted(tensors) if not name.startswith(PREFIX)]
    problems += [f"{name} holds NaN or inf" for name, t in sorted(tensors.items())
                 if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if problems:
        raise DraftsmithError(f"The speculators mtp export in '{folder}' is not what the library loads: "
                              + "; ".join(problems))


def target_final_norm(meta: dict, verifier: str) -> torch.Tensor:
    """The frozen final norm of the drafter's target (never stored in drafter folders), loaded from `verifier`."""
    from draftsmith.export import drafters_target

    target = drafters_target(verifier, meta.get("target_fingerprint"), "--verifier")
    return target.final_norm.weight.detach().float().cpu().clone()


def layout(checkpoint: str | Path, fmt: str, options) -> Layout:
    """The speculators `mtp` folder of an MTP checkpoint, with the target's final norm as the layer's own."""
    checkpoint = Path(checkpoint)
    meta, tensors = read_checkpoint(checkpoint)
    verifier = options.verifier or meta.get("target_name")
    if not verifier:
        raise DraftsmithError(f"'{checkpoint}' does not say which target it drafts for; pass --verifier.")
    steps = options.speculative_tokens or meta["config"]["num_modules"]
    final_norm = target_final_norm(meta, verifier)
    shared = card.shared_facts(checkpoint, options, "mtp", "is an MTP drafter", verifier)
    round_trip = RoundTrip(read_back, {**tensors, TARGET_NORM: final_norm},
                           config_fields("target_config", meta["target_config"]))
    return Layout(validate=validate, round_trip=round_trip,
                  facts=MTPCard(**shared, speculative_tokens=steps), render=render_card,
                  config=speculators_config(meta, verifier, steps), tensors=speculators_tensors(tensors, final_norm))


def render_card(facts: MTPCard) -> str:
    """README.md of the export: what it is, the training run, measured results, how vLLM serves it."""
    about = ["One multi-token-prediction module (speculators `mtp` layout) applied at every draft step; it reads the "
             "target's last hidden state and shares the target's embedding and lm_head, which this folder does not "
             "store.", ""]
    config = json.dumps({"model": facts.model_ref, "num_speculative_tokens": facts.speculative_tokens})
    serving = ["## Serving", "", "```", f"vllm serve {facts.verifier} --speculative-config '{config}'", "```", ""]
    return card.compose(facts, ["speculative-decoding", "mtp", "draftsmith", "speculators"], "MTP drafter", about,
                        serving)
