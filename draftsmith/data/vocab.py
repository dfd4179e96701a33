"""Draft vocabulary (DESIGN §3): the N most frequent trainable target tokens.

`d2t[i] = used[i] - i` holds offsets (target_id = i + d2t[i], the convention EAGLE-3 checkpoints
and serving engines use); `t2d` is a bool[V] marking target tokens inside the draft vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError

VOCAB_FILE = "draft_vocab.safetensors"


@dataclass
class DraftVocab:
    """Offsets `d2t` [N], membership `t2d` [V], and the share of trainable tokens it covers."""

    d2t: torch.Tensor
    t2d: torch.Tensor
    coverage: float

    @property
    def size(self) -> int:
        return len(self.d2t)

    def target_ids(self) -> torch.Tensor:
        """Target token id of each draft id: i + d2t[i]."""
        return torch.arange(len(self.d2t)) + self.d2t


def checked_draft_vocab(draft_vocab: DraftVocab | None, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of a draft vocabulary for a target of `vocab_size` tokens, checked against each other; None = the
    full vocabulary (d2t zeros, t2d all true)."""
    if draft_vocab is None:
        return torch.zeros(vocab_size, dtype=torch.long), torch.ones(vocab_size, dtype=torch.bool)
    d2t, t2d = draft_vocab.d2t.long().cpu(), draft_vocab.t2d.bool().cpu()
    used = torch.arange(d2t.numel()) + d2t
    if t2d.numel() != vocab_size or not torch.equal(used, t2d.nonzero().flatten()):
        raise DraftsmithError(
            f"The draft vocabulary is inconsistent: t2d ({t2d.numel()} entries, target vocabulary {vocab_size}) must "
            f"mark exactly the tokens i + d2t[i] of its {d2t.numel()} entries. Rebuild it with `draftsmith prepare`.")
    return d2t, t2d


def build_draft_vocab(token_counts: torch.Tensor, size: int, key: str = "the draft vocabulary size") -> DraftVocab:
    """Top-`size` tokens by count (ties broken by lower id), sorted by target id. `key` names the option
    that set `size` in errors (e.g. the recipe key)."""
    token_counts = token_counts.long()
    distinct = int((token_counts > 0).sum())
    if size < 1:
        raise DraftsmithError(f"{key} must be positive, got {size}.")
    if size > distinct:
        raise DraftsmithError(
            f"A draft vocabulary of {size} tokens is larger than the {distinct} distinct trainable tokens "
            f"in the data. Set {key} to at most {distinct}, or 0 for none (or use more data)."
        )
    # stable sort on descending counts keeps lower ids first among equal counts
    order = torch.sort(-token_counts, stable=True).indices[:size]
    used = torch.sort(order).values
    t2d = torch.zeros(len(token_counts), dtype=torch.bool)
    t2d[used] = True
    total = int(token_counts.sum())
    coverage = float(token_counts[used].sum()) / total if total else 0.0
    return DraftVocab(d2t=used - torch.arange(size), t2d=t2d, coverage=coverage)


def save_draft_vocab(directory: str | Path, vocab: DraftVocab, target: dict | None = None) -> Path:
    """Write `draft_vocab.safetensors` (d2t, t2d) atomically, with size, coverage and the fingerprint of
    the `target` whose token ids it holds in its metadata."""
    import os

    from safetensors.torch import save_file

    path = Path(directory) / VOCAB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"size": str(vocab.size), "coverage": json.dumps(vocab.coverage)}
    if target is not None:
        metadata["target"] = json.dumps(target)
    staging = path.with_name(path.name + ".tmp")
    save_file({"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous()}, str(staging), metadata=metadata)
    os.replace(staging, path)
    return path


def load_draft_vocab(directory: str | Path, target=None) -> DraftVocab:
    """Read a draft vocabulary written by `save_draft_vocab` (a folder or the file itself); with `target`,
    refuse one built from another tokenizer's token ids."""
    from safetensors import safe_open

    path = Path(directory)
    path = path if path.suffix == ".safetensors" else path / VOCAB_FILE
    if not path.is_file():
        raise DraftsmithError(f"No draft vocabulary at '{path}'. Build one with `draftsmith prepare --draft-vocab-size N` "
                              "(recipes: prepare.draft_vocab_size), or set data.draft_vocab to null for a full head.")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        d2t, t2d = handle.get_tensor("d2t"), handle.get_tensor("t2d")
    if target is not None:
        _check_target(path, metadata, d2t, t2d, target)
    return DraftVocab(d2t=d2t, t2d=t2d, coverage=float(json.loads(metadata.get("coverage", "0"))))


def _check_target(path: Path, metadata: dict, d2t: torch.Tensor, t2d: torch.Tensor, target) -> None:
    from draftsmith.target import fingerprint_mismatch

    recorded = json.loads(metadata["target"]) if "target" in metadata else None
    why = fingerprint_mismatch(recorded, target.fingerprint(), model=False) if recorded else None
    if why is None and t2d.numel() != target.vocab_size:
        why = f"it covers a vocabulary of {t2d.numel()} tokens, target '{target.name}' has {target.vocab_size}"
    if why:
        raise DraftsmithError(f"The draft vocabulary '{path}' does not fit target '{target.name}': {why}. Prepare the "
                              "data again for this target (recipes: data.prepared and data.draft_vocab, e.g. "
                              "runs/{target}/data), or set data.draft_vocab to null for a full head.")
