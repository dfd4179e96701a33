"""EAGLE-3 exports: a trained EAGLE-3 (or P-EAGLE) drafter in the folder layouts serving engines load.

Formats (DESIGN §4):
- `speculators`: the vLLM / speculators layout (`speculators_model_type: "eagle3"`,
  `transformer_layer_config`, `speculators_config`; weights `fc`, `layers.0.*`, `norm`, `lm_head`,
  `d2t`, `t2d`); a P-EAGLE drafter as `speculators_model_type: "peagle"` with `mask_token_id` and the
  `mask_hidden` weight (vLLM serves it as EAGLE-3 with parallel drafting);
- `sglang`: SGLang's native EAGLE-3 layout (a LlamaConfig with `LlamaForCausalLMEagle3`,
  `eagle_config`; weights `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`; no embedding).

Engines load these folders leniently: missing aux-layer ids fall back to other layers, a missing
or wrong `d2t` maps draft tokens to the wrong target tokens, unknown keys are dropped. Each of
those loads fine and silently collapses acceptance to ~1. So every export is written into a
staging folder next to the destination, re-read from disk, validated field by field, converted
back and compared with the checkpoint tensor for tensor, and only then renamed into place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export import card
from draftsmith.export.check import FORMATS as FORMATS  # the formats this writer writes (export/__init__.py)
from draftsmith.export.check import (
    SGLANG_EXTRA_KEYS, SGLANG_FIRST_LAYER, Expected, check_files, Problems, raise_problems, detect_format,
    from_format_layer_ids, to_format_layer_ids, validate_export,
)


HUB_IDS = card.HUB_IDS


# --------------------------------------------------------------------------- the checkpoint
# Keys `draftsmith.drafters.eagle` adds to the draft layer's LlamaConfig; engines take the first two
# from the top level of their configs and have no use for the third.
DRAFTSMITH_LAYER_KEYS = ("draft_vocab_size", "target_hidden_size", "target_num_layers")
# Draft-layer hyperparameters that change what the drafter computes: they must survive an export.
LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters", "attention_bias",
              "mlp_bias", "vocab_size", "draft_vocab_size", "target_hidden_size")
# Generic PretrainedConfig fields that say nothing about a decoder layer.
NOISE_KEYS = ("_name_or_path", "id2label", "label2id", "output_hidden_states", "output_attentions",
              "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "problem_type")


@dataclass
class Eagle3Checkpoint:
    """A trained EAGLE-3 drafter folder as `draftsmith.drafters.eagle.Drafter.save_pretrained` writes it.

    config.json = {"draftsmith_kind": "eagle", "config": <eagle Config>, "transformer_layer_config":
    <draft layer LlamaConfig + draft_vocab_size, target_hidden_size, target_num_layers>}.
    """

    folder: Path
    meta: dict
    tensors: dict[str, torch.Tensor]
    target_name: str

    @property
    def options(self) -> dict:
        return self.meta["config"]

    @property
    def layer(self) -> dict:
        return self.meta["transformer_layer_config"]

    @property
    def target_layers(self) -> list[int]:
        return [int(i) for i in self.options["layers"]]

    @property
    def num_target_layers(self) -> int:
        return int(self.layer["target_num_layers"])

    @property
    def target_hidden_size(self) -> int:
        return int(self.layer["target_hidden_size"])

    @property
    def target_vocab_size(self) -> int:
        return int(self.layer["vocab_size"])

    @property
    def draft_vocab_size(self) -> int:
        return int(self.layer["draft_vocab_size"])

    @property
    def norm_before_residual(self) -> bool:
        return bool(self.options.get("norm_before_residual", False))

    @property
    def num_layers(self) -> int:
        """Decoder layers: the EAGLE-3 first layer and plain Llama layers after it."""
        return int(self.options.get("num_layers", 1))

    @property
    def parallel(self) -> bool:
        """P-EAGLE: every draft position from one forward (the speculators `peagle` layout)."""
        return self.options.get("variant") == "peagle"

    @property
    def eagle31(self) -> dict[str, bool]:
        """EAGLE 3.1's two flags (fc_norm, norm_output), as the checkpoint trained them."""
        return {key: bool(self.options.get(key, False)) for key in EAGLE31_OPTIONS}

    def layer_config(self) -> dict:
        """The draft decoder layer as a full LlamaConfig dict (what both engines build their layer from)."""
        from transformers import LlamaConfig

        fields = {k: v for k, v in self.layer.items() if k not in DRAFTSMITH_LAYER_KEYS}
        fields.update(num_hidden_layers=self.num_layers, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
        config = LlamaConfig(**fields).to_dict()
        for key in (*NOISE_KEYS, *DRAFTSMITH_LAYER_KEYS):
            config.pop(key, None)
        # Engines on transformers 4.x read `rope_theta` / `rope_scaling`, v5 reads `rope_parameters`;
        # write both so neither silently falls back to a default theta.
        rope = config.get("rope_parameters") or {}
        config["rope_theta"] = rope.get("rope_theta")
        config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else dict(rope)
        return config

    def verifier(self) -> str:
        """The hub id engines should load as the target."""
        return card.verifier_name(self.target_name)

    def verifier_architectures(self) -> list[str]:
        """The target's architectures when the checkpoint records them (engines use them only as hints)."""
        return list(self.meta.get("target_architectures") or [])


def read_checkpoint(folder: str | Path, target_name: str | None = None) -> Eagle3Checkpoint:
    """Read a saved draftsmith EAGLE-3 drafter folder (config.json + model.safetensors)."""
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise DraftsmithError(
            f"'{folder}' is not a draftsmith drafter checkpoint: it needs config.json and model.safetensors "
            "(a `best/` or `checkpoint-<step>/drafter/` folder written by `draftsmith train`)."
        )
    meta = json.loads(config_path.read_text())
    kind, options = meta.get("draftsmith_kind"), meta.get("config") or {}
    if kind != "eagle" or options.get("variant") not in ("eagle3", "peagle"):
        raise DraftsmithError(
            f"Checkpoint '{folder}' is a '{kind}' drafter (variant '{options.get('variant')}'). `draftsmith export` "
            "writes speculators and SGLang folders of EAGLE-3 and P-EAGLE drafters here; other kinds have their own "
            "writers (see `draftsmith export --help`)."
        )
    layer = meta.get("transformer_layer_config") or {}
    missing = [k for k in DRAFTSMITH_LAYER_KEYS + ("vocab_size", "hidden_size") if layer.get(k) is None]
    if missing or not options.get("layers"):
        raise DraftsmithError(f"Checkpoint '{folder}' lacks {missing or ['config.layers']} in config.json; "
                              "re-save it with the current draftsmith.")
    target_name = target_name or _training_target(folder) or meta.get("target_name")
    if not target_name:
        raise DraftsmithError(
            f"Checkpoint '{folder}' does not say which target it was trained for, and engines need the target's "
            "hub id. Pass it with --verifier HUB_ID (for example HuggingFaceTB/SmolLM2-135M-Instruct)."
        )
    return Eagle3Checkpoint(folder, meta, load_file(str(weights_path)), target_name)


def _training_target(folder: Path) -> str | None:
    """The target name recorded by the training run (training.json in the run folder), if any."""
    return card.find_training_info(folder).get("target")


# --------------------------------------------------------------------------- writers
def speculators_config(ckpt: Eagle3Checkpoint, speculative_tokens: int) -> dict:
    """config.json of the speculators (vLLM) EAGLE-3 format, or its P-EAGLE form (`peagle`, `mask_token_id`)."""
    algorithm = "peagle" if ckpt.parallel else "eagle3"
    if ckpt.parallel and speculative_tokens > int(ckpt.options["ttt_steps"]):
        raise DraftsmithError(
            f"This P-EAGLE drafter was trained to draft {ckpt.options['ttt_steps']} positions in parallel; "
            f"--speculative-tokens {speculative_tokens} would ask it for positions it never learned.")
    return {
        "speculators_model_type": algorithm,
        "architectures": ["PEagleSpeculator" if ckpt.parallel else "Eagle3Speculator"],
        **({"mask_token_id": int(ckpt.options["mask_token_id"])} if ckpt.parallel else {}),
        "draft_vocab_size": ckpt.draft_vocab_size,
        "target_hidden_size": ckpt.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": to_format_layer_ids("speculators", ckpt.target_layers),
        # vLLM defaults this to True when absent; always write it.
        "norm_before_residual": ckpt.norm_before_residual,
        **{key: True for key, on in ckpt.eagle31.items() if on},  # EAGLE 3.1: the library reads both flags
        "transformer_layer_config": ckpt.layer_config(),
        "speculators_config": {
            "algorithm": algorithm,
            "default_proposal_method": "greedy",
            "proposal_methods": [{
                "proposal_type": "greedy",
                "speculative_tokens": speculative_tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }],
            "verifier": {"name_or_path": ckpt.verifier(), "architectures": ckpt.verifier_architectures()},
        },
    }


def sglang_config(ckpt: Eagle3Checkpoint, speculative_tokens: int) -> dict:
    """config.json of SGLang's native EAGLE-3 format (speculative_tokens is not part of it)."""
    if ckpt.norm_before_residual:
        # SGLang's LlamaForCausalLMEagle3 always keeps the un-normalised hidden as the residual.
        raise DraftsmithError(
            "This drafter was trained with norm_before_residual=True, which SGLang's EAGLE-3 layer "
            "does not implement (it would load and silently compute something else). Export it with "
            "--format speculators for vLLM instead."
        )
    if ckpt.parallel:
        raise DraftsmithError(
            "This is a P-EAGLE drafter (drafter.variant=peagle). SGLang's EAGLE-3 layer drafts one position per "
            "forward and would read it as a plain EAGLE-3 drafter, never using its mask inputs. Export it with "
            "--format speculators (vLLM serves it with parallel drafting).")
    if any(ckpt.eagle31.values()):
        raise DraftsmithError(
            "This drafter was trained as EAGLE 3.1 (drafter.fc_norm / norm_output), which SGLang's EAGLE-3 layer "
            "does not compute (it would load without the norms and draft something else). Export it with "
            "--format speculators.")
    if ckpt.num_layers != 1:
        raise DraftsmithError(
            f"This drafter has {ckpt.num_layers} decoder layers; SGLang's EAGLE-3 model builds one (`midlayer`) and "
            "would load only the first, drafting something else. Export it with --format speculators.")
    if ckpt.target_layers[0] != SGLANG_FIRST_LAYER:
        raise DraftsmithError(
            f"This drafter reads target layers {ckpt.target_layers}. SGLang versions before and after "
            "sgl-project/sglang#25454 read EAGLE-3 layer ids whose first entry is not 1 differently, so no "
            "SGLang config can be right for both. Export with --format speculators (vLLM), or train with "
            f"layers starting at {SGLANG_FIRST_LAYER} (the EAGLE-3 default)."
        )
    config = ckpt.layer_config()
    config.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": ckpt.draft_vocab_size,
        "target_hidden_size": ckpt.target_hidden_size,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": to_format_layer_ids("sglang", ckpt.target_layers),
            "use_aux_hidden_state": True,
        },
    })
    return config


def drafter_tensors(ckpt: Eagle3Checkpoint) -> dict[str, torch.Tensor]:
    """The drafter's own tensors. Both engines share the target's embedding when the drafter has none, so
    a frozen copy (which drafter folders written before draftsmith stopped storing it still hold) is not shipped."""
    return {name: tensor for name, tensor in ckpt.tensors.items() if name != "embed_tokens.weight"}


def speculators_tensors(ckpt: Eagle3Checkpoint) -> dict[str, torch.Tensor]:
    """Our tensor names already follow the speculators / vLLM layout."""
    return drafter_tensors(ckpt)


def sglang_tensors(ckpt: Eagle3Checkpoint) -> dict[str, torch.Tensor]:
    """`layers.0.*` -> `midlayer.*` (SGLang's name for its single EAGLE-3 layer)."""
    return {name.replace("layers.0.", "midlayer.", 1): t for name, t in drafter_tensors(ckpt).items()}


WRITERS = {"speculators": (speculators_config, speculators_tensors), "sglang": (sglang_config, sglang_tensors)}


def write_format(ckpt: Eagle3Checkpoint, fmt: str, folder: Path, speculative_tokens: int = 3,
                 extra: dict[str, torch.Tensor] | None = None) -> None:
    """Write config.json + model.safetensors of `fmt` into an existing folder (`extra`: tensors added as they are,
    such as the target's embedding)."""
    from safetensors.torch import save_file

    make_config, make_tensors = WRITERS[fmt]
    config = make_config(ckpt, speculative_tokens)
    tensors = {name: t.detach().contiguous().cpu() for name, t in {**make_tensors(ckpt), **(extra or {})}.items()}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model.safetensors").chmod(0o644)  # an export is meant to be shared


# --------------------------------------------------------------------------- reading exports back
UNSUPPORTED_OPTIONS = {"norm_before_fc": "an RMSNorm on the fused features before fc"}
"""speculators EAGLE-3 options draftsmith's drafter does not compute, with what each one adds"""
EAGLE31_OPTIONS = ("fc_norm", "norm_output")
"""speculators EAGLE-3 options of EAGLE 3.1, which draftsmith's drafter computes (drafter.fc_norm, norm_output)"""


def to_checkpoint(folder: str | Path) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """An exported folder -> (format, eagle drafter meta, tensors in our names), from engine-visible fields only."""
    from safetensors.torch import load_file

    folder = Path(folder)
    return from_format(json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors")))


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
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    try:
        detect_format(json.loads(path.read_text()))
    except (DraftsmithError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------- export
def check_round_trip(ckpt: Eagle3Checkpoint, folder: Path, embedding: torch.Tensor | None = None) -> None:
    """Convert the export back from engine-visible fields only; it must equal the checkpoint exactly (and hold
    `embedding` as embed_tokens.weight when one was included, nothing otherwise)."""
    _, meta, tensors = to_checkpoint(folder)
    problems = Problems()
    stored = tensors.pop("embed_tokens.weight", None)
    problems.need((stored is None) == (embedding is None) and (embedding is None or torch.equal(stored, embedding)),
                  "embed_tokens.weight is not the target's embedding" if embedding is not None else
                  "embed_tokens.weight was written without --include-embedding")
    for key in ("variant", "layers", "norm_before_residual", *EAGLE31_OPTIONS,
                *(("mask_token_id",) if ckpt.parallel else ())):
        problems.need(meta["config"][key] == ckpt.options.get(key, False),
                      f"config.{key} reads back as {meta['config'][key]!r}, the checkpoint has {ckpt.options.get(key)!r}")
    back = meta["transformer_layer_config"]
    for key, value in ckpt.layer.items():
        if key in LAYER_KEYS:
            problems.need(back.get(key) == value, f"{key} reads back as {back.get(key)!r}, not {value!r}")
    original = drafter_tensors(ckpt)
    problems.need(set(tensors) == set(original),
                  f"tensor names differ after the round trip: {sorted(set(tensors) ^ set(original))}")
    for name in set(tensors) & set(original):
        problems.need(torch.equal(tensors[name], original[name]), f"{name} changed in the round trip")
    if problems:
        raise_problems(folder, problems)


def write(checkpoint: str | Path, fmt: str, staging: Path, options) -> CardFacts:
    """Write `fmt` of the EAGLE-3 checkpoint into `staging`, validate it, check the round trip, add the card.
    `options`: speculative_tokens, eval_results, repo_id, verifier, license (see `draftsmith export --help`)."""
    ckpt = read_checkpoint(checkpoint, target_name=options.verifier)
    expected = Expected(ckpt.target_layers, ckpt.num_target_layers, ckpt.target_hidden_size, ckpt.target_vocab_size)
    results_path, results = card.eval_results_for(
        ckpt.folder, options.eval_results, lambda r: results_match(r, ckpt.target_layers, ckpt.draft_vocab_size),
        f"reads layers {ckpt.target_layers} with a {ckpt.draft_vocab_size}-token draft vocabulary")
    speculative_tokens = options.speculative_tokens or _measured_draft_length(results) or 3
    if ckpt.parallel and not options.speculative_tokens:  # a default never asks for positions it was not trained on
        speculative_tokens = min(speculative_tokens, int(ckpt.options["ttt_steps"]))
    facts = card_facts(ckpt, fmt, options.repo_id or str(options.out), speculative_tokens, options.license)
    facts.results, facts.results_source = results, str(results_path) if results_path else None
    embedding = target_embedding(ckpt, fmt) if options.include_embedding else None
    facts.embedding_included = embedding is not None
    write_format(ckpt, fmt, staging, speculative_tokens,
                 None if embedding is None else {"embed_tokens.weight": embedding})
    validate_export(staging, fmt, expected)
    check_round_trip(ckpt, staging, embedding)
    plots = card.acceptance_plots(results_path, results, staging)
    facts.plots = [plot.name for plot in plots]
    card.write_card(staging, render_card(facts), plots)
    problems = Problems()
    check_files(staging, problems)  # the card adds README.md and PNGs only
    if problems:
        raise_problems(staging, problems)
    return facts


def target_embedding(ckpt: Eagle3Checkpoint, fmt: str) -> torch.Tensor:
    """The input embedding of the drafter's target (drafter folders never store it), for --include-embedding."""
    from draftsmith.export import drafters_target

    if fmt != "speculators":
        raise DraftsmithError("--include-embedding is for --format speculators (SGLang always shares the target's "
                              "embedding).")
    target = drafters_target(ckpt.target_name, ckpt.meta.get("target_fingerprint"), "--include-embedding")
    return target.model.get_input_embeddings().weight.detach().float().cpu().contiguous()


def results_match(results: dict, target_layers: list[int], draft_vocab_size: int) -> bool:
    """Whether a results.json describes this drafter (same feature layers and draft vocabulary)."""
    drafter = results.get("drafter") or {}
    return drafter.get("kind") == "eagle" and drafter.get("layers") == target_layers \
        and drafter.get("draft_vocab_size") == draft_vocab_size


def _measured_draft_length(results: dict | None) -> int | None:
    """Draft length of the reported eval run (a tree's depth), the default for serving commands."""
    config = (results or {}).get("config") or {}
    if config.get("tree"):
        return int(str(config["tree"]).split(",")[0])
    return config.get("draft_length")


# --------------------------------------------------------------------------- the model card
@dataclass(kw_only=True)
class CardFacts(card.SharedFacts):
    """Everything the card states, gathered before rendering (rendering is a pure function)."""

    fmt: str
    verifier_is_hub_id: bool
    target_layers: list[int]
    format_layer_ids: list[int]
    draft_vocab_size: int
    target_vocab_size: int
    hidden_size: int
    parameters: int
    speculative_tokens: int
    embedding_included: bool = False
    parallel: bool = False
    layers: int = 1


def card_facts(ckpt: Eagle3Checkpoint, fmt: str, model_ref: str, speculative_tokens: int, license: str | None):
    """Gather what the model card states about this checkpoint."""
    name = ckpt.verifier()
    return CardFacts(
        fmt=fmt, model_ref=model_ref, verifier=name, verifier_is_hub_id=card.is_hub_id(name),
        target_layers=ckpt.target_layers, format_layer_ids=to_format_layer_ids(fmt, ckpt.target_layers),
        draft_vocab_size=ckpt.draft_vocab_size, target_vocab_size=ckpt.target_vocab_size,
        hidden_size=int(ckpt.layer["hidden_size"]),
        parameters=sum(t.numel() for n, t in drafter_tensors(ckpt).items() if n not in ("d2t", "t2d")),
        speculative_tokens=speculative_tokens, parallel=ckpt.parallel, layers=ckpt.num_layers,
        license=license or dict(HUB_IDS.values()).get(name),
        training=card.find_training_info(ckpt.folder),
    )


def _serving_section(facts: CardFacts) -> str:
    k = facts.speculative_tokens
    method = {"method": "eagle3", "parallel_drafting": True} if facts.parallel else {"method": "eagle3"}
    vllm_config = json.dumps({**method, "model": facts.model_ref, "num_speculative_tokens": k})
    vllm = f"vllm serve {facts.verifier} \\\n  --speculative-config '{vllm_config}'"
    sglang = (f"python -m sglang.launch_server --model-path {facts.verifier} \\\n"
              f"  --speculative-algorithm EAGLE3 --speculative-draft-model-path {facts.model_ref} \\\n"
              f"  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
    native, other = ("vLLM", "SGLang") if facts.fmt == "speculators" else ("SGLang", "vLLM")
    other_fmt = "sglang" if facts.fmt == "speculators" else "speculators"
    lines = ["## Serving", "", f"This folder is in the **{facts.fmt}** format, which {native} loads.", ""]
    first, second = (vllm, sglang) if facts.fmt == "speculators" else (sglang, vllm)
    if facts.parallel:  # no SGLang layout computes P-EAGLE (`--format sglang` refuses it)
        lines += ["```bash", first, "```", "", "SGLang's EAGLE-3 layer drafts one position per forward; there is no "
                  "SGLang export of a P-EAGLE drafter."]
        return "\n".join(lines) + "\n"
    lines += ["```bash", first, "```", "",
              f"For {other}, export the same checkpoint with `draftsmith export CHECKPOINT --format {other_fmt}` "
              f"and point this command at that folder:", "", "```bash",
              second.replace(facts.model_ref, "EXPORTED_DIR"), "```"]
    if not facts.verifier_is_hub_id:
        lines += ["", f"`{facts.verifier}` is not a hub id; replace it with the hub id or folder of the target model."]
    return "\n".join(lines) + "\n"


def render_card(facts: CardFacts) -> str:
    """The README.md of an EAGLE-3 export: Hub metadata, what the drafter is, training, results, serving."""
    shift = "+1, vLLM collects the stream entering a layer" if facts.fmt == "speculators" else \
        "unchanged, SGLang adds 1 itself"
    about = [
        f"# {'P-EAGLE' if facts.parallel else 'EAGLE-3'} drafter for {facts.verifier}", "",
        f"A speculative-decoding drafter trained with draftsmith for `{facts.verifier}`: "
        f"{'one decoder layer reads' if facts.layers == 1 else f'{facts.layers} decoder layers read'} the target's "
        "hidden states from three layers plus the last token and draft the next tokens, which the target verifies "
        "in one pass. Output is identical to the target's own decoding; "
        "only the speed changes.", "",
        *(["P-EAGLE (parallel drafting): the positions after the first read a mask token and a learned mask hidden "
           "instead of the tokens drafted before them, so one drafter forward drafts all "
           f"{facts.speculative_tokens} tokens.", ""] if facts.parallel else []),
        "| | |", "|---|---|",
        f"| target layers read (output of 0-based layer) | {', '.join(map(str, facts.target_layers))} |",
        f"| `eagle_aux_hidden_state_layer_ids` in config.json | {facts.format_layer_ids} ({shift}) |",
        f"| draft vocabulary | {facts.draft_vocab_size} of {facts.target_vocab_size} target tokens (`d2t`/`t2d` map) |",
        f"| hidden size | {facts.hidden_size} |",
        f"| parameters | {facts.parameters:,} |",
        f"| format | {facts.fmt} |", "",
    ]
    if facts.embedding_included:
        about += ["`embed_tokens.weight` is the target's own input embedding, stored for fine-tuning this folder with "
                  "the speculators library without the verifier at hand. vLLM loads it instead of sharing the "
                  "target's; the values are the same.", ""]
    elif facts.fmt == "speculators":
        about += ["No embedding is stored: vLLM shares the target's. To fine-tune this folder with the speculators "
                  "library without the verifier at hand, export again with `--include-embedding`.", ""]
    tags = ["speculative-decoding", "peagle" if facts.parallel else "eagle3", "draftsmith", facts.fmt, "vllm" if facts.fmt == "speculators" else "sglang"]
    return "\n".join([card.front_matter(tags, facts.verifier, facts.verifier_is_hub_id, facts.license),
                      "\n".join(about), card.training_section(facts.training),
                      card.results_section(facts.results, facts.results_source, facts.plots),
                      card.verifier_section(facts.training, facts.verifier), _serving_section(facts)])
