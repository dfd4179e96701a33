"""Benchmark: the target writing training data in float32 against a bfloat16 copy of it (what `prepare.dtype: auto`
and `data.capture_dtype: auto` choose on a CPU where bf16 measures faster), side by side in one run.

    OMP_NUM_THREADS=2 .venv/bin/python bench/studies/data_dtype.py --rows 64 --batch-size 32 --max-new-tokens 192

Regeneration: the first ROWS conversations of builtin:stdlib-complete up to their assistant turn, sorted by size as
`prepare --regenerate` sorts them, answered greedily by draftsmith's loop in batches, the two dtypes alternating which
goes first per batch. Capture: the regenerated answers' conversations through the target's forward at the default
EAGLE-3 layers and its last layer's top-8, in batches of 4, alternating likewise. Prints conversations/min and
capture tokens/s of each, their ratios, how many answers are identical, and how often the bf16 copy's argmax (the
label a drafter learns) is float32's. Run it alone: it measures wall time.

Study, settled: `prepare.dtype: auto` and `data.capture_dtype: auto` write data in a bf16 copy of the target only
where a bf16 matmul measures faster than fp32 (a CPU with AMX); elsewhere they stay fp32. Measured on 2026-12-02 on a
2-core Xeon with AMX, alone, with `--rows 64 --batch-size 32 --max-new-tokens 192`: regeneration 58.8 against 33.5
conversations/min (1.76x), capture 628 against 338 tokens/s (1.86x); 13 of 64 answers identical to float32's, the
bf16 argmax equal to float32's at 97.9% of captured positions. On an AVX512-BF16 Xeon without AMX (2026-12-01) bf16
measured about 2x slower, which is why `auto` tests the matmul instead of trusting the CPU's flags.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import regeneration_prompts  # noqa: E402
from draftsmith.data.regenerate import generate  # noqa: E402
from draftsmith.data.templates import encode_prompt  # noqa: E402
from draftsmith.target import default_eagle3_layers, in_dtype, load_target  # noqa: E402

args = regeneration_prompts.parser(__doc__).parse_args()
fp32 = load_target(args.target)
targets = {"float32": fp32, "bfloat16": in_dtype(fp32, torch.bfloat16)}
prompts = regeneration_prompts.prompts(args.rows)


def alternating(batches, work) -> tuple[dict, dict]:
    """Seconds and outputs of `work(target, batch)` per dtype, the first dtype alternating per batch."""
    seconds, outputs = dict.fromkeys(targets, 0.0), {name: [] for name in targets}
    for number, batch in enumerate(batches):
        for name in (list(targets) if number % 2 == 0 else list(reversed(targets))):
            began = time.perf_counter()
            outputs[name].append(work(targets[name], batch))
            seconds[name] += time.perf_counter() - began
    return seconds, outputs


batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
regen_s, answers = alternating(batches, lambda target, batch: generate(target, batch, 0.0, args.max_new_tokens))
answers = {name: list(itertools.chain(*texts)) for name, texts in answers.items()}

# capture: the float32 answers as conversations, tokenized with the chat template, batches of 4 padded on the right
pad = fp32.tokenizer.pad_token_id if fp32.tokenizer.pad_token_id is not None else fp32.tokenizer.eos_token_id
encoded = [encode_prompt(fp32.tokenizer, prompt + [{"role": "assistant", "content": answer}])[:512]
           for prompt, answer in zip(prompts, answers["float32"])]
layers = sorted({*default_eagle3_layers(fp32.num_layers), fp32.num_layers - 1})
token_batches = []
for start in range(0, len(encoded), 4):
    group = encoded[start:start + 4]
    width = max(map(len, group))
    token_batches.append((torch.tensor([ids + [pad] * (width - len(ids)) for ids in group]),
                          torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in group])))


@torch.no_grad()
def capture(target, batch):
    ids, mask = batch
    out = target.forward(ids, layers=layers, attention_mask=mask, logits=False)
    return target.head(out.features[layers[-1]]).float().topk(8, dim=-1).indices[..., 0][mask.bool()]


capture_s, argmax = alternating(token_batches, capture)
tokens = sum(int(mask.sum()) for _, mask in token_batches)
agree = torch.cat(argmax["bfloat16"]).eq(torch.cat(argmax["float32"])).float().mean().item()

print(f"\n{len(prompts)} conversations, batches of {args.batch_size}, at most {args.max_new_tokens} new tokens, greedy; "
      f"capture of {tokens} tokens at layers {layers}; {torch.get_num_threads()} threads")
for name in targets:
    print(f"{name:<9} regeneration {len(prompts) / regen_s[name] * 60:6.1f} conversations/min ({regen_s[name]:.0f} s), "
          f"capture {tokens / capture_s[name]:6.0f} tokens/s ({capture_s[name]:.1f} s)")
identical = sum(a == b for a, b in zip(answers["float32"], answers["bfloat16"]))
print(f"bf16 / float32: regeneration {regen_s['float32'] / regen_s['bfloat16']:.2f}x, capture "
      f"{capture_s['float32'] / capture_s['bfloat16']:.2f}x; identical answers {identical}/{len(prompts)}; "
      f"capture argmax as float32's at {agree:.1%} of positions")
