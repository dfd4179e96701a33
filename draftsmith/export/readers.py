"""Reading drafter folders back, in every layout `draftsmith export` writes (DESIGN §4, in reverse).

Layouts, told apart by config.json alone (`detect`):
- `draftsmith`: our own folder (`draftsmith_kind`), any kind;
- `speculators-eagle3`, `speculators-peagle`, `speculators-dflash`, `speculators-dspark`, `speculators-mtp`: the
  speculators library's layouts, which vLLM loads (`speculators_model_type`);
- `sglang-eagle3`: SGLang's native EAGLE-3 (`architectures: [LlamaForCausalLMEagle3]`);
- `dflash-reference`: the DFlash reference's `DFlashDraftModel`;
- `vllm-medusa`: vLLM's Medusa (`model_type: medusa`; a Medusa-2 export adds its tuned target in `target/`);
- `hf`: any transformers causal LM, an independent draft model.
Public checkpoints of these engines come in the same layouts and load too, as far as they compute what the draftsmith
drafter of that kind computes; anything else is refused with what was found and what is readable.

Reading happens in two steps, so that a wrong target is refused before any weight is read: `expectations` takes what
a folder needs of its target from config.json and the safetensors headers, and `check_fit` compares it with the
target; then `contents` converts the folder, in memory, into what a draftsmith folder of its kind holds (config.json
and tensors in our names, `FolderContents`), through the reader beside each format's writer (`eagle3_read.from_format`,
`dflash.from_speculators`, ...), so each format's conventions stay written down once. Parts engines take from the
target, of which a folder may store a copy (an EAGLE-3 embedding, the MTP layer's final norm, a full-vocabulary
DFlash lm_head), are compared with the target's and dropped: draftsmith drafters read them from the target.

Weights are read from safetensors only: a folder that has nothing but pickle checkpoints (pytorch_model.bin, *.pt)
is refused, since unpickling a file runs whatever code it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.drafters import FolderContents, kind_module
from draftsmith.errors import DraftsmithError
from draftsmith.export.check import from_format_layer_ids
from draftsmith.files import read_json

READABLE = ("draftsmith folders (config.json with draftsmith_kind), speculators eagle3 / peagle / dflash / dspark / mtp "
            "(speculators_model_type), SGLang EAGLE-3 (architectures LlamaForCausalLMEagle3), the DFlash reference "
            "(DFlashDraftModel), vLLM Medusa (model_type medusa) and Hugging Face causal LMs (draft models)")
LAYOUT_KINDS = {"speculators-eagle3": "eagle", "speculators-peagle": "eagle", "sglang-eagle3": "eagle",
                "speculators-dflash": "dflash",
                "speculators-dspark": "dflash", "dflash-reference": "dflash", "speculators-mtp": "mtp",
                "vllm-medusa": "medusa", "hf": "draft_lm"}
"""layout -> the draftsmith kind it reads as (`draftsmith` folders name their own)"""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TARGET_COPIES = ("embed_tokens.weight", "mtp_layers.0.final_layernorm.weight")
"""tensors that are the target's own, not the drafter's, wherever a layout stores them"""


# --------------------------------------------------------------------------- which layout
def read_config(folder: Path) -> dict:
    """config.json of a drafter folder, with clear errors for a missing or broken one."""
    return read_json(folder / "config.json", f"Drafter folder '{folder}' has no config.json. Readable layouts: {READABLE}.")


def detect(config: dict, folder: Path | str = "this folder") -> str:
    """The layout a drafter's config.json is in; an error naming what was found and what is readable otherwise."""
    if config.get("draftsmith_kind") is not None:
        kind_module(config["draftsmith_kind"])  # an unknown kind fails here, with the known ones listed
        return "draftsmith"
    special = config.get("speculators_model_type")
    if special in ("eagle3", "peagle", "dflash", "dspark", "mtp"):
        return f"speculators-{special}"
    architectures = config.get("architectures") or []
    if special is None and "LlamaForCausalLMEagle3" in architectures:
        return "sglang-eagle3"
    if special is None and "DFlashDraftModel" in architectures:
        return "dflash-reference"
    if special is None and (config.get("model_type") == "medusa" or "MedusaModel" in architectures):
        return "vllm-medusa"
    if special is None and "medusa_num_heads" not in config and _causal_lm(config):
        return "hf"
    found = ", ".join(f"{key} {config[key]!r}" for key in
                      ("speculators_model_type", "model_type", "architectures", "medusa_num_heads") if key in config)
    raise DraftsmithError(f"'{folder}' is not a drafter layout draftsmith reads: its config.json has "
                          f"{found or 'none of draftsmith_kind, speculators_model_type, model_type, architectures'}. "
                          f"Readable: {READABLE}. (An independent model on the hub: --drafter hf:ID.)")


def _causal_lm(config: dict) -> bool:
    """A plain transformers causal LM config (what a draft model is), not another model class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = config.get("architectures") or []
    return config.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        not architectures or any(name.endswith("ForCausalLM") for name in architectures))


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files; refuses one that holds its weights only as pickle files."""
    found = sorted(folder.glob("*.safetensors"))
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if not found and pickles:
        raise DraftsmithError(
            f"'{folder}' holds its weights only as pickle files ({', '.join(pickles)}). draftsmith reads safetensors "
            "only: loading a pickle runs whatever code the file holds. Convert it where you trust it (for example "
            "`safetensors.torch.save_file(torch.load(FILE, weights_only=True), 'model.safetensors')`).")
    return found


# --------------------------------------------------------------------------- what it needs of its target
@dataclass
class Expectations:
    """What a drafter folder needs of its target, from config.json and safetensors headers (None: not recorded)."""

    layout: str
    kind: str
    variant: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    num_layers: int | None = None  # the target's decoder layers
    layers: list[int] | None = None  # target layers read (output-layer ids); None: the last one
    draft_vocab_size: int | None = None  # None: the target's whole vocabulary
    model_type: str | None = None  # MTP: its block is a layer of the target's own architecture
    target_name: str | None = None
    fingerprint: dict | None = None
    parameters: int = 0


def expectations(folder: str | Path) -> Expectations:
    """What the drafter in `folder` needs of its target, without reading a weight (pickle-only folders refused)."""
    folder = Path(folder).expanduser()
    config = read_config(folder)
    layout = detect(config, folder)
    files = weight_files(folder)
    facts = _facts(layout, config)
    kind = config.get("draftsmith_kind") or LAYOUT_KINDS[layout]
    vocab = facts.get("vocab_size")
    if facts.get("draft_vocab_size") is not None and vocab is not None and facts["draft_vocab_size"] >= vocab:
        facts["draft_vocab_size"] = None  # a "draft vocabulary" of every token is the whole vocabulary
    return Expectations(layout=layout, kind=kind, parameters=stored_parameters(files, layout), **facts)


def _facts(layout: str, config: dict) -> dict:
    """The Expectations fields one layout's config.json records."""
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    if layout == "draftsmith":
        return _draftsmith_facts(config)
    if layout in ("speculators-eagle3", "speculators-peagle", "sglang-eagle3"):
        speculators = layout != "sglang-eagle3"
        layer = _whole(config["transformer_layer_config"] if speculators else config, "llama")
        ids = config.get("eagle_aux_hidden_state_layer_ids") if speculators else \
            (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return {"variant": "peagle" if layout == "speculators-peagle" else "eagle3",
                "hidden_size": config.get("target_hidden_size") or layer["hidden_size"],
                "vocab_size": layer["vocab_size"], "draft_vocab_size": config.get("draft_vocab_size"),
                "layers": from_format_layer_ids("speculators" if speculators else "sglang", ids) if ids else [],
                "target_name": verifier.get("name_or_path")}
    if layout in ("speculators-dflash", "speculators-dspark"):
        layer = _whole(config["transformer_layer_config"], "qwen3")
        ids = config.get("aux_hidden_state_layer_ids") or []
        return {"variant": config["speculators_model_type"], "vocab_size": layer["vocab_size"],
                "hidden_size": config.get("target_hidden_size") or layer["hidden_size"],
                "layers": from_format_layer_ids("speculators", ids), "draft_vocab_size": config.get("draft_vocab_size"),
                "target_name": verifier.get("name_or_path")}
    if layout == "dflash-reference":
        return {"variant": "dflash", "hidden_size": config.get("hidden_size"), "vocab_size": config.get("vocab_size"),
                "num_layers": config.get("num_target_layers"),
                "layers": (config.get("dflash_config") or {}).get("target_layer_ids")}
    if layout == "speculators-mtp":
        target = _whole(config["transformer_layer_config"], "qwen3")
        return {"hidden_size": target["hidden_size"], "vocab_size": target["vocab_size"],
                "num_layers": target["num_hidden_layers"], "model_type": target["model_type"],
                "target_name": verifier.get("name_or_path")}
    if layout == "vllm-medusa":
        return {"variant": "medusa", "hidden_size": config["hidden_size"], "vocab_size": config["vocab_size"],
                "draft_vocab_size": config.get("draft_vocab_size") or config.get("truncated_vocab_size")}
    return {"vocab_size": config.get("vocab_size")}  # hf: an independent model, checked by its tokenizer


def _draftsmith_facts(meta: dict) -> dict:
    """The Expectations fields of our own folder (each kind records its target in its own keys)."""
    kind, options = meta["draftsmith_kind"], meta.get("config") or {}
    facts = {"target_name": meta.get("target_name"), "fingerprint": meta.get("target_fingerprint")}
    if kind == "eagle":
        layer = meta.get("transformer_layer_config") or {}
        facts.update(variant=options.get("variant"), hidden_size=layer.get("target_hidden_size"),
                     vocab_size=layer.get("vocab_size"), num_layers=layer.get("target_num_layers"),
                     layers=options.get("layers"), draft_vocab_size=layer.get("draft_vocab_size"))
    elif kind in ("medusa", "dflash"):
        facts.update(hidden_size=meta.get("hidden_size"), vocab_size=meta.get("vocab_size"),
                     num_layers=meta.get("num_target_layers"), draft_vocab_size=meta.get("draft_vocab_size"),
                     layers=meta.get("target_layer_ids"))
        facts["variant"] = options.get("variant", "dflash") if kind == "dflash" else \
            ("medusa2" if options.get("lora_rank") else "medusa1")
    elif kind == "mtp":
        target = meta.get("target_config") or {}
        facts.update(hidden_size=target.get("hidden_size"), vocab_size=target.get("vocab_size"),
                     num_layers=target.get("num_hidden_layers"), model_type=target.get("model_type"))
    elif kind == "draft_lm":
        facts.update(vocab_size=meta.get("vocab_size"), num_layers=meta.get("draftsmith_target_num_layers"))
    return facts


def _whole(layer: dict, default_type: str) -> dict:
    """A layer config as its class builds it: library-written configs hold only what differs from the defaults."""
    from transformers import AutoConfig

    layer = dict(layer)
    return AutoConfig.for_model(layer.pop("model_type", default_type), **layer).to_dict()


def stored_parameters(files: list[Path], layout: str) -> int:
    """Floating-point values stored in `files`, read from their headers (the target's own copies not counted, except
    in an hf draft model, whose embedding and head are its own)."""
    from safetensors import safe_open

    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_slice(name)
                own = layout == "hf" or name not in TARGET_COPIES and name != "rank_accuracy"
                if own and tensor.get_dtype().startswith(("F", "BF")):
                    total += math.prod(tensor.get_shape())
    return total


def check_fit(folder: str | Path, expected: Expectations, target) -> None:
    """Refuse `target` unless it is what the folder says its target is; runs before any weight is read."""
    from draftsmith.target import fingerprint_mismatch

    problems = [f"{name} {want} (the target has {have})" for name, want, have in (
        ("hidden size", expected.hidden_size, target.hidden_size),
        ("vocabulary", None if expected.kind == "draft_lm" else expected.vocab_size, target.vocab_size),
        ("decoder layers", expected.num_layers, target.num_layers),
        ("architecture", expected.model_type, getattr(target.config, "model_type", None)))
        if want is not None and want != have]
    if expected.layers and not all(0 <= i < target.num_layers for i in expected.layers):
        problems.append(f"features of layers {expected.layers} (the target has layers 0..{target.num_layers - 1})")
    why = expected.fingerprint and fingerprint_mismatch(expected.fingerprint, target.fingerprint(), model=False)
    if why:
        problems.append(f"another tokenizer ({why})")
    if problems:
        raise DraftsmithError(f"'{folder}' ({expected.layout} {expected.kind} drafter) does not fit target "
                              f"'{target.name}': it expects {'; '.join(problems)}. Nothing was loaded.")


# --------------------------------------------------------------------------- converting it, in memory
def contents(folder: str | Path, target) -> tuple[Expectations, FolderContents]:
    """The drafter in `folder`, checked against `target`, as a draftsmith folder of its kind holds it, in memory
    (not for draft LMs, which are transformers folders in every layout)."""
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    expected = expectations(folder)
    check_fit(folder, expected, target)
    if expected.kind == "draft_lm":
        raise DraftsmithError(f"'{folder}' is a draft model (a transformers folder); it loads as one, not as parts.")
    config, tensors = read_config(folder), {}
    for path in weight_files(folder):
        tensors.update(load_file(str(path)))
    if expected.layout == "draftsmith":
        return expected, FolderContents(config, tensors, str(folder))
    meta, tensors = CONVERTERS[expected.layout](config, tensors, target)
    return expected, FolderContents(meta, tensors, str(folder))


def _eagle3(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    from draftsmith.export import eagle3_read
    from draftsmith.export.check import Problems, check_vocab_map

    _, meta, tensors = eagle3_read.from_format(config, tensors)
    meta["transformer_layer_config"]["target_num_layers"] = target.num_layers
    try:
        _drop_copy(tensors, "embed_tokens.weight", target.model.get_input_embeddings().weight, "input embedding")
    except DraftsmithError:
        if meta["config"]["variant"] != "peagle":
            raise
        raise DraftsmithError("This P-EAGLE folder stores an input embedding of its own (the speculators trainer "
                              "trains P-EAGLE's embedding); draftsmith's P-EAGLE drafter reads the target's frozen "
                              "embedding, so it cannot compute what this folder computes.") from None
    rows, vocab = meta["transformer_layer_config"]["draft_vocab_size"], target.vocab_size
    if "d2t" not in tensors and rows == vocab:  # a head over the whole vocabulary maps rows to themselves
        tensors.update(d2t=torch.zeros(rows, dtype=torch.long), t2d=torch.ones(vocab, dtype=torch.bool))
    if "d2t" not in tensors or "t2d" not in tensors:
        raise DraftsmithError(f"This EAGLE-3 folder drafts over {rows} of {vocab} tokens but holds no d2t/t2d map of "
                              "its rows to target tokens.")
    problems = Problems()
    check_vocab_map(tensors["d2t"], tensors["t2d"], problems)
    if problems:
        raise DraftsmithError(f"The draft vocabulary map of this EAGLE-3 folder is wrong: {'; '.join(problems)}.")
    return meta, tensors


def _dflash_speculators(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    from draftsmith.export import dflash

    meta, tensors = dflash.from_speculators(config, tensors, target.num_layers)
    _drop_copy(tensors, "embed_tokens.weight", target.model.get_input_embeddings().weight, "input embedding")
    if not meta.get("draft_vocab_size"):  # the drafter reads the target's head: a stored one must be that head
        _drop_copy(tensors, "lm_head.weight", target.model.get_output_embeddings().weight, "lm_head")
    return meta, tensors


def _dflash_reference(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    from draftsmith.export import dflash

    return dflash.from_reference(config, target.num_layers), tensors


def _mtp(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    from draftsmith.export import mtp

    meta, tensors, final_norm = mtp.from_format(config, tensors)
    _check_copy(final_norm, target.final_norm.weight, f"{mtp.PREFIX}final_layernorm.weight",
                "final norm (draftsmith's MTP applies the target's)")
    return meta, tensors


def _medusa(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    from draftsmith.export import medusa

    return medusa.from_format(config, tensors, target.num_layers)


CONVERTERS = {"speculators-eagle3": _eagle3, "speculators-peagle": _eagle3, "sglang-eagle3": _eagle3, "speculators-dflash": _dflash_speculators,
              "speculators-dspark": _dflash_speculators, "dflash-reference": _dflash_reference,
              "speculators-mtp": _mtp, "vllm-medusa": _medusa}
"""layout -> (config.json, tensors, target) -> (a draftsmith folder's config.json, tensors in our names)"""


def _drop_copy(tensors: dict, name: str, theirs: torch.Tensor, what: str) -> None:
    """Remove the folder's copy of a target part after checking that it is the target's (to the precision of the
    lower of the two dtypes: exports store float32, targets may run in bf16)."""
    mine = tensors.pop(name, None)
    if mine is not None:
        _check_copy(mine, theirs, name, what)


def _check_copy(mine: torch.Tensor, theirs: torch.Tensor, name: str, what: str) -> None:
    theirs = theirs.detach().cpu()
    dtype = mine.dtype if torch.finfo(mine.dtype).bits < torch.finfo(theirs.dtype).bits else theirs.dtype
    same = mine.shape == theirs.shape and torch.allclose(mine.to(dtype).float(), theirs.to(dtype).float(),
                                                         rtol=torch.finfo(dtype).eps * 4, atol=0.0)
    if not same:
        raise DraftsmithError(f"The folder's {name} {list(mine.shape)} is not this target's {what} "
                              f"{list(theirs.shape)}: it was made for another target.")


# --------------------------------------------------------------------------- the decode-time drafter
def load_proposer(folder: str | Path, target):
    """Any drafter folder -> a Proposer for `target` (what `draftsmith eval --drafter DIR` drafts with)."""
    folder = Path(folder).expanduser()
    expected = expectations(folder)
    if expected.kind == "draft_lm":
        check_fit(folder, expected, target)
        from draftsmith.drafters import draft_lm

        return draft_lm.load_proposer(folder, target)
    if expected.layout == "draftsmith":  # a kind's own folder: its loader reads it (and checks the target)
        check_fit(folder, expected, target)
        return kind_module(expected.kind).load_proposer(folder, target)
    _, parts = contents(folder, target)
    try:
        proposer = kind_module(expected.kind).load_proposer(parts, target)
    except RuntimeError as err:  # load_state_dict: names or shapes that our drafter does not have
        raise DraftsmithError(f"'{folder}' ({expected.layout}) does not hold what a draftsmith {expected.kind} "
                              f"drafter has: {' '.join(str(err).split())[:400]}") from None
    tuned = folder / "target"
    if expected.layout == "vllm-medusa" and (tuned / "config.json").is_file():
        proposer = _medusa2(proposer, tuned, target)
    return proposer


def _medusa2(proposer, tuned: Path, target):
    """A Medusa-2 export: its heads draft for, and are verified by, the tuned target it ships in `target/`."""
    from draftsmith.drafters.draft_lm import check_same_tokenizer
    from draftsmith.drafters.medusa import MedusaProposer
    from draftsmith.target import load_target

    verifier = load_target(str(tuned), dtype=target.dtype, device=str(target.device))
    check_same_tokenizer(verifier.tokenizer, target.tokenizer, str(tuned), target.name)
    tuned_proposer = MedusaProposer(proposer.drafter.attach(verifier))
    tuned_proposer.verifier = verifier
    return tuned_proposer


def draft_token_ids(folder: str | Path, expected: Expectations) -> torch.Tensor | None:
    """Target ids of the draft vocabulary (None: the whole vocabulary), read from the map tensors alone (`d2t`, or a
    Medusa head's `token_map`), not the weights."""
    from safetensors import safe_open

    if expected.draft_vocab_size is None:
        return None
    for path in weight_files(Path(folder).expanduser()):
        with safe_open(str(path), framework="pt") as handle:
            names = set(handle.keys())
            if "d2t" in names:
                d2t = handle.get_tensor("d2t").long()
                return torch.arange(d2t.numel()) + d2t
            if "token_map" in names:
                return handle.get_tensor("token_map").long()
    return None
