"""Reading a target's model and tokenizer (for `draftsmith.target.load_target`): from a Hugging Face folder, from
the hub (its local cache first), or from a GGUF file, dequantized once into a cache folder keyed by the file's hash.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.files import cache_dir, file_sha256

# Bumped whenever the layout of the dequantized folder changes, so that caches written by older
# versions (layout 1: tied embeddings stored only as lm_head.weight) are never loaded again.
GGUF_CACHE_LAYOUT = 2


def gguf_cache_folder(path: Path) -> Path:
    """The folder a GGUF file is dequantized into: keyed by the file's hash and the layout version."""
    return cache_dir() / "gguf" / f"{file_sha256(path)[:24]}-layout{GGUF_CACHE_LAYOUT}"


def load_gguf(path: Path, dtype: torch.dtype):
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
    return load_folder(cached, dtype, trust_remote_code=False)


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


def load_folder(path: Path, dtype: torch.dtype, trust_remote_code: bool):
    """(model, tokenizer) of a Hugging Face model folder; the tokenizer is None when the folder has none."""
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


def load_hub(repo_id: str, dtype: torch.dtype, trust_remote_code: bool):
    """(model, tokenizer) of a hub id: from the local Hugging Face cache, else downloaded (unless offline)."""
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
