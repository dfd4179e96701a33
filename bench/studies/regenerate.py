"""Benchmark: regeneration throughput of transformers' generate(), where finished rows stay in the batch until
the longest response ends, against draftsmith's loop (`draftsmith.data.regenerate.generate`), where a row leaves
the batch and its cache at its EOS. Same prompts, same batches, greedy, alternating which goes first per batch.

    OMP_NUM_THREADS=2 .venv/bin/python bench/studies/regenerate.py --rows 64 --batch-size 32 --max-new-tokens 192

Prompts: the first ROWS conversations of builtin:stdlib-complete (the recipes' regeneration input) up to their
assistant turn, sorted by size as `prepare --regenerate` sorts them. Prints conversations per minute of each, their
ratio, how many responses are identical, and the response lengths (the row dropping saves the steps a row would
spend padding after its EOS). Run it alone: it measures wall time.

Study, settled: `prepare --regenerate` runs draftsmith's own batched loop, not generate(). Measured on 2026-12-01
(alone; the machine kind was not recorded) with `--rows 64 --batch-size 32 --max-new-tokens 192`: 71.9 against 59.0
conversations/min, 1.22x, every response identical (64/64).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import regeneration_prompts  # noqa: E402
from draftsmith.data.regenerate import generate  # noqa: E402
from draftsmith.data.templates import encode_prompt  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

args = regeneration_prompts.parser(__doc__).parse_args()


@torch.no_grad()
def transformers_generate(target, prompts: list, max_new_tokens: int) -> list[str]:
    """The same batch through transformers' generate(): left padding, greedy, the tokenizer's EOS."""
    tokenizer = target.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    width = max(map(len, encoded))
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    output = target.model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                   pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, do_sample=False,
                                   temperature=None, top_k=None, top_p=None)
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in output[:, width:]]


target = load_target(args.target)
prompts = regeneration_prompts.prompts(args.rows)
methods = {"transformers generate()": lambda batch: transformers_generate(target, batch, args.max_new_tokens),
           "draftsmith (rows leave at EOS)": lambda batch: generate(target, batch, 0.0, args.max_new_tokens)}
seconds = {name: 0.0 for name in methods}
texts: dict[str, list[str]] = {name: [] for name in methods}
for number, start in enumerate(range(0, len(prompts), args.batch_size)):
    batch = prompts[start:start + args.batch_size]
    order = list(methods) if number % 2 == 0 else list(reversed(methods))
    for name in order:
        began = time.perf_counter()
        texts[name] += methods[name](batch)
        seconds[name] += time.perf_counter() - began
    print(f"batch {number + 1}: " + ", ".join(f"{name} {seconds[name]:.0f} s" for name in methods), flush=True)

lengths = [len(target.tokenizer.encode(text)) for text in texts["draftsmith (rows leave at EOS)"]]
print(f"\n{len(prompts)} conversations, batches of {args.batch_size}, at most {args.max_new_tokens} new tokens, greedy; "
      f"{torch.get_num_threads()} threads")
print(f"response tokens: mean {statistics.mean(lengths):.0f}, median {statistics.median(lengths):.0f}, "
      f"max {max(lengths)}; {sum(n >= args.max_new_tokens - 1 for n in lengths)} hit the limit")
for name in methods:
    print(f"{name:<32} {len(prompts) / seconds[name] * 60:7.1f} conversations/min ({seconds[name]:.0f} s)")
base, ours = seconds["transformers generate()"], seconds["draftsmith (rows leave at EOS)"]
identical = sum(a == b for a, b in zip(*texts.values()))
print(f"speedup {base / ours:.2f}x; identical responses {identical}/{len(prompts)}")
