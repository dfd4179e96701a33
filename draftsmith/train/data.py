"""Batches for the trainer: a deterministic sample order that makes resuming exact.

The order is a pure function of (seed, sample counter): epoch e visits the samples in
`randperm(n, seed + e)`, and the samples of all epochs form one stream. Optimizer step s uses
micro-batches `s * W * A + k` (W processes, A accumulation steps), with micro-batch
`k = accum_index * W + rank` going to that process. So the data position is just the step,
and 1 process x 2 accumulation steps sees exactly the batches that 2 processes x 1 see.

With sample lengths given (data.group_by_length), each epoch's permutation is then sorted by length,
longest first, inside windows of GROUP_BATCHES micro-batches: a micro-batch holds samples of similar
length, so little of it is padding (on the built-in corpus at batch size 4, 99% real tokens instead
of 64%), while the order stays a pure function of (seed, sample counter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

Batch = dict[str, Any]
GROUP_BATCHES = 16
"""group_by_length sorts the shuffled order inside windows of this many micro-batches"""


@dataclass
class TrainingData:
    """Everything the loop needs from the data side; built by `build_training_data` or by tests."""

    train: Sequence[dict]  # items: input_ids [S], loss_mask [S], optional features {layer: [S, H]}
    eval: Sequence[dict]  # held-out items of the same shape
    collate: Callable[[list[dict]], Batch]  # items -> padded batch with attention_mask
    add_features: Callable[[Batch], Batch]  # online capture (target forward) or identity for shards
    prompts: list[list[int]]  # held-out prompts for the validation decode
    topk_memory: TopkMemory | None = None  # online top-k kept across epochs; checkpoints save it per process
    also: dict[str, Sequence[dict]] = field(default_factory=dict)  # more held-out sets by name (eval.also)


class SampleOrder:
    """Which sample indices micro-batch g holds, for a dataset of n samples."""

    def __init__(self, num_samples: int, batch_size: int, seed: int, lengths: Sequence[int] | None = None):
        if lengths is not None and len(lengths) != num_samples:
            raise ValueError(f"{len(lengths)} lengths for {num_samples} samples")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.lengths = lengths
        self._epoch = -1
        self._permutation: list[int] = []

    def _epoch_order(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
            if self.lengths is not None:
                window = self.batch_size * GROUP_BATCHES
                order = [index for start in range(0, len(order), window)
                         for index in sorted(order[start:start + window], key=lambda i: -self.lengths[i])]
            self._permutation = order
            self._epoch = epoch
        return self._permutation

    def micro_batch(self, index: int) -> list[int]:
        """Sample indices of micro-batch `index` in the endless stream of epochs."""
        start = index * self.batch_size
        out = []
        for position in range(start, start + self.batch_size):
            epoch, offset = divmod(position, self.num_samples)
            out.append(self._epoch_order(epoch)[offset])
        return out


def micro_batch_index(step: int, accum_index: int, rank: int, world: int, accum: int) -> int:
    """Global micro-batch number for (optimizer step, accumulation index, process)."""
    return step * world * accum + accum_index * world + rank


def truncate(item: dict, max_length: int) -> dict:
    """Cut one sample (tokens, mask, per-layer features) to `max_length` positions."""
    out = dict(item)
    for key in ("input_ids", "loss_mask"):
        out[key] = item[key][:max_length]
    for key in ("features", "target_topk"):
        if key in item:
            out[key] = {name: value[:max_length] for name, value in item[key].items()}
    return out


def prompt_of(item: dict) -> list[int]:
    """The tokens before the first loss-masked one: the prompt an assistant answer followed."""
    mask = torch.as_tensor(item["loss_mask"]).bool()
    ids = torch.as_tensor(item["input_ids"])
    first = int(mask.nonzero()[0]) if mask.any() else len(ids)
    return ids[: max(first, 1)].tolist()


class TopkMemory:
    """Online training's top-k logits, kept in memory from a sequence's first visit for every later one.

    An online step runs the target for the features anyway, but the top-k needs the target's head over the
    whole vocabulary at every position (on SmolLM2-135M, a fifth of the model). A sequence's top-k depends
    only on its tokens (right padding, causal attention), so it is kept by the tokens' bytes and every later
    epoch skips the head. Memory: 6 bytes per token and logit on the CPU (bf16 values, int32 indices),
    21 MB for the 446k tokens of 2048 conversations at K = 8. Every checkpoint saves each process's memory:
    recomputed after a resume in other batches, a kept value could differ by one bf16 step (SmolLM2-135M: 1 of
    6 sequences checked) and the resumed run would no longer be the uninterrupted one bit for bit."""

    def __init__(self):
        self.by_tokens: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _sequences(batch: Batch) -> list[tuple[bytes, int]]:
        """(key, length) of every row: the bytes of its real tokens, and how many there are."""
        ids, lengths = batch["input_ids"].cpu(), batch["attention_mask"].sum(1).tolist()
        return [(ids[row, :n].numpy().tobytes(), n) for row, n in enumerate(lengths)]

    def keep(self, batch: Batch, topk: dict[str, torch.Tensor]) -> None:
        values, indices = topk["values"].cpu(), topk["indices"].cpu()
        for row, (key, n) in enumerate(self._sequences(batch)):
            self.by_tokens[key] = (values[row, :n].clone(), indices[row, :n].clone())

    def save(self, path: Path) -> None:
        """Write every kept sequence (its tokens, top-k values and indices) to a safetensors file."""
        from safetensors.torch import save_file

        keys = list(self.by_tokens)
        tokens = [torch.frombuffer(bytearray(key), dtype=torch.long) for key in keys]
        rows = [self.by_tokens[key] for key in keys]
        if not rows:
            save_file({"lengths": torch.zeros(0, dtype=torch.long)}, str(path))
            return
        save_file({"lengths": torch.tensor([len(t) for t in tokens]), "tokens": torch.cat(tokens),
                   "values": torch.cat([v for v, _ in rows]), "indices": torch.cat([i for _, i in rows])}, str(path))

    def load(self, path: Path) -> None:
        """Replace the memory by what `save` wrote."""
        from safetensors.torch import load_file

        saved = load_file(str(path))
        self.by_tokens = {}
        start = 0
        for length in saved["lengths"].tolist():
            end = start + length
            key = saved["tokens"][start:end].numpy().tobytes()
            self.by_tokens[key] = (saved["values"][start:end].clone(), saved["indices"][start:end].clone())
            start = end

    def recall(self, batch: Batch) -> dict[str, torch.Tensor] | None:
        """The batch's top-k as capture_batch gives it (zeros on padding), or None unless every row was seen."""
        rows = [self.by_tokens.get(key) for key, _ in self._sequences(batch)]
        if any(row is None for row in rows):
            return None
        width, device = batch["input_ids"].shape[1], batch["input_ids"].device
        values = rows[0][0].new_zeros(len(rows), width, rows[0][0].shape[-1])
        indices = rows[0][1].new_zeros(len(rows), width, rows[0][1].shape[-1])
        for row, (value, index) in enumerate(rows):
            values[row, : len(value)], indices[row, : len(index)] = value, index
        return {"values": values.to(device), "indices": indices.to(device)}


def capture_once(data, target, layers: list[int], split) -> None:
    """Offline training with both data.prepared and data.features: capture the prepared train split's features
    (the drafter's `layers` and data.capture_layers) into data.features on the first run (resumable after a crash,
    as `draftsmith capture`); later runs and epochs, and other recipes sharing the folder, read them without
    running the target. Refuses features captured from other prepared data or with fewer top-k logits than
    data.topk_logits (any dtype is read: data.features_dtype is what a capture made here uses)."""
    import json
    import time

    from draftsmith.data.capture import MANIFEST, parse_layers
    from draftsmith.data.offline import CaptureConfig, write_capture
    from draftsmith.errors import DraftsmithError

    manifest = Path(data.features) / MANIFEST
    if manifest.is_file():
        made, why = json.loads(manifest.read_text()), None
        if made.get("data_fingerprint") != split._fingerprint:
            why = f"from other data than data.prepared '{data.prepared}' holds now"
        elif made.get("topk_logits", 0) < data.topk_logits:
            why = f"with {made.get('topk_logits', 0)} top logits per token, fewer than data.topk_logits {data.topk_logits}"
        if why:
            raise DraftsmithError(f"The features in '{data.features}' were captured {why}. Point data.features at a "
                                  "new folder (or delete that one) to capture again.")
        return
    began = time.monotonic()
    print(f"capturing the target's features of {data.prepared} -> {data.features} (first run only)", flush=True)
    if data.capture_layers:
        layers = sorted(set(layers) | set(parse_layers(data.capture_layers, target)))
    config = CaptureConfig(target=target.name, data=str(data.prepared), out=str(data.features),
                           layers=",".join(map(str, layers)), max_batch_size=max(data.batch_size, 1),
                           dtype=data.features_dtype, topk_logits=data.topk_logits, target_dtype=data.capture_dtype)
    result = write_capture(config, target)
    if result is not None:
        print(f"captured {result['num_samples']} samples, {result['num_tokens']} tokens, in "
              f"{(time.monotonic() - began) / 60:.1f} min", flush=True)


def build_training_data(config, target, layers: list[int], num_prompts: int) -> TrainingData:
    """Offline shards or online capture as the recipe says, plus held-out batches and prompts."""
    from draftsmith.data.capture import FeatureShards, TokenDataset, capture_batch, collate
    from draftsmith.data.prepared import load_prepared
    from draftsmith.errors import DraftsmithError

    data = config.data
    pad_id = getattr(target.tokenizer, "pad_token_id", None) or 0
    prepared = load_prepared(data.prepared, target) if data.prepared else None
    if data.online:
        train = TokenDataset(prepared["train"])
    else:
        if prepared is not None:
            capture_once(data, target, layers, prepared["train"])
        train = FeatureShards(data.features, expect_fingerprint=target.fingerprint(), expect_layers=layers)
    held_out = TokenDataset(prepared["eval"]) if prepared is not None and "eval" in prepared else []
    if len(train) == 0:
        raise DraftsmithError(f"The training data ({data.features or data.prepared}) has no samples.")

    remembered = TopkMemory() if data.online and data.topk_logits else None

    def add_features(batch: Batch) -> Batch:
        if "features" in batch:
            return batch
        moved = {k: v.to(target.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        known = remembered.recall(moved) if remembered is not None else None
        captured = capture_batch(target, moved, layers, topk_logits=0 if known is not None else data.topk_logits)
        if known is not None:
            captured["target_topk"] = known
        elif remembered is not None:
            remembered.keep(moved, captured["target_topk"])
        return captured

    prompts = [prompt_of(held_out[i]) for i in range(min(num_prompts, len(held_out)))]
    also = {}
    for name, folder in config.eval.also.items():
        splits = load_prepared(folder, target)
        if "eval" not in splits or len(splits["eval"]) == 0:
            raise DraftsmithError(f"eval.also.{name}: '{folder}' has no held-out (eval) split to validate on; prepare "
                                  "it with prepare.eval_fraction above 0.")
        also[name] = TokenDataset(splits["eval"])
    return TrainingData(
        train=train, eval=held_out, collate=lambda items: collate(items, pad_id=pad_id),
        add_features=add_features, prompts=prompts, topk_memory=remembered, also=also,
    )
