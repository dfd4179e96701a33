"""Reading EAGLE-3 exports back: a speculators (`eagle3`, `peagle`) or SGLang folder -> a draftsmith EAGLE-3 drafter's
config.json and tensors, from the fields engines read only.

`draftsmith.export.readers` reads our exports and public checkpoints of either layout through `from_format`, and
the export's round trip (`draftsmith.export.eagle3.round_trip`) reads its own folder back the same way, so a field an
engine would read differently from what the writer meant shows up before the folder ships.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.check import SGLANG_EXTRA_KEYS, detect_format, from_format_layer_ids
from draftsmith.export.skeleton import CONFIG, read_folder

UNSUPPORTED_OPTIONS = {"norm_before_fc": "an RMSNorm on the fused features before fc"}
"""speculators EAGLE-3 options draftsmith's drafter does not compute, with what each one adds"""
EAGLE31_OPTIONS = ("fc_norm", "norm_output")
"""speculators EAGLE-3 options of EAGLE 3.1, which draftsmith's drafter computes (drafter.fc_norm, norm_output)"""


def to_checkpoint(folder: str | Path) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """An exported folder -> (format, eagle drafter meta, tensors in our names), from engine-visible fields only."""
    return from_format(*read_folder(Path(folder)))


def from_format(config: dict, tensors: dict[str, torch.Tensor]) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """A speculators or SGLang EAGLE-3 config.json and its tensors -> (format, eagle drafter meta, tensors in our
    names). Public checkpoints of either layout read the same way, as far as they compute what our drafter does:
    Llama-style layers (several only in the speculators layout) and none of `UNSUPPORTED_OPTIONS`; anything else is
    refused, naming it.

    The meta lacks `target_num_layers` (engines take it from the target); `draftsmith.export.readers` fills it in.
    """
    fmt = detect_format(config)
    parallel = config.get("speculators_model_type") == "peagle"
    if fmt == "speculators":
        layer, ids = config["transformer_layer_config"], config.get("eagle_aux_hidden_state_layer_ids")
        verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    else:
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        layer = {k: v for k, v in config.items() if k not in SGLANG_EXTRA_KEYS}
        verifier = {}
        tensors = {name.replace("midlayer.", "layers.0.", 1): t for name, t in tensors.items()}
    refused = [f"{key} ({what})" for key, what in UNSUPPORTED_OPTIONS.items() if config.get(key)]
    layers = layer.get("num_hidden_layers", 1)
    if layer.get("model_type", "llama") != "llama" or not isinstance(layers, int) or layers < 1 \
            or (fmt == "sglang" and layers != 1):
        refused.append(f"{layers} {layer.get('model_type')} draft layer(s) (ours: Llama-style layers, no q/k norms; "
                       "SGLang's layout: one)")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        refused.append("attention or MLP biases")
    if not isinstance(ids, list) or not ids:
        refused.append("no aux hidden-state layer ids (engines would fall back to other layers)")
    if parallel and not isinstance(config.get("mask_token_id"), int):
        refused.append("a P-EAGLE layout without mask_token_id (the token its later positions read)")
    if refused:
        raise DraftsmithError(f"This {fmt} EAGLE-3 folder uses {'; '.join(refused)}, which draftsmith's EAGLE-3 "
                              "drafter does not compute.")
    layer = {k: v for k, v in layer.items() if k not in ("rope_theta", "rope_scaling", "architectures")}
    rope = _rope_parameters(config if fmt == "sglang" else config["transformer_layer_config"])
    if rope is not None:
        layer["rope_parameters"] = rope
    layer.update(draft_vocab_size=int(config["draft_vocab_size"]),
                 target_hidden_size=int(config.get("target_hidden_size") or layer["hidden_size"]))
    meta = {
        "draftsmith_kind": "eagle",
        "config": {"variant": "peagle" if parallel else "eagle3", "layers": from_format_layer_ids(fmt, ids),
                   "num_layers": layers,
                   "norm_before_residual": bool(config.get("norm_before_residual", False)),
                   **{key: bool(config.get(key, False)) for key in EAGLE31_OPTIONS},
                   **({"mask_token_id": config["mask_token_id"], "ttt_steps": _speculative_tokens(config)}
                      if parallel else {})},
        "transformer_layer_config": layer,
        "target_name": verifier.get("name_or_path"),
        "target_architectures": verifier.get("architectures", []),
    }
    return fmt, meta, tensors


def _speculative_tokens(config: dict) -> int:
    """The draft length a speculators config's default proposal names (P-EAGLE: the positions one forward drafts)."""
    spec = config.get("speculators_config") or {}
    methods = {m.get("proposal_type"): m for m in spec.get("proposal_methods") or []}
    method = methods.get(spec.get("default_proposal_method")) or next(iter(methods.values()), {})
    return int(method.get("speculative_tokens") or 1)


def _rope_parameters(layer: dict) -> dict | None:
    """The layer's RoPE as transformers v5 reads it: `rope_parameters`, or the v4 `rope_theta` / `rope_scaling` that
    public configs written with transformers 4 hold (dropping them would leave Llama's default theta)."""
    if layer.get("rope_parameters") is not None or layer.get("rope_theta") is None:
        return layer.get("rope_parameters")
    scaling = dict(layer.get("rope_scaling") or {})
    scaling["rope_type"] = scaling.pop("type", None) or scaling.get("rope_type") or "default"
    return {**scaling, "rope_theta": layer["rope_theta"]}


def is_export(folder: str | Path) -> bool:
    """True when `folder` holds a speculators or SGLang EAGLE-3 export (for drafter-spec resolvers)."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        return False
    try:
        detect_format(json.loads(path.read_text()))
    except (DraftsmithError, ValueError):
        return False
    return True
