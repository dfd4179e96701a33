"""Target features for drafter training: offline (sharded safetensors on disk) or online (in the loop).

Both modes yield the same batch: `input_ids [B,S]`, `loss_mask [B,S]`, `attention_mask [B,S]`,
`features {layer: [B,S,H]}` (zeros on padding, right-padded), plus `target_topk` when captured.

Offline layout of OUT (see `write_capture`):
  capture_config.json           what is being captured (checked on resume, so a rerun cannot mix runs)
  shard-00000.safetensors ...   samples [k*N, (k+1)*N) of the train split, tokens concatenated:
                                  input_ids int32 [T], loss_mask uint8 [T], offsets int64 [n+1],
                                  sample_ids int64 [n], features.{layer} [T,H], (topk.values/indices);
                                  fp8 captures add features.{layer}.scale float32 [T] (one scale per token)
  shard-00000.json              per-shard sample ids, token count, sha256 (written after the shard)
  manifest.json                 target fingerprint, layers, dtype, shards, num_samples, num_tokens
Every file is written to a temporary name, fsync'ed and renamed, so a half-written shard is never
visible; a rerun after kill -9 skips finished shards and redoes only the missing ones.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError

MANIFEST = "manifest.json"
CONFIG = "capture_config.json"
SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn,
                      "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}
FP8 = torch.float8_e4m3fn
FP8_NAMES = ("fp8", "float8", "float8_e4m3fn")


def feature_dtype(name: str | torch.dtype) -> torch.dtype:
    """The dtype captured features are stored in: the target dtypes (bf16, fp16, fp32) or fp8 (e4m3, scaled)."""
    from draftsmith.target import DTYPES, parse_dtype

    if name in FP8_NAMES or name == FP8:
        return FP8
    if isinstance(name, str) and name not in DTYPES:
        raise DraftsmithError(f"Unknown feature dtype '{name}'. Use one of: bf16, fp16, fp32, fp8.")
    return parse_dtype(name)


def feature_bytes_per_token(hidden_size: int, num_layers: int, dtype: str | torch.dtype = "bf16",
                            topk_logits: int = 0) -> int:
    """Bytes one token takes in a capture's shards (what `write_capture` stores): each layer's features in `dtype`
    (fp8 adds one float32 scale per layer), the token id (int32) and loss mask (uint8), and with `topk_logits` the
    top-k values (bf16 for fp8 captures, else `dtype`) and int32 indices. Per sample, 16 bytes more (offset, id)."""
    stored = feature_dtype(dtype)
    per_layer = hidden_size * stored.itemsize + (4 if stored == FP8 else 0)
    topk_value = torch.bfloat16.itemsize if stored == FP8 else stored.itemsize
    return num_layers * per_layer + 4 + 1 + topk_logits * (topk_value + 4)


def to_fp8(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 e4m3 features [T, H], float32 scale [T]): each token's row scaled so its largest magnitude is e4m3's
    largest (448): ~6% relative error per value at most, whatever the row's range."""
    scale = features.float().abs().amax(-1).clamp(min=1e-12) / torch.finfo(FP8).max
    return (features.float() / scale[:, None]).to(FP8), scale


def from_fp8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The bf16 features that `to_fp8` stored."""
    return (values.float() * scale[:, None]).to(torch.bfloat16)


# --------------------------------------------------------------------------- layer specs
def parse_layers(spec: str | list[int], target) -> list[int]:
    """`eagle3` | `dflash:N` | `last` | `i,j,k` -> sorted output-layer ids of `target`.

    `eagle3` = the three EAGLE-3 layers plus the last layer L-1, whose output gives the target's
    own distribution through `target.head` (the EAGLE-3 training target). `dflash:N` = N layers
    spread over depth, round(1 + i(L-4)/(N-1)), plus L-1 for the same reason.
    """
    last = target.num_layers - 1
    if isinstance(spec, (list, tuple)):
        layers = [int(x) for x in spec]
    elif spec == "eagle3":
        layers = target.default_eagle3_layers() + [last]
    elif spec == "last":
        layers = [last]
    elif spec.startswith("dflash:"):
        try:
            count = int(spec.split(":", 1)[1])
        except ValueError:
            count = 0
        if count < 2:
            raise DraftsmithError(f"Layer spec '{spec}': dflash:N needs N >= 2 (for example dflash:5).")
        layers = [round(1 + i * (target.num_layers - 4) / (count - 1)) for i in range(count)] + [last]
    else:
        try:
            layers = [int(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            layers = []
        if not layers:
            raise DraftsmithError(f"Layer spec '{spec}' is not one of eagle3, dflash:N, last, or i,j,k (ids).")
    bad = [i for i in layers if not 0 <= i <= last]
    if bad:
        raise DraftsmithError(f"Layer ids {bad} are out of range: target '{target.name}' has layers 0..{last}.")
    return sorted(set(layers))


# --------------------------------------------------------------------------- token data + batches
class TokenDataset(torch.utils.data.Dataset):
    """A prepared split as tensors: items {"input_ids": LongTensor[S], "loss_mask": LongTensor[S], "sample_id"}."""

    def __init__(self, split):
        self.split = split.select_columns(["input_ids", "loss_mask"]).with_format("torch")
        self._lengths = list(split["length"]) if "length" in split.column_names else None

    def __len__(self) -> int:
        return len(self.split)

    def lengths(self) -> list[int]:
        """Tokens per sample (what batching by length sorts on)."""
        if self._lengths is None:
            self._lengths = [len(ids) for ids in self.split["input_ids"]]
        return [int(n) for n in self._lengths]

    def __getitem__(self, index: int) -> dict:
        row = self.split[int(index)]
        return {"input_ids": row["input_ids"].long(), "loss_mask": row["loss_mask"].long(), "sample_id": int(index)}


def collate(items: list[dict], pad_id: int = 0) -> dict:
    """Right-pad items into a batch; loss_mask and features are 0 on padding."""
    lengths = [len(item["input_ids"]) for item in items]
    size, width = len(items), max(lengths)
    batch = {
        "input_ids": torch.full((size, width), pad_id, dtype=torch.long),
        "loss_mask": torch.zeros(size, width, dtype=torch.long),
        "attention_mask": torch.zeros(size, width, dtype=torch.long),
    }
    for row, (item, n) in enumerate(zip(items, lengths)):
        batch["input_ids"][row, :n] = item["input_ids"]
        batch["loss_mask"][row, :n] = item["loss_mask"]
        batch["attention_mask"][row, :n] = 1
    if "sample_id" in items[0]:
        batch["sample_ids"] = torch.tensor([item["sample_id"] for item in items])
    if "features" in items[0]:
        batch["features"] = {layer: _pad_stack([item["features"][layer] for item in items], width)
                             for layer in items[0]["features"]}
    if "target_topk" in items[0]:
        batch["target_topk"] = {key: _pad_stack([item["target_topk"][key] for item in items], width)
                                for key in ("values", "indices")}
    return batch


def _pad_stack(tensors: list[torch.Tensor], width: int) -> torch.Tensor:
    out = tensors[0].new_zeros((len(tensors), width, *tensors[0].shape[1:]))
    for row, tensor in enumerate(tensors):
        out[row, : tensor.shape[0]] = tensor
    return out


@torch.no_grad()
def capture_batch(target, batch: dict, layers: list[int], dtype: torch.dtype | str = torch.bfloat16,
                  topk_logits: int = 0) -> dict:
    """Online mode: add `features` (and `target_topk` if asked) to a collated batch with one target forward."""
    from draftsmith.target import parse_dtype

    dtype = parse_dtype(dtype)
    wanted = sorted(set(layers) | ({target.num_layers - 1} if topk_logits else set()))
    out = target.forward(batch["input_ids"].to(target.device), layers=wanted,
                         attention_mask=batch["attention_mask"].to(target.device), logits=False)
    keep = batch["attention_mask"].to(target.device).unsqueeze(-1).bool()
    result = dict(batch)
    result["features"] = {layer: out.features[layer].masked_fill(~keep, 0).to(dtype) for layer in layers}
    if topk_logits:
        logits = target.head(out.features[target.num_layers - 1])
        values, indices = logits.float().topk(topk_logits, dim=-1)
        result["target_topk"] = {"values": values.masked_fill(~keep, 0).to(dtype),
                                 "indices": indices.masked_fill(~keep, 0).to(torch.int32)}
    return result


def batches_by_tokens(lengths: list[int], ids: list[int], max_tokens: int, max_batch: int) -> list[list[int]]:
    """Consecutive groups of sample ids whose padded size stays within max_tokens."""
    groups, current, longest = [], [], 0
    for sample_id in ids:
        n = lengths[sample_id]
        if current and (max(longest, n) * (len(current) + 1) > max_tokens or len(current) >= max_batch):
            groups.append(current)
            current, longest = [], 0
        current.append(sample_id)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups


# --------------------------------------------------------------------------- reading shards
def read_safetensors_mmap(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors of a safetensors file as zero-copy views of a read-only memory map, plus its metadata."""
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    (header_len,) = struct.unpack("<Q", mapped[:8])
    header = json.loads(mapped[8:8 + header_len])
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + header_len
    storage = torch.frombuffer(mapped, dtype=torch.uint8)
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = storage[base + start: base + end]
        tensors[name] = raw.view(SAFETENSORS_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors, metadata


class FeatureShards(torch.utils.data.Dataset):
    """Captured samples, memory-mapped; items {"input_ids", "loss_mask", "features": {layer: [S,H]}, "sample_id"}.

    Map-style, so a shuffling sampler shuffles by sample. Refuses captures made from another
    target (fingerprint) or without the layers the drafter needs; with `expect_layers`, items hold those layers
    only (a capture shared by several drafters stores more, which one drafter's batches need not copy).
    """

    def __init__(self, directory: str | Path, expect_fingerprint: dict | None = None,
                 expect_layers: list[int] | None = None):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        check_compatible(self.manifest, expect_fingerprint, expect_layers, self.directory)
        self.layers = self.manifest["layers"] if expect_layers is None else sorted(set(expect_layers))
        self.files = [self.directory / shard["file"] for shard in self.manifest["shards"]]
        missing = [str(f) for f in self.files if not f.is_file()]
        if missing:
            raise DraftsmithError(f"Capture '{self.directory}' lacks shard files {missing[:3]}; "
                                  "check it with `draftsmith capture --verify`.")
        self.index = [(number, position) for number, shard in enumerate(self.manifest["shards"])
                      for position in range(len(shard["sample_ids"]))]
        self._maps: dict[int, dict[str, torch.Tensor]] = {}  # opened lazily, per process

    def __getstate__(self):  # DataLoader workers re-map the files instead of pickling the maps
        return {**self.__dict__, "_maps": {}}

    def _shard(self, number: int) -> dict[str, torch.Tensor]:
        if number not in self._maps:
            self._maps[number] = read_safetensors_mmap(self.files[number])[0]
        return self._maps[number]

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self) -> list[int]:
        """Tokens per sample, from the shards' offsets (what batching by length sorts on)."""
        sizes = {number: self._shard(number)["offsets"].diff().tolist() for number in range(len(self.files))}
        return [int(sizes[number][position]) for number, position in self.index]

    def __getitem__(self, index: int) -> dict:
        shard_number, position = self.index[index]
        tensors = self._shard(shard_number)
        start, end = tensors["offsets"][position].item(), tensors["offsets"][position + 1].item()
        item = {
            "input_ids": tensors["input_ids"][start:end].long(),
            "loss_mask": tensors["loss_mask"][start:end].long(),
            "sample_id": int(tensors["sample_ids"][position]),
            "features": {layer: _features(tensors, layer, start, end) for layer in self.layers},
        }
        if "topk.values" in tensors:
            item["target_topk"] = {"values": tensors["topk.values"][start:end],
                                   "indices": tensors["topk.indices"][start:end]}
        return item


def _features(tensors: dict, layer: int, start: int, end: int) -> torch.Tensor:
    """One layer's features of tokens [start, end) of a shard, read back from fp8 where it was stored so."""
    values, scale = tensors[f"features.{layer}"][start:end], tensors.get(f"features.{layer}.scale")
    return values if scale is None else from_fp8(values, scale[start:end])


def read_manifest(directory: Path) -> dict:
    """The manifest of a finished capture; clear error when the capture is missing or unfinished."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        hint = (" It looks unfinished: rerun the same `draftsmith capture` command to complete it."
                if (Path(directory) / CONFIG).is_file() else " Create it with `draftsmith capture`.")
        raise DraftsmithError(f"'{directory}' has no {MANIFEST}, so it is not a finished capture.{hint}")
    return json.loads(path.read_text())


def check_compatible(manifest: dict, fingerprint: dict | None, layers: list[int] | None, where) -> None:
    """Raise when captured features come from another target or lack required layers."""
    from draftsmith.target import fingerprint_mismatch

    why = None if fingerprint is None else fingerprint_mismatch(manifest.get("target"), fingerprint)
    if why:
        raise DraftsmithError(
            f"Features in '{where}' cannot train a drafter for this target: {why}. Capture again with this "
            "target into another folder (`draftsmith capture --target ... --out DIR`; recipes: data.features), "
            "or use online capture (data.online=true)."
        )
    if layers is not None:
        missing = sorted(set(layers) - set(manifest["layers"]))
        if missing:
            raise DraftsmithError(
                f"Features in '{where}' hold layers {manifest['layers']}, but the drafter needs "
                f"{sorted(layers)} (missing {missing}). Capture again with --layers {','.join(map(str, sorted(layers)))}."
            )
