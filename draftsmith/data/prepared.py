"""`draftsmith prepare`: conversations -> a `datasets` folder of input_ids / loss_mask / length.

Layout of the output folder DIR:
  DIR/dataset/                  DatasetDict with splits "train" and "eval" (see `load_prepared`)
  DIR/prepare_report.json       counts, the corpus's diversity (data/diversity.py: distinct n-grams, languages,
                                lengths, per input and overall), every rejected row as {file, line, reason}
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
from typing import Literal

import torch

from draftsmith.data.diversity import corpus_diversity
from draftsmith.data.regenerate_engine import ENGINES
from draftsmith.data.sources import read_rows
from draftsmith.data.templates import RowError, is_completion, normalize_row, resolve_chat_template, tokenize_record
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
    builtin:stdlib-complete (the same functions as HumanEval-style stubs, for regeneration) or builtin:exercises
    (typed exercises with worked examples, in a code benchmark's prompt shape; for regeneration)"""
    out: str = "runs/data"
    """output folder"""
    max_length: int = 2048
    """cut conversations to this many tokens (counted as `truncated` in the report)"""
    last_turn_only: bool = False
    """train only on the last assistant turn of each conversation (with regenerate, the turns before it are still
    the target's own answers: every turn is written on-policy)"""
    eval_fraction: float = 0.02
    """share of conversations held out as the eval split"""
    strict: bool = False
    """stop at the first bad row instead of reporting it and going on"""
    max_rows: int = 0
    """use at most this many rows (after reading all inputs in order; 0 = all)"""
    max_rows_per_input: int = 0
    """use at most this many rows of each input, its first ones (0 = all): a mix of several inputs in set
    shares, e.g. 256 exercises and 256 standard-library stubs"""
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
    max_minutes: float = 0.0
    """regeneration: wall-clock budget (0 = none, every row is answered). With one, batches go in an order shuffled
    by the seed and the batch that spends it is the last, so a faster machine answers more rows of every input;
    rows left unanswered are left out (rows_unanswered in the report). Counted across resumes"""
    dtype: str = "auto"
    """dtype the target runs in while it regenerates (a copy when the loaded target has another): float32,
    bfloat16, float16, or auto = bfloat16 for a float32 target on a CPU where bf16 measures faster (AMX: 1.76x
    in bench/studies/data_dtype.py), else the target's own"""
    engine: str | None = None
    """regeneration: 'vllm' writes the answers with vLLM's CPU build (`make engine`'s .venv-engine, run as a
    subprocess) instead of draftsmith's batched loop; the same rows, chat template, turn order, greedy decoding or
    seeds, max_new_tokens, batches, budget and resumable cache (null = draftsmith's loop)"""
    engine_eager: bool = False
    """with engine: run vLLM without torch.compile (loads faster, decodes slower)"""
    draft_vocab_size: int | Literal["auto"] = 0
    """also build a draft vocabulary of this many tokens (0 = later, from token_counts.safetensors), or auto = the
    smallest size of 1024, 2048, ..., 32768 whose held-out coverage (the share of the target's own answer tokens to
    held-out prompts that it holds) reaches draft_vocab_coverage_target in every category of draft_vocab_prompts.
    When the training split holds fewer distinct trainable tokens (a small input, or a regeneration budget that
    answered few rows), the vocabulary holds all of them and the report says so (draft_vocab_size against
    _requested). Either way the report holds the held-out coverage curve (draft_vocab.curve)"""
    draft_vocab_coverage_target: float = 0.95
    """draft_vocab_size auto: the held-out coverage every category must reach"""
    draft_vocab_prompts: list[str] = field(default_factory=lambda: ["builtin:suite", "builtin:handwritten"])
    """held-out prompt sets whose categories the draft vocabulary's coverage is measured on (eval's --prompts
    names: builtin:suite, builtin:handwritten, humaneval or a jsonl file)"""
    draft_vocab_prompts_per_category: int = 3
    """the first rows of each category of each prompt set the target answers to measure coverage (0 = none: the
    eval split only; auto needs some)"""
    draft_vocab_answer_tokens: int = 64
    """longest greedy answer the target writes to each held-out prompt for the coverage measurement"""
    chat_template: str | None = None
    """chat template for conversation rows, as a Jinja string or a file holding one (null = the target's own;
    needed for a base model without one, unless the rows are plain text: {"text"} or {"prompt", "completion"})"""

    def validate(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise DraftsmithError(f"--eval-fraction must be in [0, 1), got {self.eval_fraction}.")
        if self.max_length < 2:
            raise DraftsmithError(f"--max-length must be at least 2, got {self.max_length}.")
        if not self.input:
            raise DraftsmithError("prepare needs at least one --input.")
        if self.max_minutes < 0:
            raise DraftsmithError(f"--max-minutes is a budget in minutes (0 = none), got {self.max_minutes}.")
        if self.engine is not None and self.engine not in ENGINES:
            raise DraftsmithError(f"--engine {self.engine}: regeneration's engines are {', '.join(ENGINES)} "
                                  "(leave it unset for draftsmith's own loop).")
        if self.engine and not self.regenerate:
            raise DraftsmithError(f"--engine {self.engine} writes regenerated answers: it needs --regenerate "
                                  "(prepare.regenerate: true).")
        if self.draft_vocab_size != "auto" and self.draft_vocab_size < 0:
            raise DraftsmithError(f"--draft-vocab-size counts tokens (0 = no vocabulary now) or is auto, got "
                                  f"{self.draft_vocab_size}.")
        if self.draft_vocab_size == "auto" and not (self.draft_vocab_prompts
                                                    and self.draft_vocab_prompts_per_category > 0):
            raise DraftsmithError("--draft-vocab-size auto chooses by coverage of held-out prompts: it needs "
                                  "--draft-vocab-prompts and --draft-vocab-prompts-per-category above 0.")
        if not 0.0 < self.draft_vocab_coverage_target <= 1.0:
            raise DraftsmithError(f"--draft-vocab-coverage-target is a share in (0, 1], got "
                                  f"{self.draft_vocab_coverage_target}.")
        if self.draft_vocab_prompts_per_category < 0 or self.draft_vocab_answer_tokens < 1:
            raise DraftsmithError("--draft-vocab-prompts-per-category counts rows (0 = none) and "
                                  "--draft-vocab-answer-tokens tokens (at least 1), got "
                                  f"{self.draft_vocab_prompts_per_category} and {self.draft_vocab_answer_tokens}.")
        if self.max_rows < 0 or self.max_rows_per_input < 0:
            raise DraftsmithError(f"--max-rows and --max-rows-per-input count rows (0 = all), got {self.max_rows} "
                                  f"and {self.max_rows_per_input}.")


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


def read_conversations(inputs: list[str], rejections: _Rejections, max_rows: int = 0, max_rows_per_input: int = 0):
    """All rows of all inputs (the first `max_rows_per_input` of each, the first `max_rows` in all; 0 = no cap),
    normalised; returns (rows_read, [(source, line, record)]), where a record is a conversation (list of messages)
    or a completion ({"prompt", "completion"})."""
    rows_read, kept = 0, []
    for spec in inputs:
        for from_input, (source, line, row) in enumerate(read_rows(spec)):
            if (max_rows and rows_read >= max_rows) or (max_rows_per_input and from_input >= max_rows_per_input):
                break
            rows_read += 1
            try:
                if isinstance(row, RowError):
                    raise row
                kept.append((source, line, normalize_row(row)))
            except RowError as err:
                rejections.add(source, line, str(err))
    return rows_read, kept


def _refuse_unwritten_answers(rows) -> None:
    """Prompt-only inputs (builtin:general) hold answers only the target can write: refuse to train on their
    placeholders without regeneration."""
    from draftsmith.data.regenerate import PENDING

    for source, line, record in rows:
        if not is_completion(record) and any(m["role"] == "assistant" and m["content"] == PENDING for m in record):
            raise DraftsmithError(f"{source}:{line}: this row holds prompts only (its answers are for the target to "
                                  "write): prepare it with regeneration (prepare.regenerate=true, or "
                                  "`draftsmith prepare --regenerate`).")


# --------------------------------------------------------------------------- the command
def prepare(config: PrepareConfig, target=None) -> dict:
    """Run the whole prepare step; returns the report that is also written to DIR/prepare_report.json."""
    import time

    import datasets

    began = time.monotonic()
    if config.regenerate and config.engine:  # a missing engine venv fails now, not after loading the target
        from draftsmith.engine_process import engine_python

        engine_python("prepare.engine (--engine vllm)")
    if target is None:
        from draftsmith.target import load_target, working_dtype

        target = load_target(config.target, dtype=working_dtype(config.dtype))
    chat_template = resolve_chat_template(config.chat_template, "prepare.chat_template (--chat-template)")
    out = Path(config.out)
    rejections = _Rejections(config.strict)
    rows_read, rows = read_conversations(config.input, rejections, config.max_rows, config.max_rows_per_input)
    if not rows:
        raise DraftsmithError(f"No usable rows in {', '.join(config.input)}: all {rows_read} were rejected "
                              f"(first reason: {rejections.items[0]['reason'] if rejections.items else 'none'}).")
    if any(not is_completion(record) for _, _, record in rows):
        target.require_chat_template(chat_template)
    if not config.regenerate:
        _refuse_unwritten_answers(rows)
    out.mkdir(parents=True, exist_ok=True)
    originals, unanswered = None, 0
    if config.regenerate:
        from draftsmith.data.regenerate import regenerate_conversations
        from draftsmith.target import in_dtype, working_dtype

        rows = _drop_unprompted(rows, rejections)
        originals = [record for _, _, record in rows]
        writer = in_dtype(target, working_dtype(config.dtype, target))
        with _engine(config, writer, out) as engine:
            regenerated = regenerate_conversations(
                writer, [(f"{s}:{l}", m) for s, l, m in rows], out / "regenerated.jsonl",
                temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                batch_size=config.batch_size, seed=config.seed, chat_template=chat_template,
                max_seconds=config.max_minutes * 60, engine=engine,
            )
        answered = [i for i, m in enumerate(regenerated) if m is not None]  # a spent budget leaves the rest out
        unanswered = len(rows) - len(answered)
        originals = [originals[i] for i in answered]
        rows = [(rows[i][0], rows[i][1], regenerated[i]) for i in answered]

    columns, truncated = tokenize_rows(rows, originals, target.tokenizer, config, rejections, chat_template)
    if not columns["input_ids"]:
        raise DraftsmithError("Every row was rejected; see the reasons with --strict or in the report.")

    train_idx, eval_idx = split_indices(len(columns["input_ids"]), config.eval_fraction, config.seed)
    table = datasets.Dataset.from_dict(columns)
    dataset = datasets.DatasetDict({"train": table.select(train_idx), "eval": table.select(eval_idx)})
    counts = count_trainable_tokens(dataset["train"], target.vocab_size)  # t2d is bool[V] of the target
    vocab, held_out = None, None
    if config.draft_vocab_size:
        from draftsmith.data.vocab import build_draft_vocab

        held_out = _held_out_coverage(config, target, counts, dataset["eval"], chat_template)
        vocab = build_draft_vocab(counts, held_out["size"], key="prepare.draft_vocab_size (--draft-vocab-size)")
    report = {
        "target": target.fingerprint(),
        "chat_template_sha256": None if all(is_completion(r) for _, _, r in rows) else template_sha256(target, chat_template),
        "inputs": list(config.input),
        "rows_read": rows_read,
        "max_rows_per_input": config.max_rows_per_input or None,
        "rows_kept": len(columns["input_ids"]),
        "rows_rejected": len(rejections.items),
        "rows_unanswered": unanswered,
        "train_rows": len(train_idx),
        "eval_rows": len(eval_idx),
        "tokens": int(sum(columns["length"])),
        "trainable_tokens": int(sum(sum(m) for m in columns["loss_mask"])),
        "truncated": truncated,
        "regenerated": config.regenerate,
        "regenerated_in": str(writer.dtype).removeprefix("torch.") if config.regenerate else None,
        "regenerated_by": (config.engine or "draftsmith") if config.regenerate else None,
        "max_length": config.max_length,
        "last_turn_only": config.last_turn_only,
        "draft_vocab_size": vocab.size if vocab is not None else None,
        "draft_vocab_size_requested": config.draft_vocab_size or None,
        # the held-out share (the target's answers to prompts of every category); the training split's own share
        # reads 1.0 on a small split, so it is kept only under its own name
        "draft_vocab_coverage": held_out["coverage"] if held_out else None,
        "draft_vocab_train_coverage": vocab.coverage if vocab is not None else None,
        "draft_vocab": held_out,
        "diversity": corpus_diversity(columns, config.seed),
        "seconds": round(time.monotonic() - began, 1),  # this call's wall time, the target's loading included
        "rejected": rejections.items,
    }
    _publish(out, dataset, counts, vocab, report, target.fingerprint())
    return report


def _held_out_coverage(config: PrepareConfig, target, counts: torch.Tensor, eval_split, chat_template) -> dict:
    """The draft vocabulary's size and its held-out coverage curve (data/vocab_coverage.py), with what was answered
    and the seconds the target spent answering."""
    import time

    from draftsmith.data.vocab_coverage import eval_split_answers, held_out_report, prompt_set_answers

    began = time.monotonic()
    prompts = {}
    if config.draft_vocab_prompts_per_category:
        prompts = prompt_set_answers(target, config.draft_vocab_prompts, config.draft_vocab_prompts_per_category,
                                     config.draft_vocab_answer_tokens, config.batch_size, chat_template)
    evals = eval_split_answers(target, eval_split, config.regenerate, config.draft_vocab_answer_tokens,
                               config.batch_size, max_rows=32) if len(eval_split) else {}
    _, report = held_out_report(counts, prompts, evals, config.draft_vocab_size, config.draft_vocab_coverage_target)
    return {**report, "prompt_sets": list(config.draft_vocab_prompts) if prompts else [],
            "prompts_per_category": config.draft_vocab_prompts_per_category,
            "eval_split": ("its regenerated answers" if config.regenerate else
                           f"the target's greedy answers to its first {min(32, len(eval_split))} rows' prompts")
            if len(eval_split) else None,
            "seconds": round(time.monotonic() - began, 1)}


def _engine(config: PrepareConfig, writer, out: Path):
    """The engine that writes the answers (closed after regeneration), or a null context for our own loop. vLLM
    runs the target in the dtype our loop would have (`writer`'s), so greedy answers compare."""
    import contextlib

    if not config.engine:
        return contextlib.nullcontext()
    from draftsmith.data.regenerate_engine import EngineWriter

    return EngineWriter(config.target, str(writer.dtype).removeprefix("torch."), out, eager=config.engine_eager)


def _publish(out: Path, dataset, counts: torch.Tensor, vocab, report: dict, fingerprint: dict) -> None:
    """Write the prepared folder so that it looks finished only when it is: the completion mark (the
    report) goes first and comes back last, each file is written atomically, so a crash in between
    leaves a folder that the next run prepares again, never a mix of old and new that looks complete."""
    (out / REPORT).unlink(missing_ok=True)
    _save_dataset(dataset, out / "dataset")
    save_token_counts(out, counts)
    if vocab is not None:
        from draftsmith.data.vocab import save_draft_vocab

        save_draft_vocab(out, vocab, target=fingerprint)
    else:  # a vocabulary left from an earlier prepare of this folder no longer matches the data
        from draftsmith.data.vocab import VOCAB_FILE

        (out / VOCAB_FILE).unlink(missing_ok=True)
    write_atomically(out / REPORT, json.dumps(report, indent=2, ensure_ascii=False))


def _drop_unprompted(rows, rejections: _Rejections):
    """Regeneration needs something to answer: plain {"text"} rows have no prompt, so they are rejected."""
    kept = []
    for source, line, record in rows:
        if is_completion(record) and not record["prompt"].strip():
            rejections.add(source, line, "a {\"text\"} row has no prompt to regenerate an answer for; use "
                           "{\"prompt\", \"completion\"} rows or drop --regenerate")
        else:
            kept.append((source, line, record))
    if not kept:
        raise DraftsmithError("--regenerate (prepare.regenerate) has no row with a prompt to answer: every row is "
                              "plain {\"text\"}. Use {\"prompt\", \"completion\"} rows or conversations.")
    return kept


def template_sha256(target, chat_template: str | None) -> str:
    """Hash of the chat template conversations are rendered with: `chat_template` or else the target's own."""
    import hashlib

    template = chat_template or target.tokenizer.chat_template
    return hashlib.sha256(str(template).encode()).hexdigest()


def check_prepared_target(data_dir: str | Path, target) -> dict:
    """The prepare report of `data_dir`, after checking that its tokens fit `target` (same tokenizer; for
    regenerated data also the same model, whose answers they are). Raises naming both targets."""
    from draftsmith.target import fingerprint_mismatch

    path = Path(data_dir) / REPORT
    if not path.is_file():
        raise DraftsmithError(f"'{data_dir}' has no {REPORT}, so it is not a finished `draftsmith prepare` folder "
                              "(a prepare that stopped part-way leaves none). Run prepare again.")
    report = json.loads(path.read_text())
    why = fingerprint_mismatch(report.get("target"), target.fingerprint(),
                               model=bool(report.get("regenerated")))
    if why:
        raise DraftsmithError(
            f"The prepared data in '{data_dir}' cannot be used with target '{target.name}': {why}. Prepare it "
            f"again for this target into another folder (recipes: data.prepared, e.g. runs/{{target}}/data), or "
            "delete that folder.")
    return report


def tokenize_rows(rows, originals, tokenizer, config: PrepareConfig, rejections: _Rejections,
                  chat_template: str | None = None):
    """Columns of the prepared table (rows that fail are reported, not dropped silently); truncated count."""
    from tqdm.auto import tqdm

    columns = {"input_ids": [], "loss_mask": [], "length": [], "source": [], "line": [], "messages": []}
    if originals is not None:
        columns["original_messages"] = []
    truncated = 0
    for index, (source, line, messages) in enumerate(tqdm(rows, desc="tokenize", unit="conv", mininterval=1.0)):
        try:
            tokens = tokenize_record(tokenizer, messages, config.max_length, config.last_turn_only, chat_template)
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


def load_prepared(data_dir: str | Path, target=None):
    """The prepared data: a `datasets.DatasetDict` with "train"/"eval" and input_ids, loss_mask, length.

    With `target`, first checks that the data was prepared for it (`check_prepared_target`)."""
    import datasets

    path = Path(data_dir) / "dataset"
    if not (path / "dataset_dict.json").is_file():
        raise DraftsmithError(f"'{data_dir}' is not a prepared data folder (no dataset/ inside). "
                              "Create it with `draftsmith prepare --out DIR`.")
    if target is not None:
        check_prepared_target(data_dir, target)
    return datasets.load_from_disk(str(path))


def _save_dataset(dataset, path: Path) -> None:
    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    # at least one shard per split: `datasets` cannot reload a split saved as zero shards (eval_fraction=0)
    shards = {name: max(1, -(-split.data.nbytes // 500_000_000)) for name, split in dataset.items()}
    dataset.save_to_disk(str(staging), num_shards=shards)
    replace_folder(staging, path)
