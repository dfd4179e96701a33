"""Regeneration: every assistant turn rewritten by the target itself, batched, resumable after kill -9.

Drafters learn the target's own distribution, so training on the target's responses (not the
dataset's) raises acceptance. Conversations are answered on-policy: in a batch, turn 1 of every
conversation is written first, then turn 2 of those that have one, given the target's own turn 1,
and so on, so no answer follows a dataset answer. Turns holding `PENDING` (prompt-only corpora such
as builtin:general) exist only to be written; a dataset turn the target answers with nothing keeps
its text.

Finished conversations are appended to a jsonl cache, one line per conversation (all its turns),
flushed and fsync'ed after every batch. Batches are fixed by the whole input, not by what is left:
rows sorted by size, cut every `batch_size`, batch i sampled with seed + i * batch_size. On restart
the cache is read, a torn last line (a kill in the middle of a write) is cut off, and every batch
with a row missing from the cache is generated again as a whole, writing only the missing rows: a
resumed run writes what an uninterrupted one writes, and every conversation is in the cache once.

A time budget (`max_seconds`, prepare.max_minutes) lets the machine decide how much is written: the same batches
are then generated in an order shuffled by the seed (so the answered rows are a sample of every input and size, not
the shortest prompts), and the batch that spends the budget is the last. The seconds spent are kept beside the cache
(CACHE.budget.json, written atomically after every batch), so a resumed run counts the time already spent and, once
the budget is spent, writes nothing more: it returns the rows answered, None for the others.

With prepare.engine = vllm the answers' tokens are written by vLLM (`regenerate_engine.EngineWriter`, in the engine's
own venv) instead of our loop; everything else above is this module's, unchanged: the prompts' token ids (chat
template applied here), the text of the answers (decoded here), the turn order, the batches, the cache and the budget.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomically

# The content of an assistant turn that only the target writes (prompt-only corpora such as builtin:general).
PENDING = "(the target writes this answer: prepare with --regenerate)"


def read_cache(path: Path) -> dict[str, list[dict]]:
    """Finished conversations by key; cuts a torn last line off the file."""
    done: dict[str, list[dict]] = {}
    if not path.is_file():
        return done
    good_bytes = 0
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                break
            done[entry["key"]] = entry["messages"]
            good_bytes += len(raw)
    if good_bytes != path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(good_bytes)
    return done


def regenerate_conversations(
    target,
    rows: list[tuple[str, list[dict]]],
    cache_path: Path,
    temperature: float = 0.0,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    seed: int = 0,
    chat_template: str | None = None,
    max_seconds: float = 0.0,
    engine=None,
) -> list:
    """Rewrite every assistant turn (or completion) of `rows` [(key, record)] with the target; returns records (None
    for a row a spent `max_seconds` budget left unanswered; 0 = no budget). With prepare's last_turn_only, only the
    last turn trains, but the turns before it are the target's own too. `engine`: writes the answers' tokens instead
    of our loop (`regenerate_engine.EngineWriter`, vLLM); the rows, batches, order, cache and budget are the same."""
    from tqdm.auto import tqdm

    keys = [key for key, _ in rows]
    if len(set(keys)) != len(keys):
        raise DraftsmithError("Regeneration needs unique row keys (file:line); an input was given twice.")
    done = read_cache(cache_path)
    # Similar prompt lengths together: less padding per batch. A stable sort of all rows: the same batches on resume.
    ordered = sorted(rows, key=lambda row: _size(row[1]))
    starts = list(range(0, len(ordered), batch_size))
    budget = _Budget(cache_path, max_seconds)
    if max_seconds:  # a budget may end it anywhere: batches in a seeded order, so any prefix samples every size
        random.Random(seed).shuffle(starts)
    bar = tqdm(total=len(rows), initial=sum(key in done for key in keys), unit="conv",
               desc="regenerate" + (f" (budget {max_seconds / 60:g} min)" if max_seconds else ""))
    with open(cache_path, "a", encoding="utf-8") as cache:
        for start in starts:
            batch = ordered[start:start + batch_size]
            missing = [key not in done for key, _ in batch]
            if not any(missing):
                continue
            if budget.spent():
                bar.write(f"regeneration stopped: its budget of {max_seconds / 60:g} min is spent "
                          f"({sum(key in done for key in keys)} of {len(rows)} rows answered)")
                break
            began = time.perf_counter()
            torch.manual_seed(seed + start)
            new = regenerate_batch(target, [m for _, m in batch], temperature, max_new_tokens, chat_template,
                                   engine=engine)
            for (key, _), messages, write in zip(batch, new, missing):
                if write:
                    cache.write(json.dumps({"key": key, "messages": messages}, ensure_ascii=False) + "\n")
                    done[key] = messages
            cache.flush()
            os.fsync(cache.fileno())
            budget.add(time.perf_counter() - began)
            bar.update(sum(missing))
    bar.close()
    return [done.get(key) for key in keys]


class _Budget:
    """Seconds of regeneration spent, counted across resumes in CACHE.budget.json (none without a budget)."""

    def __init__(self, cache_path: Path, max_seconds: float):
        self.path = cache_path.with_name(cache_path.name + ".budget.json")
        self.max_seconds = max_seconds
        self.seconds = json.loads(self.path.read_text())["seconds"] if max_seconds and self.path.is_file() else 0.0

    def spent(self) -> bool:
        return bool(self.max_seconds) and self.seconds >= self.max_seconds

    def add(self, seconds: float) -> None:
        if self.max_seconds:
            self.seconds += seconds
            write_atomically(self.path, json.dumps({"seconds": self.seconds, "max_seconds": self.max_seconds}))


def _size(record) -> int:
    if isinstance(record, dict):  # a completion
        return len(record["prompt"]) + len(record["completion"])
    return len(record[0]["content"]) + len(record[-1]["content"])


def regenerate_batch(target, records, temperature, max_new_tokens, chat_template=None, engine=None):
    """One batch: completions answered from their prompts, and assistant turn k of every conversation generated
    together, k = 0, 1, ..., each given the target's own turns before it (by `engine` when one is given)."""
    answer = functools.partial(generate, engine=engine) if engine is not None else generate
    records = [dict(r) if isinstance(r, dict) else [dict(m) for m in r] for r in records]
    completions = [r for r in records if isinstance(r, dict)]
    if completions:
        texts = answer(target, [r["prompt"] for r in completions], temperature, max_new_tokens, strip=False)
        for record, text in zip(completions, texts):
            if text.strip():  # an empty answer keeps the original completion
                record["completion"] = text
    conversations = [r for r in records if not isinstance(r, dict)]
    turns = [[i for i, m in enumerate(c) if m["role"] == "assistant"] for c in conversations]
    for k in range(max((len(t) for t in turns), default=0)):
        todo = [(c, t[k]) for c, t in zip(conversations, turns) if k < len(t)]
        prompts = [c[:turn] for c, turn in todo]
        for (conversation, turn), text in zip(todo, answer(target, prompts, temperature, max_new_tokens,
                                                           chat_template)):
            # an empty answer keeps a dataset turn's text; a pending turn has none to keep
            if text.strip() or conversation[turn]["content"] == PENDING:
                conversation[turn]["content"] = text
    return records


def generate(target, prompts: list, temperature: float, max_new_tokens: int, chat_template: str | None = None,
             strip: bool = True, engine=None) -> list[str]:
    """Responses of the target to chat prompts (message lists) or raw text prompts. Prompts are tokenized as the
    target's own generation sees them (`encode_prompt`); a response ends at the tokenizer's EOS or after
    `max_new_tokens` tokens. The tokens are written by our batched loop (`write_tokens`), or by `engine` from the
    same token ids, with seeds drawn from torch's generator (seeded per batch, as our sampling is)."""
    from draftsmith.data.templates import encode_prompt

    tokenizer = target.tokenizer
    encoded = [encode_prompt(tokenizer, prompt, chat_template) for prompt in prompts]
    if engine is None:
        written = write_tokens(target, encoded, temperature, max_new_tokens)
    else:
        seeds = torch.randint(0, 2**31 - 1, (len(encoded),)).tolist()
        written = engine.write(encoded, temperature, max_new_tokens, tokenizer.eos_token_id, seeds)
    texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in written]
    return [text.strip() for text in texts] if strip else texts


@torch.no_grad()
def write_tokens(target, encoded: list[list[int]], temperature: float, max_new_tokens: int) -> list[list[int]]:
    """Our loop: the answers' token ids (EOS included where written) to prompts given as token ids, batched with
    left padding.

    A row leaves the batch, cache rows included, as soon as it ends, so every forward computes only the rows still
    writing: a batch costs what its live rows cost, not `max_new_tokens` steps of all of them (transformers'
    `generate` keeps finished rows to the end). Greedy output is that of `generate` (the same positions and masks)."""
    from transformers import DynamicCache

    from draftsmith.sampling import Sampling, choose

    tokenizer, model, device = target.tokenizer, target.model, target.device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    width = max(map(len, encoded))
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each prompt starts at position 0
    sampling = Sampling(temperature=max(temperature, 0.0))
    cache = DynamicCache(config=model.config)
    # the prompt's last position only: logits at every prompt position cost a vocabulary-wide product per token
    # (49152 x 576 for SmolLM2, a quarter of its work per token) and B x L x V floats: 12 GB for 64 rows of 1000
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1]
    live = torch.arange(len(encoded))  # the prompt of each batch row
    written: list[list[int]] = [[] for _ in encoded]
    position = positions[:, -1]
    for step in range(max_new_tokens):
        token = choose(logits.float().cpu(), sampling)
        for row, value in zip(live.tolist(), token.tolist()):
            written[row].append(value)
        going = token != eos if eos is not None else torch.ones_like(token, dtype=torch.bool)
        if step == max_new_tokens - 1 or not bool(going.any()):
            break
        if not bool(going.all()):  # finished rows leave the batch and the cache
            keep = going.nonzero().flatten()
            cache.batch_select_indices(keep.to(device))
            live, token, mask, position = live[keep], token[keep], mask[keep.to(device)], position[keep.to(device)]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], -1)
        position = position + 1
        logits = model(input_ids=token[:, None].to(device), attention_mask=mask, position_ids=position[:, None],
                       cache=cache, use_cache=True).logits[:, -1]
    return written
