"""`draftsmith capture`: write target features to resumable shards; `--verify` re-checks them.

Shard k always holds samples [k*N, (k+1)*N) of the split, whoever writes it, so a run resumed
after kill -9, or split over ranks under `accelerate launch` (rank r writes shards k with
k % world == r), produces exactly the shards of one uninterrupted single-process run.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.data.capture import (
    CONFIG, FP8, MANIFEST, TokenDataset, batches_by_tokens, capture_batch, collate, feature_dtype, parse_layers,
    read_manifest, to_fp8,
)
from draftsmith.errors import DraftsmithError
from draftsmith.files import file_sha256, write_atomically


@dataclass
class CaptureConfig:
    target: str = "smollm2-135m-instruct"
    """target model (hub id, folder, .gguf, or built-in alias); must be the one the data was prepared for"""
    data: str = "runs/data"
    """prepared data folder (from `draftsmith prepare`)"""
    layers: str = "eagle3"
    """feature layers: eagle3 (3 EAGLE-3 layers + last), dflash:N, last, or ids like 1,14,26"""
    out: str = "runs/features"
    """output folder for shards and manifest.json"""
    dtype: str = "bf16"
    """dtype of stored features: bf16, fp16, fp32 or fp8 (e4m3 with one float32 scale per token and layer; half
    of bf16's size, read back as bf16)"""
    topk_logits: int = 0
    """also store the target's top-K logits per token (0 = off)"""
    split: str = "train"
    """which split of the prepared data to capture"""
    samples_per_shard: int = 128
    """samples per shard file (also the unit of resume and of data-parallel work)"""
    max_batch_tokens: int = 8192
    """padded tokens per target forward"""
    max_batch_size: int = 16
    """samples per target forward"""
    target_dtype: str = "auto"
    """dtype the target computes in (a copy when the loaded target has another): float32, bfloat16, float16, or
    auto = bfloat16 for a float32 target on a CPU where bf16 measures faster (AMX: 1.86x,
    bench/studies/data_dtype.py), else its own"""
    shard: str = "none"
    """fsdp = split the target's weights over the processes of `accelerate launch` (each holds 1/N; see
    `target.shard` of a recipe) while each process still captures its own shards; none = a whole target each"""
    shard_group: int = 0
    """processes that share one copy of a sharded target (0 = all); must divide the number of processes"""
    verify: str = ""
    """instead of capturing, re-check every shard checksum of this capture folder"""

    def validate(self) -> None:
        from draftsmith.sharding import SHARD_MODES

        if self.shard not in SHARD_MODES:
            raise DraftsmithError(f"--shard {self.shard!r}: use one of {', '.join(SHARD_MODES)}.")


# --------------------------------------------------------------------------- process group
class _Ranks:
    """Rank/world from `accelerate launch` (or torchrun) when present; a single process otherwise."""

    def __init__(self):
        self.state = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            # cpu=True without CUDA: a plain PartialState() under a MULTI_GPU launch config set up a gloo group
            # but called every process rank 0 of 1, and each captured every shard
            self.state = PartialState(cpu=not torch.cuda.is_available())
        self.rank = self.state.process_index if self.state else 0
        self.world = self.state.num_processes if self.state else 1
        self.device = self.state.device if self.state else None

    def barrier(self) -> None:
        if self.state:
            self.state.wait_for_everyone()


# --------------------------------------------------------------------------- capture
def write_capture(config: CaptureConfig, target=None) -> dict | None:
    """Capture (or finish capturing) `config.data` into `config.out`; returns the manifest on rank 0 (its "seconds":
    this call's wall time, the target's loading included)."""
    from draftsmith.data.prepared import load_prepared

    began = time.monotonic()
    from draftsmith.target import load_target

    ranks = _Ranks()
    shard = config.shard != "none"
    if target is None:
        target = load_target(config.target, dtype="float32" if config.target_dtype == "auto" else config.target_dtype,
                             device="cpu" if shard or not ranks.device else str(ranks.device))
    target = _in_working_dtype(target, config.target_dtype)
    if shard and not target.sharded:
        from draftsmith.sharding import shard_target

        shard_target(target, ranks.device or "cpu", config.shard_group)
    splits = load_prepared(config.data, target)
    if config.split not in splits:
        raise DraftsmithError(f"Prepared data '{config.data}' has no split '{config.split}' (has {list(splits)}).")
    split = splits[config.split]
    layers = parse_layers(config.layers, target)
    dtype = feature_dtype(config.dtype)
    out = Path(config.out)
    plan = {
        "target": target.fingerprint(), "layers": layers, "dtype": str(dtype).removeprefix("torch."),
        "topk_logits": config.topk_logits, "data": str(Path(config.data).resolve()), "split": config.split,
        "data_fingerprint": split._fingerprint, "num_samples": len(split),
        "samples_per_shard": config.samples_per_shard, "hidden_size": target.hidden_size,
    }
    if ranks.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        _check_or_write_plan(out, plan)
        for stale in out.glob(".*.tmp*"):  # temporaries of a killed run; never visible as shards
            stale.unlink()
    ranks.barrier()

    num_shards = -(-len(split) // config.samples_per_shard)
    mine = [k for k in range(ranks.rank, num_shards, ranks.world) if not (out / _sidecar(k)).is_file()]
    dataset, lengths = TokenDataset(split), list(split["length"])
    pad_id = target.tokenizer.pad_token_id if target.tokenizer and target.tokenizer.pad_token_id is not None else 0
    from tqdm.auto import tqdm

    todo = sum(lengths[i] for k in mine for i in _shard_ids(k, config.samples_per_shard, len(split)))
    # target forwards this process will make: every process of a sharded target must make as many (decided before
    # the first one, since a collective here would meet another process's forward)
    idle_passes = 0
    if target.sharded:
        idle_passes = _passes_short_of_the_group(sum(
            len(batches_by_tokens(lengths, _shard_ids(k, config.samples_per_shard, len(split)),
                                  config.max_batch_tokens, config.max_batch_size))
            for k in mine if not (out / _shard(k)).is_file()))
    with tqdm(total=todo, desc=f"capture[{ranks.rank}]", unit="tok", unit_scale=True,
              disable=ranks.rank != 0, mininterval=1.0) as bar:
        for k in mine:
            if (out / _shard(k)).is_file():  # killed after the shard's rename, before its sidecar
                _write_sidecar(out, k, file_sha256(out / _shard(k)))
                continue
            ids = _shard_ids(k, config.samples_per_shard, len(split))
            tensors, metadata = capture_samples(target, dataset, lengths, ids, layers, dtype, config, pad_id)
            write_shard(out, k, tensors, metadata)
            bar.update(sum(lengths[i] for i in ids))
    idle = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 1, dtype=torch.long)}
    for _ in range(idle_passes):  # each forward of a sharded target gathers every layer from all its processes
        capture_batch(target, idle, layers, topk_logits=config.topk_logits)
    ranks.barrier()
    if ranks.rank != 0:
        return None
    manifest = {**build_manifest(out, plan, num_shards), "seconds": round(time.monotonic() - began, 1)}
    write_atomically(out / MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def _in_working_dtype(target, asked: str):
    """The target in the dtype the capture computes in; a sharded target cannot be copied, so it keeps its own
    unless another was asked for explicitly (then: load it in that dtype, `target.dtype`)."""
    from draftsmith.target import in_dtype, working_dtype

    if not target.sharded:
        return in_dtype(target, working_dtype(asked, target))
    if asked != "auto" and working_dtype(asked, target) != target.dtype:
        raise DraftsmithError(f"A sharded target computes in the dtype it was loaded in ({target.dtype}); set the "
                              f"target's dtype to {asked} instead of a capture dtype.")
    return target


def _passes_short_of_the_group(passes: int) -> int:
    """How many one-token target forwards this process must add to its `passes` to make as many as the busiest
    process: a sharded target's forward gathers every layer from all processes, and shards (a resumed capture's
    above all) give them different amounts of work."""
    import torch.distributed as dist

    most = torch.tensor([passes])
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most) - passes


def capture_samples(target, dataset, lengths, ids, layers, dtype, config, pad_id):
    """Features of samples `ids` concatenated along tokens (no padding stored)."""
    parts: dict[str, list[torch.Tensor]] = {"input_ids": [], "loss_mask": []}
    fp8 = dtype == FP8
    for group in batches_by_tokens(lengths, ids, config.max_batch_tokens, config.max_batch_size):
        batch = capture_batch(target, collate([dataset[i] for i in group], pad_id), layers,
                              torch.bfloat16 if fp8 else dtype, config.topk_logits)
        for row, sample_id in enumerate(group):
            n = lengths[sample_id]
            parts["input_ids"].append(batch["input_ids"][row, :n].to(torch.int32))
            parts["loss_mask"].append(batch["loss_mask"][row, :n].to(torch.uint8))
            for layer in layers:
                parts.setdefault(f"features.{layer}", []).append(batch["features"][layer][row, :n].cpu())
            if config.topk_logits:
                for key in ("values", "indices"):
                    parts.setdefault(f"topk.{key}", []).append(batch["target_topk"][key][row, :n].cpu())
    tensors = {name: torch.cat(chunks).contiguous() for name, chunks in parts.items()}
    if fp8:
        for layer in layers:
            tensors[f"features.{layer}"], tensors[f"features.{layer}.scale"] = to_fp8(tensors[f"features.{layer}"])
    offsets = [0]
    for sample_id in ids:
        offsets.append(offsets[-1] + lengths[sample_id])
    tensors["offsets"] = torch.tensor(offsets, dtype=torch.int64)
    tensors["sample_ids"] = torch.tensor(list(ids), dtype=torch.int64)
    return tensors, {"num_tokens": str(offsets[-1])}


def write_shard(out: Path, k: int, tensors: dict, metadata: dict) -> None:
    """Write shard k (tmp + fsync + rename), then its sidecar with the checksum."""
    from safetensors.torch import save

    blob = save(tensors, metadata)
    write_atomically(out / _shard(k), blob)
    _write_sidecar(out, k, hashlib.sha256(blob).hexdigest())


def build_manifest(out: Path, plan: dict, num_shards: int) -> dict:
    """manifest.json: the plan plus every shard's sample ids, tokens and sha256; totals."""
    shards = []
    for k in range(num_shards):
        path = out / _sidecar(k)
        if not path.is_file():
            raise DraftsmithError(f"Shard {k} of '{out}' is missing after capture; rerun the same command.")
        shards.append(json.loads(path.read_text()))
    return {**plan, "format": "draftsmith-features-v1", "num_shards": num_shards,
            "num_tokens": sum(s["num_tokens"] for s in shards), "shards": shards}


def verify_capture(directory: str | Path) -> dict:
    """Re-check every shard's sha256 and that every sample id appears exactly once."""
    from tqdm.auto import tqdm

    directory = Path(directory)
    manifest = read_manifest(directory)
    problems, seen = [], []
    for shard in tqdm(manifest["shards"], desc="verify", unit="shard"):
        path = directory / shard["file"]
        if not path.is_file():
            problems.append(f"{shard['file']}: missing")
        elif file_sha256(path) != shard["sha256"]:
            problems.append(f"{shard['file']}: sha256 mismatch (file changed or corrupt)")
        seen.extend(shard["sample_ids"])
    if sorted(seen) != list(range(manifest["num_samples"])):
        problems.append(f"sample ids are not exactly 0..{manifest['num_samples'] - 1} once each")
    if problems:
        raise DraftsmithError(f"Capture '{directory}' failed verification: " + "; ".join(problems[:10])
                              + ". Delete the bad shards and their .json files, then rerun the capture command.")
    return {"shards": len(manifest["shards"]), "num_samples": manifest["num_samples"],
            "num_tokens": manifest["num_tokens"], "ok": True}


# --------------------------------------------------------------------------- files
def _shard(k: int) -> str:
    return f"shard-{k:05d}.safetensors"


def _sidecar(k: int) -> str:
    return f"shard-{k:05d}.json"


def _shard_ids(k: int, per_shard: int, total: int) -> range:
    return range(k * per_shard, min((k + 1) * per_shard, total))


def _write_sidecar(out: Path, k: int, sha256: str) -> None:
    from draftsmith.data.capture import read_safetensors_mmap

    tensors, metadata = read_safetensors_mmap(out / _shard(k))
    entry = {"file": _shard(k), "sample_ids": tensors["sample_ids"].tolist(),
             "num_tokens": int(metadata["num_tokens"]), "bytes": (out / _shard(k)).stat().st_size,
             "sha256": sha256}
    write_atomically(out / _sidecar(k), json.dumps(entry).encode())


def _check_or_write_plan(out: Path, plan: dict) -> None:
    path = out / CONFIG
    if path.is_file():
        old = json.loads(path.read_text())
        if old != plan:
            changed = sorted(key for key in set(old) | set(plan) if old.get(key) != plan.get(key))
            raise DraftsmithError(
                f"'{out}' holds a capture made with different settings ({', '.join(changed)} differ). "
                "Rerun with the original settings to resume it, or choose a new --out."
            )
        return
    write_atomically(path, json.dumps(plan, indent=2).encode())
