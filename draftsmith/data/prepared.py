"""`draftsmith prepare`: conversations -> a `datasets` folder of input_ids / loss_mask / length.

Layout of the output folder DIR:
  DIR/dataset/                  DatasetDict with splits "train" and "eval" (see `load_prepared`)
  DIR/prepare_report.json       counts plus every rejected row as {file, line, reason}
  DIR/token_counts.safetensors  frequency of each token id among trainable (loss-masked) train tokens
  DIR/regenerated.jsonl         (with --regenerate) responses written by the target, resumable
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.data.sources import read_rows
from draftsmith.data.templates import RowError, normalize_row, tokenize_conversation
from draftsmith.errors import DraftsmithError
from draftsmith.files import replace_folder, write_atomically

REPORT = "prepare_report.json"
TOKEN_COUNTS = "token_counts.safetensors"


@dataclass
class PrepareConfig:
    target: str = "smollm2-135m-instruct"
    """target model (hub id, folder, .gguf, or built-in alias) whose chat template and tokenizer to use"""
    input: list[str] = field(default_factory=lambda: ["builtin:stdlib"])
    """input files (.jsonl/.json/.parquet), saved `datasets` folders, hub dataset names, builtin:stdlib or
    builtin:stdlib-complete (the same functions as HumanEval-style stubs, for regeneration)"""
    out: str = "runs/data"
    """output folder"""
    max_length: int = 2048
    """cut conversations to this many tokens (counted as `truncated` in the report)"""
    last_turn_only: bool = False
    """train only on the last assistant turn of each conversation"""
    eval_fraction: float = 0.02
    """share of conversations held out as the eval split"""
    strict: bool = False
    """stop at the first bad row instead of reporting it and going on"""
    max_rows: int = 0
    """use at most this many rows (after reading all inputs in order; 0 = all)"""
    seed: int = 0
    """seed of the train/eval split and of sampled regeneration"""
    regenerate: bool = False
    """rewrite every assistant turn with the target itself (the original is kept alongside)"""
    temperature: float = 0.0
    """regeneration temperature (0 = greedy)"""
    max_new_tokens: int = 256
    """regeneration: longest response the target may write"""
    batch_size: int = 16
    """regeneration: conversations generated together"""
    dtype: str = "float32"
    """dtype the target runs in for regeneration (bf16 is about 2x faster on CPU)"""
    draft_vocab_size: int = 0
    """also build a draft vocabulary of this many tokens (0 = later, from token_counts.safetensors)"""

    def validate(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise DraftsmithError(f"--eval-fraction must be in [0, 1), got {self.eval_fraction}.")
        if self.max_length < 2:
            raise DraftsmithError(f"--max-length must be at least 2, got {self.max_length}.")
        if not self.input:
            raise DraftsmithError("prepare needs at least one --input.")


# --------------------------------------------------------------------------- reading + checking rows
class _Rejections:
    """Collects bad rows; in strict mode the first one stops the run."""

    def __init__(self, strict: bool):
        self.strict, self.items = strict, []

    def add(self, source: str, line: int, reason: str) -> None:
        if self.strict:
            raise DraftsmithError(f"{source}:{line}: {reason}. (--strict stops at the first bad row; "
                                  "drop --strict to report bad rows and go on.)")
        self.items.append({"file": source, "line": line, "reason": reason})


def read_conversations(inputs: list[str], rejections: _Rejections, max_rows: int = 0):
    """All rows of all inputs, normalised; returns (rows_read, [(source, line, messages)])."""
    rows_read, kept = 0, []
    for spec in inputs:
        for source, line, row in read_rows(spec):
            if max_rows and rows_read >= max_rows:
                break
            rows_read += 1
            try:
                if isinstance(row, RowError):
                    raise row
                kept.append((source, line, normalize_row(row)))
            except RowError as err:
                rejections.add(source, line, str(err))
    return rows_read, kept


# --------------------------------------------------------------------------- the command
def prepare(config: PrepareConfig, target=None) -> dict:
    """Run the whole prepare step; returns the report that is also written to DIR/prepare_report.json."""
    import datasets

    if target is None:
        from draftsmith.target import load_target

        target = load_target(config.target, dtype=config.dtype)
    target.require_chat_template()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    rejections = _Rejections(config.strict)
    rows_read, rows = read_conversations(config.input, rejections, config.max_rows)
    if not rows:
        raise DraftsmithError(f"No usable rows in {', '.join(config.input)}: all {rows_read} were rejected "
                              f"(first reason: {rejections.items[0]['reason'] if rejections.items else 'none'}).")
    originals = None
    if config.regenerate:
        from draftsmith.data.regenerate import regenerate_conversations

        originals = [messages for _, _, messages in rows]
        regenerated = regenerate_conversations(
            target, [(f"{s}:{l}", m) for s, l, m in rows], out / "regenerated.jsonl",
            temperature=config.temperature, max_new_tokens=config.max_new_tokens,
            batch_size=config.batch_size, seed=config.seed, last_turn_only=config.last_turn_only,
        )
        rows = [(s, l, m) for (s, l, _), m in zip(rows, regenerated)]

    columns, truncated = tokenize_rows(rows, originals, target.tokenizer, config, rejections)
    if not columns["input_ids"]:
        raise DraftsmithError("Every row was rejected; see the reasons with --strict or in the report.")

    train_idx, eval_idx = split_indices(len(columns["input_ids"]), config.eval_fraction, config.seed)
    table = datasets.Dataset.from_dict(columns)
    dataset = datasets.DatasetDict({"train": table.select(train_idx), "eval": table.select(eval_idx)})
    _save_dataset(dataset, out / "dataset")

    counts = count_trainable_tokens(dataset["train"], target.vocab_size)  # t2d is bool[V] of the target
    save_token_counts(out, counts)
    report = {
        "target": target.fingerprint(),
        "inputs": list(config.input),
        "rows_read": rows_read,
        "rows_kept": len(columns["input_ids"]),
        "rows_rejected": len(rejections.items),
        "train_rows": len(train_idx),
        "eval_rows": len(eval_idx),
        "tokens": int(sum(columns["length"])),
        "trainable_tokens": int(sum(sum(m) for m in columns["loss_mask"])),
        "truncated": truncated,
        "regenerated": config.regenerate,
        "max_length": config.max_length,
        "last_turn_only": config.last_turn_only,
        "draft_vocab_size": config.draft_vocab_size or None,
        "draft_vocab_coverage": None,
        "rejected": rejections.items,
    }
    try:
        if config.draft_vocab_size:
            from draftsmith.data.vocab import build_draft_vocab, save_draft_vocab

            vocab = build_draft_vocab(counts, config.draft_vocab_size)
            save_draft_vocab(out, vocab)
            report["draft_vocab_coverage"] = vocab.coverage
    finally:  # the report is written even when the vocabulary size is refused
        write_atomically(out / REPORT, json.dumps(report, indent=2, ensure_ascii=False))
    return report


def tokenize_rows(rows, originals, tokenizer, config: PrepareConfig, rejections: _Rejections):
    """Columns of the prepared table (rows that fail are reported, not dropped silently); truncated count."""
    from tqdm.auto import tqdm

    columns = {"input_ids": [], "loss_mask": [], "length": [], "source": [], "line": [], "messages": []}
    if originals is not None:
        columns["original_messages"] = []
    truncated = 0
    for index, (source, line, messages) in enumerate(tqdm(rows, desc="tokenize", unit="conv", mininterval=1.0)):
        try:
            tokens = tokenize_conversation(tokenizer, messages, config.max_length, config.last_turn_only)
        except RowError as err:
            rejections.add(source, line, str(err))
            continue
        truncated += tokens.truncated
        for key, value in (("input_ids", tokens.input_ids), ("loss_mask", tokens.loss_mask),
                           ("length", len(tokens.input_ids)), ("source", source), ("line", line),
                           ("messages", json.dumps(messages, ensure_ascii=False))):
            columns[key].append(value)
        if originals is not None:
            columns["original_messages"].append(json.dumps(originals[index], ensure_ascii=False))
    return columns, truncated


def split_indices(n: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic train/eval split; eval gets round(n * fraction) rows (at least 1 if fraction > 0 and n > 1)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_eval = round(n * eval_fraction)
    if eval_fraction > 0 and n > 1:
        n_eval = max(1, min(n_eval, n - 1))
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def count_trainable_tokens(split, vocab_size: int) -> torch.Tensor:
    """How often each token id appears among loss-masked tokens of a split -> LongTensor[vocab_size]."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in zip(split["input_ids"], split["loss_mask"]):
        ids, mask = torch.tensor(ids), torch.tensor(mask, dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def save_token_counts(out: Path, counts: torch.Tensor) -> None:
    """Write DIR/token_counts.safetensors (atomically)."""
    from safetensors.torch import save_file

    tmp = out / (TOKEN_COUNTS + ".tmp")
    save_file({"counts": counts}, str(tmp))
    os.replace(tmp, out / TOKEN_COUNTS)


def load_token_counts(data_dir: str | Path) -> torch.Tensor:
    """Token frequencies among trainable tokens, as written by prepare."""
    from safetensors.torch import load_file

    path = Path(data_dir) / TOKEN_COUNTS
    if not path.is_file():
        raise DraftsmithError(f"'{path}' is missing; run `draftsmith prepare` to create {data_dir}.")
    return load_file(str(path))["counts"]


def load_prepared(data_dir: str | Path):
    """The prepared data: a `datasets.DatasetDict` with "train"/"eval" and input_ids, loss_mask, length."""
    import datasets

    path = Path(data_dir) / "dataset"
    if not (path / "dataset_dict.json").is_file():
        raise DraftsmithError(f"'{data_dir}' is not a prepared data folder (no dataset/ inside). "
                              "Create it with `draftsmith prepare --out DIR`.")
    return datasets.load_from_disk(str(path))


def _save_dataset(dataset, path: Path) -> None:
    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    # at least one shard per split: `datasets` cannot reload a split saved as zero shards (eval_fraction=0)
    shards = {name: max(1, -(-split.data.nbytes // 500_000_000)) for name, split in dataset.items()}
    dataset.save_to_disk(str(staging), num_shards=shards)
    replace_folder(staging, path)
