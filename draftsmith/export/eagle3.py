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
those loads fine and silently collapses acceptance to ~1. So every export goes through
`draftsmith.export.skeleton`: written into a staging folder, re-read from disk and validated field by field
(`check.validate_export`), read back as a drafter (`eagle3_read`) and compared with the checkpoint tensor for
tensor, given its card (`eagle3_card`), and only then renamed into place.

This file maps: the checkpoint (`read_checkpoint`), each layout's config and tensors (`WRITERS`), and what the
skeleton needs (`layout`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export import card
from draftsmith.export.check import FORMATS as FORMATS  # the formats this writer writes (export/__init__.py)
from draftsmith.export.check import SGLANG_FIRST_LAYER, Expected, to_format_layer_ids, validate_export
from draftsmith.export.eagle3_card import CardFacts, render_card
from draftsmith.export.eagle3_read import EAGLE31_OPTIONS, to_checkpoint
from draftsmith.export.skeleton import Layout, RoundTrip

# The family's other public names, re-exported where callers have long found them.
from draftsmith.export.check import from_format_layer_ids as from_format_layer_ids
from draftsmith.export.eagle3_read import is_export as is_export


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
"""format -> (config.json from the checkpoint and the draft length, the tensors in the format's names)"""


# --------------------------------------------------------------------------- what the skeleton writes and checks
def layout(checkpoint: str | Path, fmt: str, options) -> Layout:
    """`fmt` of the EAGLE-3 checkpoint: config and tensors, the validator with what the checkpoint says, the round
    trip and the card. `options`: see `draftsmith export --help`."""
    ckpt = read_checkpoint(checkpoint, target_name=options.verifier)
    drafter = {"layers": ckpt.target_layers, "draft_vocab_size": ckpt.draft_vocab_size}
    shared = card.shared_facts(ckpt.folder, options, "eagle", f"reads layers {ckpt.target_layers} with a "
                               f"{ckpt.draft_vocab_size}-token draft vocabulary", ckpt.target_name, drafter=drafter)
    speculative_tokens = options.speculative_tokens or _measured_draft_length(shared["results"]) or 3
    if ckpt.parallel and not options.speculative_tokens:  # a default never asks for positions it was not trained on
        speculative_tokens = min(speculative_tokens, int(ckpt.options["ttt_steps"]))
    extra = {"embed_tokens.weight": target_embedding(ckpt, fmt)} if options.include_embedding else {}
    make_config, make_tensors = WRITERS[fmt]
    expected = Expected(ckpt.target_layers, ckpt.num_target_layers, ckpt.target_hidden_size, ckpt.target_vocab_size)
    facts = CardFacts(
        **shared, fmt=fmt, verifier_is_hub_id=card.is_hub_id(shared["verifier"]), target_layers=ckpt.target_layers,
        format_layer_ids=to_format_layer_ids(fmt, ckpt.target_layers), draft_vocab_size=ckpt.draft_vocab_size,
        target_vocab_size=ckpt.target_vocab_size, hidden_size=int(ckpt.layer["hidden_size"]),
        parameters=sum(t.numel() for n, t in drafter_tensors(ckpt).items() if n not in ("d2t", "t2d")),
        speculative_tokens=speculative_tokens, parallel=ckpt.parallel, layers=ckpt.num_layers,
        embedding_included=bool(extra))
    return Layout(validate=lambda folder: validate_export(folder, fmt, expected), round_trip=round_trip(ckpt, extra),
                  facts=facts, render=render_card, config=make_config(ckpt, speculative_tokens),
                  tensors={**make_tensors(ckpt), **extra})


def round_trip(ckpt: Eagle3Checkpoint, extra: dict[str, torch.Tensor]) -> RoundTrip:
    """Read back from engine-visible fields only, the export must be the checkpoint: its tensors (and the `extra` ones
    written, such as the target's embedding), its options and the draft layer's hyperparameters."""
    options = {"norm_before_residual": False, **dict.fromkeys(EAGLE31_OPTIONS, False), **ckpt.options}
    keys = ["variant", "layers", "norm_before_residual", *EAGLE31_OPTIONS]
    keys += ["mask_token_id"] if ckpt.parallel else []
    fields = {f"config.{key}": options.get(key) for key in keys}
    fields.update({f"transformer_layer_config.{key}": value for key, value in ckpt.layer.items() if key in LAYER_KEYS})
    return RoundTrip(lambda folder: to_checkpoint(folder)[1:], {**drafter_tensors(ckpt), **extra}, fields)


def target_embedding(ckpt: Eagle3Checkpoint, fmt: str) -> torch.Tensor:
    """The input embedding of the drafter's target (drafter folders never store it), for --include-embedding."""
    from draftsmith.export import drafters_target

    if fmt != "speculators":
        raise DraftsmithError("--include-embedding is for --format speculators (SGLang always shares the target's "
                              "embedding).")
    target = drafters_target(ckpt.target_name, ckpt.meta.get("target_fingerprint"), "--include-embedding")
    return target.model.get_input_embeddings().weight.detach().float().cpu().contiguous()


def _measured_draft_length(results: dict | None) -> int | None:
    """Draft length of the reported eval run (a tree's depth), the default for serving commands."""
    config = (results or {}).get("config") or {}
    if config.get("tree"):
        return int(str(config["tree"]).split(",")[0])
    return config.get("draft_length")
