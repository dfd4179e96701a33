"""Benchmark: where one online EAGLE-3 training step's time goes, in the default recipe's shapes. Run it alone.

    OMP_NUM_THREADS=2 .venv/bin/python bench/studies/train_step_profile.py --data runs/smollm2-135m-instruct/data

One batch of 4 prepared samples (the recipe's batch_size) whose lengths are nearest the data's median, as
`group_by_length` batches them, cut to 512 tokens; fp32 on the CPU. Each part is the median of --repeats runs
(the target's four passes, with and without logits, features and top-k, taken in turn round after round):
- the target's forward with the features of its 3 EAGLE-3 layers and the last one captured (online mode);
- the soft labels: the target's head over the draft vocabulary at every learned position;
- the drafter's forward with its loss at 1 .. 7 TTT steps (what one more step costs is the difference), then
  its backward at --ttt-steps (7 by default);
- the optimizer step (fused AdamW over the drafter's parameters, as the trainer runs it).
Prints the parts in milliseconds and as shares of the step, and the step's tokens/s over the target's
forward-only tokens/s (the figure issue 16 asks to raise to 0.8), online and offline (the step without the
target's forward, as when the features come from captured shards). Offline, the soft labels are also priced
from the target's top --topk logits stored at capture (data.topk_logits): their first index as the argmax
beside the head's draft rows (labels=head), and alone (labels=topk). Online with data.topk_logits, a sequence's
first visit captures its top-k too and later epochs take it from memory (train/data.py TopkMemory): both steps
add the drafter's forward and backward timed with that top-k to the capture and the optimizer step. Last, whole
online steps (with and without the kept top-k) are timed in turn with the target's forward-only pass, the
ratios this noisy machine gives most steadily.

Study, not measured: no record of a run is committed (it was listed among the canonical benches without one).
A run still writes its record under results/train_step_profile/, which docs/results.md lists but does not render.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for records.py

from draftsmith.data.capture import TokenDataset, capture_batch, collate  # noqa: E402
from draftsmith.data.prepared import load_prepared  # noqa: E402
from draftsmith.data.vocab import load_draft_vocab  # noqa: E402
from draftsmith.drafters import eagle, predicting_positions  # noqa: E402
from draftsmith.target import flush_denormals, load_target  # noqa: E402
from draftsmith.train.data import truncate  # noqa: E402

import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--data", required=True, help="a prepared data folder with its draft vocabulary (data.prepared)")
parser.add_argument("--repeats", type=int, default=5, help="runs of each part; the median counts (default 5)")
parser.add_argument("--batch-size", type=int, default=4, help="samples per batch (the recipe's data.batch_size)")
parser.add_argument("--ttt-steps", type=int, default=7, help="TTT steps of the timed backward and step (default 7)")
parser.add_argument("--topk", type=int, default=8, help="stored top-k logits the offline label variants read (default 8)")
records.add_shared_options(parser, target="smollm2-135m-instruct", threads=0)
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything


def median_ms(work, repeats: int = args.repeats) -> float:
    return interleaved_medians_ms({"work": work}, repeats)["work"]


def interleaved_medians_ms(works: dict, repeats: int = args.repeats) -> dict:
    """Median ms of each work, run in turn round after round (reversed every other one), so that the machine's
    drift hits them alike: the target's passes are compared with each other as ratios."""
    times = {name: [] for name in works}
    for round_ in range(repeats):
        for name in (list(works) if round_ % 2 == 0 else reversed(list(works))):
            began = time.perf_counter()
            works[name]()
            times[name].append(1000 * (time.perf_counter() - began))
    return {name: statistics.median(values) for name, values in times.items()}


flush_denormals()  # as the CLI does, before torch's threads start
records.apply_threads(args)
torch.manual_seed(0)
target = load_target(args.target)
target.model.requires_grad_(False)
dataset = TokenDataset(load_prepared(args.data, target)["train"])
lengths = [min(len(dataset[i]["input_ids"]), 512) for i in range(len(dataset))]
middle = statistics.median(lengths)
chosen = sorted(range(len(dataset)), key=lambda i: abs(lengths[i] - middle))[: args.batch_size]
pad = target.tokenizer.pad_token_id or 0
batch = collate([truncate(dataset[i], 512) for i in chosen], pad)
tokens = int(batch["attention_mask"].sum())
drafter = eagle.create(eagle.Config(), target, draft_vocab=load_draft_vocab(args.data, target))
layers = sorted(set(drafter.required_layers) | {target.num_layers - 1})
optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4, fused=True)  # as trained

with torch.no_grad():
    passes = interleaved_medians_ms({
        "forward": lambda: target.forward(batch["input_ids"], attention_mask=batch["attention_mask"], logits=False),
        "with logits": lambda: target.forward(batch["input_ids"], attention_mask=batch["attention_mask"]),
        "capture": lambda: capture_batch(target, batch, layers),
        "capture top-k": lambda: capture_batch(target, batch, layers, topk_logits=args.topk)})
    forward_only, with_logits, capture = passes["forward"], passes["with logits"], passes["capture"]
    captured = capture_batch(target, batch, layers)
    last = captured["features"][target.num_layers - 1]
    learned = predicting_positions(captured["loss_mask"].bool())
    labels = median_ms(lambda: drafter._training_targets(last[learned].float(), target.head))
    capture_topk = passes["capture top-k"]
    with_topk = capture_batch(target, batch, layers, topk_logits=args.topk)  # the top-k as online training keeps it
    stored = {key: value[learned] for key, value in with_topk["target_topk"].items()}
    stored_argmax = median_ms(lambda: drafter._training_targets(last[learned].float(), target.head, stored))
    drafter.config.labels = "topk"
    stored_topk = median_ms(lambda: drafter._training_targets(last[learned].float(), target.head, stored))
    drafter.config.labels = "head"
forwards = {}
for steps in range(1, max(7, args.ttt_steps) + 1):
    drafter.config.ttt_steps = steps
    with torch.no_grad():
        forwards[steps] = median_ms(lambda: drafter.loss(captured, target.head))


def forward_backward(batch=captured):
    loss, _ = drafter.loss(batch, target.head)
    loss.backward()


drafter.config.ttt_steps = args.ttt_steps
with_backward = median_ms(forward_backward)
with_backward_topk = median_ms(lambda: forward_backward(with_topk))
optimizer_step = median_ms(lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=False)))
forward_backward()
loop_optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4, foreach=False)
loop_optimizer_step = median_ms(lambda: loop_optimizer.step())  # torch's per-tensor loop, for comparison
optimizer.zero_grad(set_to_none=False)
k = args.ttt_steps
step = capture + with_backward + optimizer_step
parts = {
    "target forward + feature capture": capture,
    "  of which the target's forward alone": forward_only,
    f"drafter forward + loss, {k} TTT steps": forwards[k],
    "  of which the soft labels (target head)": labels,
    "  of which TTT step 1": forwards[1],
    "  of which each further TTT step (mean)": (forwards[7] - forwards[1]) / 6,
    f"drafter backward ({k} steps)": with_backward - forwards[k],
    "optimizer step": optimizer_step,
}
print(f"{torch.get_num_threads()} threads; batch of {args.batch_size} samples, {tokens} tokens (median length "
      f"{middle:.0f}); fp32; medians of {args.repeats} runs")
for name, ms in parts.items():
    print(f"{name:<44} {ms:9.1f} ms {ms / step:7.1%}")
print(f"{'one training step':<44} {step:9.1f} ms")
print(f"optimizer step: fused AdamW {optimizer_step:.1f} ms, torch's per-tensor loop {loop_optimizer_step:.1f} ms "
      f"({loop_optimizer_step / optimizer_step:.1f}x)")
print("drafter forward + loss by TTT steps: " + ", ".join(f"{s}: {ms:.0f} ms" for s, ms in forwards.items()))
print(f"online training {tokens / step * 1000:.0f} tokens/s against the target's forward-only "
      f"{tokens / forward_only * 1000:.0f} tokens/s: {forward_only / step:.2f}x (against a forward that also computes "
      f"the logits at every position, {with_logits:.0f} ms: {with_logits / step:.2f}x)")
offline = step - capture  # features read from captured shards: no target forward in the step
print(f"offline (features from shards) {tokens / offline * 1000:.0f} tokens/s: {forward_only / offline:.2f}x the target's "
      f"forward, {step / offline:.2f}x online")
print(f"capturing the batch with its top-{args.topk} logits too: {capture_topk:.0f} ms (without: {capture:.0f} ms), once per "
      "capture, not per step")
first, later = capture_topk + with_backward_topk + optimizer_step, capture + with_backward_topk + optimizer_step
print(f"online with data.topk_logits={args.topk}: a sequence's first visit {first:.0f} ms a step "
      f"({forward_only / first:.2f}x the target's forward), later epochs with its top-{args.topk} kept in memory "
      f"{later:.0f} ms ({tokens / later * 1000:.0f} tokens/s, {forward_only / later:.2f}x)")


def online_step(kept_topk: bool):
    """A whole online step: capture, the drafter's forward and backward, the optimizer step."""
    with torch.no_grad():
        now = capture_batch(target, batch, layers)
    if kept_topk:
        now["target_topk"] = with_topk["target_topk"]
    forward_backward(now)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


whole = interleaved_medians_ms({
    "forward": lambda: target.forward(batch["input_ids"], attention_mask=batch["attention_mask"], logits=False),
    "online": lambda: online_step(False), "online, top-k kept": lambda: online_step(True)})
print(f"whole steps timed in turn with the target's forward-only pass ({whole['forward']:.0f} ms): online "
      f"{whole['online']:.0f} ms, {whole['forward'] / whole['online']:.2f}x; later epochs with the top-{args.topk} kept "
      f"{whole['online, top-k kept']:.0f} ms, {whole['forward'] / whole['online, top-k kept']:.2f}x")
for name, ms in ((f"the argmax from a stored top-{args.topk}", stored_argmax), (f"labels=topk, top-{args.topk}", stored_topk)):
    variant = offline - labels + ms
    print(f"offline, soft labels with {name}: labels {ms:.1f} ms (head: {labels:.1f}), step {variant:.0f} ms, "
          f"{forward_only / variant:.2f}x the target's forward")


def step_figures(ms: float) -> dict:
    return {"ms": ms, "tokens_per_s": tokens / ms * 1000, "over_forward": forward_only / ms}


steps = {"online": step_figures(step), "offline (features from shards)": step_figures(offline),
         f"online, top-{args.topk} kept from the first visit (later epochs)": step_figures(later),
         f"online, first visit capturing the top-{args.topk}": step_figures(first),
         "whole online step, timed in turn with the forward": {
             "ms": whole["online"], "tokens_per_s": tokens / whole["online"] * 1000,
             "over_forward": whole["forward"] / whole["online"]},
         f"whole online step, top-{args.topk} kept, timed in turn with the forward": {
             "ms": whole["online, top-k kept"], "tokens_per_s": tokens / whole["online, top-k kept"] * 1000,
             "over_forward": whole["forward"] / whole["online, top-k kept"]}}
for name, ms in ((f"the argmax from a stored top-{args.topk}", stored_argmax), (f"labels=topk, top-{args.topk}", stored_topk)):
    steps[f"offline, soft labels with {name}"] = step_figures(offline - labels + ms)
records.write("train_step_profile", {
    "threads": torch.get_num_threads(), "batch_size": args.batch_size, "tokens": tokens, "median_length": middle,
    "repeats": args.repeats, "ttt_steps": k, "topk": args.topk, "parts_ms": parts, "step_ms": step,
    "forward_only_ms": forward_only, "forward_with_logits_ms": with_logits, "capture_ms": capture,
    "capture_topk_ms": capture_topk, "optimizer_fused_ms": optimizer_step, "optimizer_loop_ms": loop_optimizer_step,
    "drafter_forward_by_ttt_steps_ms": forwards, "whole_steps_ms": whole, "steps": steps}, args)
