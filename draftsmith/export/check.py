"""Export formats' conventions and the validator every export must pass (DESIGN §4).

Each format's layer-id convention is written down here, once; `validate_export` re-reads an
exported folder from disk and checks every field serving engines rely on, so an export that
would load but silently draft badly (missing aux ids, arange d2t, off-by-one layers) never counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError

FORMATS = ("speculators", "sglang")

# --------------------------------------------------------------------------- layer-id conventions
# The one place where each format's layer-id convention is written down (DESIGN §4).
# draftsmith id i = the output of 0-based decoder layer i.
# - vLLM collects aux state i as the hidden stream *entering* layer i (= output of layer i-1) and
#   uses config ids as they are, so the speculators config holds our id + 1. The speculators library
#   reads every layout's ids this way (HF `hidden_states[id]`): EAGLE-3's eagle_aux_hidden_state_layer_ids
#   and DFlash/DSpark's aux_hidden_state_layer_ids (its converter turns a DFlash reference id i into i + 1).
# - SGLang adds 1 to the config ids itself before capturing "before layer id+1", so the SGLang
#   config holds our ids unchanged. Since sgl-project/sglang#25454 (2026-05) it adds 1 only when
#   the first id is 1 and otherwise reads the ids as capture-before ids; old and new SGLang agree
#   only when our first layer is 1 (the EAGLE-3 default), so SGLang exports require it.
# Both engines capture inside the layer loop, before a layer runs, so the output of the last
# layer (our id L-1) cannot be captured: our ids must lie in 0..L-2.
LAYER_ID_SHIFT = {"speculators": 1, "sglang": 0}


def to_format_layer_ids(fmt: str, layers: list[int]) -> list[int]:
    """Our output-layer ids -> the ids the format's config must hold."""
    return [int(i) + LAYER_ID_SHIFT[fmt] for i in layers]


def from_format_layer_ids(fmt: str, ids: list[int]) -> list[int]:
    """The ids a format's config holds -> our output-layer ids."""
    return [int(i) - LAYER_ID_SHIFT[fmt] for i in ids]


SGLANG_FIRST_LAYER = 1  # the one first id that every SGLang version reads the same way


def format_layer_id_range(fmt: str, num_target_layers: int) -> range:
    """Config ids an engine can actually capture for a target with `num_target_layers` layers."""
    shift = LAYER_ID_SHIFT[fmt]
    return range(shift, num_target_layers - 1 + shift)



def detect_format(config: dict) -> str:
    """Which export format a config.json belongs to; clear error for anything else."""
    if config.get("speculators_model_type") in ("eagle3", "peagle"):  # peagle: EAGLE-3 + parallel drafting
        return "speculators"
    if "LlamaForCausalLMEagle3" in (config.get("architectures") or []):
        return "sglang"
    raise DraftsmithError(
        "This folder is neither a speculators EAGLE-3 export (speculators_model_type 'eagle3' or 'peagle') nor "
        "an SGLang EAGLE-3 export (architectures ['LlamaForCausalLMEagle3'])."
    )


# --------------------------------------------------------------------------- validator
@dataclass
class Expected:
    """What the source checkpoint says; fields left None are checked only for plausibility."""

    target_layers: list[int] | None = None  # our convention
    num_target_layers: int | None = None
    target_hidden_size: int | None = None
    target_vocab_size: int | None = None


SPECULATORS_KEYS = {"speculators_model_type", "architectures", "draft_vocab_size", "target_hidden_size",
                    "eagle_aux_hidden_state_layer_ids", "norm_before_residual", "transformer_layer_config",
                    "speculators_config"}
SPECULATORS_OPTIONAL_KEYS = {"fc_norm", "norm_output"}  # EAGLE 3.1's flags, written when true
PEAGLE_KEYS = {"mask_token_id"}  # what the peagle layout adds
SGLANG_EXTRA_KEYS = {"draft_vocab_size", "target_hidden_size", "eagle_config"}
WEIGHT_FILES = {"config.json", "model.safetensors"}
CARD_FILES = {"README.md"}


class Problems(list):
    def need(self, ok: bool, message: str) -> bool:
        if not ok:
            self.append(message)
        return ok


def validate_export(folder: str | Path, fmt: str | None = None, expected: Expected | None = None) -> str:
    """Re-read an exported folder from disk and check every field engines rely on; return its format.

    Raises DraftsmithError listing every problem found.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder, expected = Path(folder), expected or Expected()
    problems = Problems()
    check_files(folder, problems)
    if problems:
        raise_problems(folder, problems)
    try:
        config = json.loads((folder / "config.json").read_text())
        tensors = load_file(str(folder / "model.safetensors"))
    except (ValueError, SafetensorError) as err:
        raise DraftsmithError(f"Export '{folder}' cannot be read back: {err}") from err
    found = detect_format(config)
    if fmt is not None and found != fmt:
        raise DraftsmithError(f"Export '{folder}' was meant to be in '{fmt}' format but reads as '{found}'.")
    if found == "speculators":
        layer = _check_speculators_config(config, problems)
        ids = config.get("eagle_aux_hidden_state_layer_ids")
    else:
        layer = _check_sglang_config(config, problems)
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    _check_layer_config(found, layer, problems)
    _check_layer_ids(found, ids, expected, problems)
    _check_tensors(found, config, layer, tensors, expected, problems)
    if problems:
        raise_problems(folder, problems)
    return found


def raise_problems(folder: Path, problems: list[str]) -> None:
    listing = "\n".join(f"  - {p}" for p in problems)
    raise DraftsmithError(
        f"Export '{folder}' failed validation; serving engines would load it and silently draft badly:\n{listing}"
    )


def check_files(folder: Path, problems: Problems) -> None:
    for name in sorted(WEIGHT_FILES):
        problems.need((folder / name).is_file(), f"{name} is missing")
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name in WEIGHT_FILES | CARD_FILES or (path.suffix == ".png" and path.is_file()):
            continue
        if path.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".safetensors"):
            problems.append(f"{path.name}: weights must be a single model.safetensors (safetensors only)")
        else:
            problems.append(f"{path.name}: unexpected file in the export")


def _check_unknown(keys, allowed: set[str], where: str, problems: Problems) -> None:
    unknown = sorted(set(keys) - allowed)
    problems.need(not unknown, f"unknown keys in {where} (engines drop them silently): {unknown}")


def _check_speculators_config(config: dict, problems: Problems) -> dict:
    model_type = config.get("speculators_model_type")
    parallel = model_type == "peagle"
    _check_unknown(config, SPECULATORS_KEYS | SPECULATORS_OPTIONAL_KEYS | (PEAGLE_KEYS if parallel else set()),
                   "config.json", problems)
    if parallel:
        vocab = ((config.get("transformer_layer_config") or {}).get("vocab_size")) or 0
        token = config.get("mask_token_id")
        problems.need(isinstance(token, int) and 0 <= token < vocab,
                      f"mask_token_id must be a token id of the target's vocabulary, got {token!r}")
    for key in sorted(SPECULATORS_KEYS):
        problems.need(key in config, f"config.json has no '{key}'")
    problems.need(isinstance(config.get("norm_before_residual"), bool),
                  "norm_before_residual must be written explicitly as true/false (vLLM defaults it to true)")
    problems.need(bool(config.get("architectures")), "architectures is empty")
    spec = config.get("speculators_config") or {}
    problems.need(spec.get("algorithm") == model_type,
                  f"speculators_config.algorithm must be '{model_type}' (the speculators_model_type)")
    methods = spec.get("proposal_methods") or []
    if problems.need(bool(methods), "speculators_config.proposal_methods is empty"):
        first = methods[0]
        tokens = first.get("speculative_tokens")
        problems.need(isinstance(tokens, int) and tokens >= 1,
                      f"proposal_methods[0].speculative_tokens must be a positive integer, got {tokens!r}")
        problems.need(spec.get("default_proposal_method") in [m.get("proposal_type") for m in methods],
                      "speculators_config.default_proposal_method names no proposal method")
    verifier = spec.get("verifier") or {}
    problems.need(bool(verifier.get("name_or_path")), "speculators_config.verifier.name_or_path is missing")
    problems.need(isinstance(verifier.get("architectures"), list),
                  "speculators_config.verifier.architectures must be a list")
    layer = config.get("transformer_layer_config")
    problems.need(isinstance(layer, dict), "transformer_layer_config must be a LlamaConfig dict")
    return layer if isinstance(layer, dict) else {}


def _check_sglang_config(config: dict, problems: Problems) -> dict:
    problems.need(config.get("architectures") == ["LlamaForCausalLMEagle3"],
                  "architectures must be exactly ['LlamaForCausalLMEagle3']")
    problems.need("draft_vocab_size" in config,
                  "config.json has no 'draft_vocab_size' (SGLang would then reuse the target's lm_head)")
    problems.need("target_hidden_size" in config, "config.json has no 'target_hidden_size'")
    eagle = config.get("eagle_config")
    if problems.need(isinstance(eagle, dict), "config.json has no 'eagle_config'"):
        _check_unknown(eagle, {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"}, "eagle_config", problems)
        problems.need(eagle.get("use_aux_hidden_state") is True, "eagle_config.use_aux_hidden_state must be true")
    return {k: v for k, v in config.items() if k not in SGLANG_EXTRA_KEYS}


def _llama_keys() -> set[str]:
    from transformers import LlamaConfig

    return set(LlamaConfig().to_dict()) | {"rope_theta", "rope_scaling", "torch_dtype", "_name_or_path"}


def _check_layer_config(fmt: str, layer: dict, problems: Problems) -> None:
    _check_unknown(layer, _llama_keys(), "the LlamaConfig", problems)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "rms_norm_eps", "hidden_act", "max_position_embeddings", "rope_theta"):
        problems.need(layer.get(key) is not None, f"the LlamaConfig has no '{key}'")
    problems.need(layer.get("model_type") == "llama", "the LlamaConfig's model_type must be 'llama'")
    layers = layer.get("num_hidden_layers")
    if fmt == "sglang":  # SGLang's LlamaForCausalLMEagle3 builds one `midlayer` whatever the config says
        problems.need(layers == 1, "num_hidden_layers must be 1 (SGLang's EAGLE-3 model has one layer)")
    else:
        problems.need(isinstance(layers, int) and layers >= 1, f"num_hidden_layers must be a positive integer, got {layers!r}")
    for bias in ("attention_bias", "mlp_bias"):  # the drafter has no biases; engines would allocate random ones
        problems.need(not layer.get(bias), f"{bias} must be false")
    problems.need(layer.get("tie_word_embeddings") is False,
                  "tie_word_embeddings must be false (SGLang would replace lm_head by the embedding)")
    rope = layer.get("rope_parameters") or {}
    problems.need(not rope or rope.get("rope_theta") == layer.get("rope_theta"),
                  "rope_theta disagrees with rope_parameters.rope_theta")


def _check_layer_ids(fmt: str, ids, expected: Expected, problems: Problems) -> None:
    if not problems.need(isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) for i in ids),
                         f"aux hidden-state layer ids must be a list of three integers, got {ids!r} (without "
                         "them engines silently fall back to other layers)"):
        return
    problems.need(ids == sorted(set(ids)) and len(set(ids)) == 3,
                  f"aux layer ids {ids} must be distinct and increasing (engines concatenate them in layer order)")
    if expected.num_target_layers is not None:
        valid = format_layer_id_range(fmt, expected.num_target_layers)
        problems.need(all(i in valid for i in ids),
                      f"aux layer ids {ids} are out of range for a {expected.num_target_layers}-layer target "
                      f"({fmt} ids run {valid.start}..{valid.stop - 1})")
    else:
        problems.need(min(ids) >= LAYER_ID_SHIFT[fmt], f"aux layer id {min(ids)} is below what {fmt} can capture")
    if fmt == "sglang":
        problems.need(ids[0] == SGLANG_FIRST_LAYER, f"SGLang aux layer ids must start at {SGLANG_FIRST_LAYER} "
                      f"(got {ids}): other first ids are read differently by old and new SGLang versions")
    if expected.target_layers is not None:
        want = to_format_layer_ids(fmt, expected.target_layers)
        problems.need(ids == want, f"aux layer ids {ids} do not match the checkpoint's layers "
                                   f"{expected.target_layers} in {fmt}'s convention ({want})")


def _expected_shapes(fmt: str, config: dict, layer: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor the format holds, with the shape the engine's loader will allocate for it."""
    def size(source: dict, key: str, default: int = 0) -> int:
        return int(source.get(key) or default)

    hidden, inter = size(layer, "hidden_size"), size(layer, "intermediate_size")
    heads, kv_heads = size(layer, "num_attention_heads", 1), size(layer, "num_key_value_heads", 1)
    head_dim = size(layer, "head_dim", hidden // heads)
    target_hidden = size(config, "target_hidden_size", hidden)
    vocab, draft_vocab = size(layer, "vocab_size"), size(config, "draft_vocab_size")
    p = "layers.0." if fmt == "speculators" else "midlayer."
    later = {}  # speculators: plain Llama decoder layers after the first, over the hidden alone
    for i in range(1, size(layer, "num_hidden_layers", 1) if fmt == "speculators" else 1):
        later.update({f"layers.{i}.input_layernorm.weight": (hidden,),
                      f"layers.{i}.self_attn.q_proj.weight": (heads * head_dim, hidden),
                      f"layers.{i}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                      f"layers.{i}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                      f"layers.{i}.self_attn.o_proj.weight": (hidden, heads * head_dim),
                      f"layers.{i}.post_attention_layernorm.weight": (hidden,),
                      f"layers.{i}.mlp.gate_proj.weight": (inter, hidden),
                      f"layers.{i}.mlp.up_proj.weight": (inter, hidden),
                      f"layers.{i}.mlp.down_proj.weight": (hidden, inter)})
    return {
        **later,
        "fc.weight": (hidden, 3 * target_hidden),
        f"{p}input_layernorm.weight": (hidden,),
        f"{p}hidden_norm.weight": (hidden,),
        f"{p}self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        f"{p}self_attn.k_proj.weight": (kv_heads * head_dim, 2 * hidden),
        f"{p}self_attn.v_proj.weight": (kv_heads * head_dim, 2 * hidden),
        f"{p}self_attn.o_proj.weight": (hidden, heads * head_dim),
        f"{p}post_attention_layernorm.weight": (hidden,),
        f"{p}mlp.gate_proj.weight": (inter, hidden),
        f"{p}mlp.up_proj.weight": (inter, hidden),
        f"{p}mlp.down_proj.weight": (hidden, inter),
        "norm.weight": (hidden,),
        "lm_head.weight": (draft_vocab, hidden),
        "d2t": (draft_vocab,),
        "t2d": (vocab,),
        **({f"fc_norm.{i}.weight": (target_hidden,) for i in range(3)} if config.get("fc_norm") else {}),
        **({"mask_hidden": (1, 1, 3 * target_hidden)} if config.get("speculators_model_type") == "peagle" else {}),
    }


def _check_tensors(fmt: str, config: dict, layer: dict, tensors: dict, expected: Expected,
                   problems: Problems) -> None:
    shapes = _expected_shapes(fmt, config, layer)
    # embed_tokens: without it both engines share the target's embedding, as our drafter does; a speculators folder
    # may hold the target's own copy (`--include-embedding`, to fine-tune it with the library alone).
    optional = {"embed_tokens.weight": (int(layer.get("vocab_size") or 0), int(layer.get("hidden_size") or 0))} \
        if fmt == "speculators" else {}
    _check_unknown(tensors, set(shapes) | set(optional), "model.safetensors", problems)
    for name in shapes:
        problems.need(name in tensors, f"model.safetensors has no '{name}'")
    for name, tensor in tensors.items():
        want = shapes.get(name) or optional.get(name)
        if want is None:
            continue
        problems.need(tuple(tensor.shape) == want, f"{name} has shape {list(tensor.shape)}, expected {list(want)}")
        if tensor.is_floating_point():
            problems.need(bool(torch.isfinite(tensor).all()), f"{name} holds NaN or inf")
    if expected.target_hidden_size is not None:
        problems.need(config.get("target_hidden_size") == expected.target_hidden_size,
                      f"target_hidden_size is {config.get('target_hidden_size')}, the target has "
                      f"{expected.target_hidden_size}")
        fc = tensors.get("fc.weight")
        if fc is not None:
            problems.need(fc.shape[-1] == 3 * expected.target_hidden_size,
                          f"fc input width {fc.shape[-1]} != 3 x target hidden ({3 * expected.target_hidden_size})")
    if expected.target_vocab_size is not None:
        problems.need(layer.get("vocab_size") == expected.target_vocab_size,
                      f"vocab_size is {layer.get('vocab_size')}, the target's vocabulary has "
                      f"{expected.target_vocab_size} tokens")
    lm_head = tensors.get("lm_head.weight")
    if lm_head is not None:
        problems.need(lm_head.shape[0] == config.get("draft_vocab_size"),
                      f"lm_head has {lm_head.shape[0]} rows but draft_vocab_size is {config.get('draft_vocab_size')}")
    if "d2t" in tensors and "t2d" in tensors:
        check_vocab_map(tensors["d2t"], tensors["t2d"], problems)


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, problems: list[str]) -> None:
    """d2t must hold offsets (target id = draft id + d2t[draft id]) that land exactly on t2d's tokens."""
    problems = problems if isinstance(problems, Problems) else Problems(problems)
    if not problems.need(d2t.dtype == torch.int64 and d2t.dim() == 1, f"d2t must be int64 [N], got {d2t.dtype}"):
        return
    if not problems.need(t2d.dtype == torch.bool and t2d.dim() == 1, f"t2d must be bool [V], got {t2d.dtype}"):
        return
    draft_vocab, vocab = d2t.numel(), t2d.numel()
    problems.need(int(t2d.sum()) == draft_vocab,
                  f"t2d marks {int(t2d.sum())} target tokens but the draft vocabulary has {draft_vocab}")
    used = torch.nonzero(t2d).flatten()
    target_ids = torch.arange(draft_vocab) + d2t
    consistent = (
        bool(((target_ids >= 0) & (target_ids < vocab)).all())
        and target_ids.unique().numel() == draft_vocab
        and bool(t2d[target_ids.clamp(0, vocab - 1)].all())
    )
    if consistent:
        return
    if draft_vocab > 1 and torch.equal(d2t, torch.arange(draft_vocab)):
        problems.append("d2t is filled with arange(N), not with offsets target_id - draft_id")
    elif used.numel() == draft_vocab and torch.equal(d2t.sort().values, used):
        problems.append("d2t holds raw target ids; it must hold offsets (target_id - draft_id)")
    else:
        problems.append("d2t offsets do not map the draft vocabulary onto the tokens t2d marks")
