"""`draftsmith import-features`: hidden states that vLLM extracted -> a draftsmith offline capture.

For targets too large to run in this process. speculators' data generation sends every prepared sample to a
vLLM server launched with the `extract_hidden_states` method, which writes one safetensors file per sample;
this module turns that folder into the shards, sidecars and manifest that `draftsmith capture` writes
(data/offline.py), so `FeatureShards` and training read it like any other capture.

Source layout, as speculators 0.9.0 writes and reads it:
  SOURCE/                        `speculators prepare-data`: `datasets.save_to_disk` of rows with
                                   input_ids int64 [T], loss_mask int64 [T] (1 = trained on), seq_len
  SOURCE/hidden_states/hs_<row>.safetensors   (`speculators generate-offline-data`; file <row> = row <row>)
                                   hidden_states [T, n, H] in the serving dtype, or float8_e4m3fn plus
                                   hidden_states_scales float32 [T, 1, 1] from hs_connectors' FP8 connector;
                                   token_ids int64 [T], equal to the row's input_ids
The n layers are vLLM aux-hidden-state ids in ascending order; `draftsmith_layer` converts them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from draftsmith.data.capture import FP8, MANIFEST, feature_dtype, parse_layers, to_fp8
from draftsmith.data.offline import (
    _check_or_write_plan, _shard, _shard_ids, _sidecar, _write_sidecar, build_manifest, write_shard,
)
from draftsmith.errors import DraftsmithError
from draftsmith.files import file_sha256, write_atomically


@dataclass
class ImportConfig:
    source: str = "runs/speculators-data"
    """folder written by `speculators prepare-data` (a saved `datasets` folder of input_ids + loss_mask rows)"""
    hidden_states: str = ""
    """folder of hs_<row>.safetensors from `speculators generate-offline-data` (empty = SOURCE/hidden_states)"""
    target: str = "smollm2-135m-instruct"
    """the target vLLM served (hub id, folder, .gguf, or built-in alias); only its config and tokenizer are read
    (no weights), for the fingerprint training checks: pass the same --target to `draftsmith train`"""
    engine_layers: str = "default"
    """the eagle_aux_hidden_state_layer_ids vLLM was launched with, in vLLM's numbering (id k = the hidden state
    entering decoder layer k; k = num_layers = the last layer's output): default = what speculators'
    launch_vllm.py uses without --target-layer-ids, [2, L//2, L-3, L]; or ids like 2,16,29,32 (with the last
    layer that launch_vllm.py appends)"""
    layers: str = "all"
    """which layers to keep, in draftsmith's numbering (output of 0-based decoder layer i): all, eagle3,
    dflash:N, last, or ids like 1,14,26; refused when vLLM did not extract one of them"""
    out: str = "runs/features"
    """output folder for shards and manifest.json (a rerun of the same command resumes it)"""
    dtype: str = "bf16"
    """dtype of stored features: bf16, fp16, fp32 or fp8 (e4m3 with one float32 scale per token and layer)"""
    samples_per_shard: int = 128
    """samples per shard file (also the unit of resume)"""
    allow_missing: bool = False
    """import only the rows that have a hidden-states file (generate-offline-data skips failed requests and
    --max-samples stops early); off = refuse when one is missing"""
    trust_remote_code: bool = False
    """allow custom config code from the target's folder (off by default)"""


# --------------------------------------------------------------------------- layer ids
def draftsmith_layer(engine_layer: int) -> int:
    """vLLM aux-hidden-state id -> draftsmith layer id; the one place the two conventions meet.

    vLLM records aux id k before decoder layer k runs (`_maybe_add_hidden_state(..., idx + 1, ...)` after layer
    idx), so id k is the residual stream entering layer k, and id L (the layer count) the stream entering the
    final norm. draftsmith's id i is the output of 0-based decoder layer i, before any final norm. Both name the
    same tensor when i = k - 1. vLLM's id 0 (the embedding output) has no draftsmith id.
    """
    if engine_layer < 1:
        raise DraftsmithError(f"vLLM layer id {engine_layer} is the embedding output, which draftsmith does not use "
                              "as a feature; extract layers 1..num_layers.")
    return engine_layer - 1


def engine_layer_ids(spec: str, num_layers: int) -> list[int]:
    """The vLLM aux ids of `--engine-layers`, ascending: the order vLLM stacks them in, since it appends each one
    as its forward pass walks the layers, whatever order the config lists them in."""
    if spec == "default":  # speculators' launch_vllm.py and resolve_target_layer_ids, with the last layer
        ids = [2, num_layers // 2, num_layers - 3, num_layers]
    else:
        try:
            ids = [int(x) for x in str(spec).split(",") if x.strip()]
        except ValueError:
            ids = []
        if not ids:
            raise DraftsmithError(f"--engine-layers '{spec}' is not 'default' or a list of vLLM ids like 2,16,29,32.")
    if len(set(ids)) != len(ids) or not all(1 <= k <= num_layers for k in ids):
        raise DraftsmithError(f"--engine-layers {ids} must be distinct vLLM ids within 1..{num_layers} "
                              f"(the target has {num_layers} decoder layers).")
    return sorted(ids)


# --------------------------------------------------------------------------- import
def import_engine_features(config: ImportConfig, target=None, fingerprint: dict | None = None,
                           num_layers: int | None = None) -> dict:
    """Write (or finish writing) the capture of `config.source` into `config.out`; returns the manifest.

    The target is `target` (a loaded or weightless `Target`), or else its `fingerprint` with `num_layers`, or
    else `config.target` opened without weights."""
    from tqdm.auto import tqdm

    if target is None and fingerprint is None:
        target = weightless_target(config.target, config.trust_remote_code)
    facts = _target_facts(target, fingerprint, num_layers)
    engine_ids = engine_layer_ids(config.engine_layers, facts.num_layers)
    available = [draftsmith_layer(k) for k in engine_ids]
    layers = available if config.layers == "all" else parse_layers(config.layers, facts)
    missing = sorted(set(layers) - set(available))
    if missing:
        raise DraftsmithError(
            f"vLLM extracted draftsmith layers {available} (vLLM ids {engine_ids}), not {missing}. Relaunch vLLM "
            f"with --target-layer-ids including {[i + 1 for i in missing]} (vLLM's ids are draftsmith's + 1) and "
            "regenerate, or import fewer --layers.")
    dtype = feature_dtype(config.dtype)
    source = Path(config.source)
    rows, folder, row_ids = _open_source(source, Path(config.hidden_states) if config.hidden_states else None,
                                         config.allow_missing)
    hidden_size = facts.hidden_size or _stored_hidden_size(folder / _hidden_states_file(row_ids[0]))
    out = Path(config.out)
    plan = {
        "target": facts.fingerprint, "layers": layers, "dtype": str(dtype).removeprefix("torch."), "topk_logits": 0,
        "data": str(source.resolve()), "split": "train", "data_fingerprint": rows._fingerprint,
        "num_samples": len(row_ids), "samples_per_shard": config.samples_per_shard, "hidden_size": hidden_size,
        "engine": {"hidden_states": str(folder.resolve()), "engine_layer_ids": engine_ids,
                   "source_rows_sha256": hashlib.sha256(json.dumps(row_ids).encode()).hexdigest()},
    }
    out.mkdir(parents=True, exist_ok=True)
    _check_or_write_plan(out, plan)
    for stale in out.glob(".*.tmp*"):  # temporaries of a killed run; never visible as shards
        stale.unlink()

    num_shards = -(-len(row_ids) // config.samples_per_shard)
    reader = _SampleReader(rows, folder, engine_ids, hidden_size, facts.vocab_size)
    for k in tqdm(range(num_shards), desc="import", unit="shard", mininterval=1.0):
        if (out / _sidecar(k)).is_file():
            continue
        if (out / _shard(k)).is_file():  # killed after the shard's rename, before its sidecar
            _write_sidecar(out, k, file_sha256(out / _shard(k)))
            continue
        sample_ids = _shard_ids(k, config.samples_per_shard, len(row_ids))
        tensors = _import_shard(reader, [row_ids[i] for i in sample_ids], available.index, layers, dtype)
        tensors["sample_ids"] = torch.tensor(list(sample_ids), dtype=torch.int64)
        write_shard(out, k, tensors, {"num_tokens": str(int(tensors["offsets"][-1]))})
    manifest = build_manifest(out, plan, num_shards)
    write_atomically(out / MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def _import_shard(reader, rows: list[int], position_of, layers: list[int], dtype: torch.dtype) -> dict:
    """One shard's tensors in `write_capture`'s layout, plus `source_rows` (the speculators row of each sample)."""
    parts: dict[str, list[torch.Tensor]] = {"input_ids": [], "loss_mask": []}
    offsets = [0]
    kept = torch.bfloat16 if dtype == FP8 else dtype  # per sample, so a shard never holds the wider source dtype
    for row in rows:
        input_ids, loss_mask, hidden = reader.read(row)
        parts["input_ids"].append(input_ids.to(torch.int32))
        parts["loss_mask"].append(loss_mask.to(torch.uint8))
        for layer in layers:
            parts.setdefault(f"features.{layer}", []).append(hidden[:, position_of(layer)].to(kept))
        offsets.append(offsets[-1] + len(input_ids))
    tensors = {name: torch.cat(chunks).contiguous() for name, chunks in parts.items()}
    if dtype == FP8:  # as `draftsmith capture`: bf16 first, then e4m3 with a scale per token
        for layer in layers:
            tensors[f"features.{layer}"], tensors[f"features.{layer}.scale"] = to_fp8(tensors[f"features.{layer}"])
    tensors["offsets"] = torch.tensor(offsets, dtype=torch.int64)
    tensors["source_rows"] = torch.tensor(rows, dtype=torch.int64)
    return tensors


class _SampleReader:
    """Reads row `row` of the speculators data and its hidden-states file, checking everything it relies on."""

    def __init__(self, rows, folder: Path, engine_ids: list[int], hidden_size: int, vocab_size: int | None):
        self.rows = rows.select_columns(["input_ids", "loss_mask"]).with_format("torch")
        self.folder, self.engine_ids, self.hidden_size, self.vocab_size = folder, engine_ids, hidden_size, vocab_size

    def read(self, row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [T], loss_mask [T], hidden states [T, n, H] as stored; float32 for fp8 files)."""
        path = self.folder / _hidden_states_file(row)
        stored = _load_safetensors(path)
        record = self.rows[row]
        input_ids, loss_mask = record["input_ids"].long(), record["loss_mask"].long()

        def bad(why: str) -> DraftsmithError:
            return DraftsmithError(f"'{path}' {why}. Delete it and rerun `speculators generate-offline-data` "
                                   "(it regenerates missing files), then rerun this import.")

        for key in ("hidden_states", "token_ids"):
            if key not in stored:
                raise bad(f"has no '{key}' tensor (it holds {sorted(stored)}), so vLLM's hidden-states "
                          "connector did not write it")
        hidden, token_ids = stored["hidden_states"], stored["token_ids"]
        if hidden.dtype == FP8:
            if "hidden_states_scales" not in stored:
                raise bad("holds float8 hidden states without 'hidden_states_scales'")
            hidden = hidden.float() * stored["hidden_states_scales"].float()  # hs_connectors' per-token scale
        if not torch.equal(token_ids.long(), input_ids):
            raise bad(f"holds the hidden states of other tokens than row {row} of the prepared data "
                      f"({len(token_ids)} vs {len(input_ids)} tokens, first difference at "
                      f"{_first_difference(token_ids.long(), input_ids)})")
        expected = (len(input_ids), len(self.engine_ids), self.hidden_size)
        if tuple(hidden.shape) != expected:
            shape = f"'{path}' has hidden_states of shape {list(hidden.shape)}, expected [tokens, layers, hidden] = "
            if hidden.ndim == 3 and hidden.shape[:1] + hidden.shape[2:] == expected[:1] + expected[2:]:
                raise DraftsmithError(f"{shape}{list(expected)}. vLLM stacks one layer per aux id: pass the ids it "
                                      f"was launched with as --engine-layers (now {self.engine_ids}; launch_vllm.py "
                                      "appends the last layer to --target-layer-ids).")
            raise bad(shape.removeprefix(f"'{path}' ") + str(list(expected)))
        if len(loss_mask) != len(input_ids) or not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
            raise DraftsmithError(f"Row {row} of the prepared data has a loss_mask that is not 0/1 per input id.")
        if self.vocab_size is not None and int(input_ids.max()) >= self.vocab_size:
            raise DraftsmithError(f"Row {row} of the prepared data has token id {int(input_ids.max())}, beyond the "
                                  f"target's vocabulary ({self.vocab_size}): it was tokenized for another model.")
        if not bool(torch.isfinite(hidden).all()):
            raise bad("holds non-finite hidden states")
        return input_ids, loss_mask, hidden


# --------------------------------------------------------------------------- source folder
def _hidden_states_file(row: int) -> str:
    return f"hs_{row}.safetensors"


def _open_source(source: Path, folder: Path | None, allow_missing: bool):
    """(the prepared rows, the hidden-states folder, the rows to import) with clear errors for what is off."""
    from datasets import Dataset, load_from_disk

    if not source.is_dir():
        raise DraftsmithError(f"'{source}' does not exist; point --source at the folder `speculators prepare-data` "
                              "wrote (its --output).")
    try:
        rows = load_from_disk(str(source))
    except (FileNotFoundError, ValueError) as err:
        raise DraftsmithError(f"'{source}' is not a saved `datasets` folder as `speculators prepare-data` writes "
                              f"({err}).") from err
    if not isinstance(rows, Dataset) or not {"input_ids", "loss_mask"} <= set(rows.column_names):
        raise DraftsmithError(f"'{source}' holds {type(rows).__name__} with columns "
                              f"{getattr(rows, 'column_names', None)}, not the input_ids + loss_mask rows of "
                              "`speculators prepare-data`.")
    folder = folder or source / "hidden_states"
    present = _stored_rows(folder)
    beyond = sorted(i for i in present if i >= len(rows))
    if beyond:
        raise DraftsmithError(f"'{folder / _hidden_states_file(beyond[0])}' has no row in '{source}' ({len(rows)} "
                              "rows): these hidden states come from other prepared data.")
    absent = [i for i in range(len(rows)) if i not in present]
    if absent and not allow_missing:
        names = ", ".join(_hidden_states_file(i) for i in absent[:5]) + (", ..." if len(absent) > 5 else "")
        raise DraftsmithError(f"'{folder}' lacks the hidden states of {len(absent)} of {len(rows)} rows ({names}). "
                              "Rerun `speculators generate-offline-data` to fill them in, or pass --allow-missing "
                              "to import only the rows that have them.")
    row_ids = sorted(present)
    if not row_ids:
        raise DraftsmithError(f"'{folder}' has no hidden-states files for the rows of '{source}'.")
    return rows, folder, row_ids


def _stored_rows(folder: Path) -> set[int]:
    """Row numbers with a finished hs_<row>.safetensors in `folder`."""
    if not folder.is_dir():
        raise DraftsmithError(f"'{folder}' does not exist; pass --hidden-states with the --output folder of "
                              "`speculators generate-offline-data`.")
    rows, pickles = set(), []
    for path in folder.iterdir():
        stem = path.name.removesuffix(".safetensors")
        if path.name.endswith(".safetensors") and stem.startswith("hs_") and stem[3:].isdigit():
            if Path(f"{path}.lock").exists():
                raise DraftsmithError(f"'{path}' is still being written (its .lock file exists); wait for "
                                      "`speculators generate-offline-data` to finish, then rerun.")
            rows.add(int(stem[3:]))
        elif path.suffix in (".pt", ".pth", ".pkl", ".bin"):
            pickles.append(path.name)
    if not rows and pickles:
        # Pickle files can run arbitrary code when loaded, and speculators 0.9 writes safetensors only, so
        # these come from an older tool; nothing here unpickles them (not even torch.load(weights_only=True)).
        raise DraftsmithError(f"'{folder}' holds pickle files ({', '.join(sorted(pickles)[:3])}), not the "
                              "hs_<row>.safetensors files of speculators >= 0.9; regenerate them with it.")
    return rows


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises several types for truncated or foreign files
        raise DraftsmithError(f"'{path}' is not a readable safetensors file ({type(err).__name__}: {err}); an "
                              "interrupted copy leaves such files. Delete it and rerun `speculators "
                              "generate-offline-data`, then rerun this import.") from err


def _stored_hidden_size(path: Path) -> int:
    """H of a file's hidden_states [T, n, H], for an import given only a fingerprint."""
    hidden = _load_safetensors(path).get("hidden_states")
    if hidden is None or hidden.ndim != 3:
        raise DraftsmithError(f"'{path}' has no 'hidden_states' tensor of shape [tokens, layers, hidden].")
    return int(hidden.shape[-1])


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    unequal = (a[:n] != b[:n]).nonzero()
    return int(unequal[0]) if len(unequal) else n


# --------------------------------------------------------------------------- the target, without weights
def weightless_target(spec: str, trust_remote_code: bool = False):
    """A `Target` whose model sits on the meta device: the fingerprint, layer count and sizes of a target too
    big to load, from its config and tokenizer alone. A .gguf file or built-in alias loads in full (its config
    lives inside the GGUF, and such targets are small)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from draftsmith.target import BUILTIN_TARGETS, Target, load_target

    if spec in BUILTIN_TARGETS or spec.endswith(".gguf"):
        return load_target(spec)
    where = str(Path(spec).expanduser()) if Path(spec).expanduser().exists() else spec
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"Could not read the config of target '{spec}': {str(err).splitlines()[0][:200]}. "
                              "Pass a local model folder or a hub id in the Hugging Face cache.") from err
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
    except Exception:  # as load_target: a folder without a tokenizer still fingerprints its model
        tokenizer = None
    return Target(model, tokenizer, name=spec)


def _target_facts(target, fingerprint: dict | None, num_layers: int | None) -> SimpleNamespace:
    """What the import needs from the target, from a `Target` or from a fingerprint plus layer count."""
    from draftsmith.target import default_eagle3_layers

    if target is not None:
        return SimpleNamespace(name=target.name, fingerprint=target.fingerprint(), num_layers=target.num_layers,
                               hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                               default_eagle3_layers=target.default_eagle3_layers)
    if num_layers is None:
        raise DraftsmithError("Importing with a target fingerprint alone needs the target's num_layers.")
    return SimpleNamespace(name=fingerprint.get("name"), fingerprint=fingerprint, num_layers=num_layers,
                           hidden_size=None, vocab_size=None,
                           default_eagle3_layers=lambda: default_eagle3_layers(num_layers))


# --------------------------------------------------------------------------- command line
def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `import-features`."""
    from draftsmith.config import add_command

    add_command(
        subparsers, "import-features", ImportConfig,
        summary="Hidden states extracted by vLLM (speculators generate-offline-data) -> a capture folder (resumable).",
        description="Read the prepared data and hs_<row>.safetensors files of speculators' vLLM data generation "
        "and write them as a draftsmith capture (shards + manifest.json) that training reads like the output "
        "of `draftsmith capture`. Rerun the same command after an interruption to finish.",
    )


def run(args: argparse.Namespace) -> int:
    """Import, then print what was written."""
    from draftsmith.config import from_flags

    config = from_flags(ImportConfig, args)
    manifest = import_engine_features(config)
    print(f"imported {manifest['num_samples']} samples, {manifest['num_tokens']} tokens, layers "
          f"{manifest['layers']}, {manifest['num_shards']} shards -> {config.out}/manifest.json")
    return 0
