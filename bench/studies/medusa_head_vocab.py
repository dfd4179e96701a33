"""Medusa heads over the whole vocabulary or over the draft vocabulary `prepare` builds: what each costs here.

    .venv/bin/python bench/studies/medusa_head_vocab.py --threads 2

On SmolLM2-135M the vocabulary (49,152) dwarfs the hidden size (576), so a Medusa head is almost all
projection: 4 heads over the full vocabulary hold 113 M parameters, about the target's own size. This script
builds the shipped medusa1 recipe's heads both ways on the built-in target and the prepared data
(runs/{target}/data, made by `draftsmith prepare` or any recipe), and times, interleaved and repeated:
a training step of the heads (loss forward + backward on a recipe batch, target features precomputed),
the target's forward that online training adds to it, and one decode-time chain of 4 heads. It prints
medians and the full/draft ratios, and the share of trained tokens the draft vocabulary covers (what it
can draft at all).

Study, settled: the Medusa recipes' heads predict over the 8192-token draft vocabulary `prepare` builds, not the
whole vocabulary. Measured on 2026-12-01 (commit 274e001, alone; the machine kind was not recorded) with
`--threads 2`: the heads' training step 7.2 s full against 2.6 s draft (2.76x), an online step 1.77x faster, a chain of
4 heads 41.0 against 9.0 ms (4.55x); the draft vocabulary covered 99.9% of the prepared data's trained tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from draftsmith.config import load  # noqa: E402
from draftsmith.data.capture import TokenDataset, collate  # noqa: E402
from draftsmith.data.prepared import load_prepared  # noqa: E402
from draftsmith.data.vocab import load_draft_vocab  # noqa: E402
from draftsmith.drafters import medusa  # noqa: E402
from draftsmith.train.config import TrainConfig  # noqa: E402
from draftsmith.train.data import truncate  # noqa: E402
from draftsmith.train.recipe import TrainRecipe  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m" / "medusa1.yaml"

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--repeats", type=int, default=5, help="timed repetitions of each measurement (medians kept)")
parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
args = parser.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)

config = load(TrainConfig, RECIPE, ["tracking.report_to=[]"])
target = TrainRecipe(config).load_target()
target.model.requires_grad_(False)
prepared = Path(str(config.data.prepared).replace("{target}", "smollm2-135m-instruct"))
split = TokenDataset(load_prepared(prepared, target)["train"])
vocab = load_draft_vocab(prepared, target)
options = dict(config.drafter)
options.pop("kind")
heads = {"full": medusa.create(medusa.Config(**options), target),
         f"draft {vocab.size}": medusa.create(medusa.Config(**options), target, vocab)}
layer = target.num_layers - 1
items = [split[i] for i in range(config.data.batch_size)]
batch = collate([truncate(item, config.data.max_length) for item in items], pad_id=0)
started = time.perf_counter()
batch["features"] = target.forward(batch["input_ids"], layers=[layer], attention_mask=batch["attention_mask"],
                                   logits=False).features
feature = batch["features"][layer][0, -1]
times: dict[str, dict[str, list[float]]] = {name: {"train step": [], "chain of 4": []} for name in heads}
times["target forward"] = {"forward": []}
for repeat in range(args.repeats + 1):  # the first round warms up and is dropped
    names = list(heads) if repeat % 2 else list(reversed(heads))
    for name in names:
        drafter = heads[name]
        start = time.perf_counter()
        loss, _ = drafter.loss(batch, target.head)
        loss.backward()
        drafter.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        with torch.no_grad():
            start = time.perf_counter()
            for i in range(4):
                drafter.head_rows(i, feature).argmax(-1)
            chain = time.perf_counter() - start
        if repeat:
            times[name]["train step"].append(elapsed)
            times[name]["chain of 4"].append(chain)
    start = time.perf_counter()
    target.forward(batch["input_ids"], layers=[layer], attention_mask=batch["attention_mask"], logits=False)
    if repeat:
        times["target forward"]["forward"].append(time.perf_counter() - start)

median = {name: {k: statistics.median(v) for k, v in parts.items()} for name, parts in times.items()}
tokens = int(batch["attention_mask"].sum())
print(f"batch: {len(items)} sequences, {tokens} tokens; torch threads {torch.get_num_threads()}; "
      f"draft vocabulary covers {vocab.coverage:.1%} of the prepared data's trained tokens")
forward = median["target forward"]["forward"]
print(f"target forward (what online training adds to every step): {forward * 1e3:.0f} ms")
for name, drafter in heads.items():
    params = sum(p.numel() for p in drafter.parameters()) / 1e6
    step, chain = median[name]["train step"], median[name]["chain of 4"]
    print(f"{name:>12}: {params:6.1f} M parameters; heads' train step {step * 1e3:6.0f} ms "
          f"(with the target forward {tokens / (step + forward):5.0f} tokens/s); chain of 4 {chain * 1e3:5.1f} ms")
full, small = (median[name] for name in heads)
print(f"full / draft: heads' train step {full['train step'] / small['train step']:.2f}x, online step "
      f"{(full['train step'] + forward) / (small['train step'] + forward):.2f}x, chain of 4 "
      f"{full['chain of 4'] / small['chain of 4']:.2f}x")
