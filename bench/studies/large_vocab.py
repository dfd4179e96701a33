"""What a large target vocabulary costs an EAGLE-3 drafter: training step time and stored bytes, before and after.

    .venv/bin/python bench/studies/large_vocab.py --vocab 152064 --hidden 256 --steps 6

Builds a tiny random Qwen2 target with a large vocabulary (Qwen2's 152064 by default) in memory and
trains an EAGLE-3 drafter on random tokens with online features, in one process, alternating:
- before: the training targets as draftsmith computed them until the change (the target's head over the
  whole vocabulary, a softmax over the draft rows of those logits);
- after: `Drafter._training_targets` (logits over the draft-vocabulary rows only; the full-vocabulary argmax
  in chunks, never [positions, V] at once).
Both run only at the positions whose next token is learned (which the "before" of this bench's first run,
2026-11-29, did not: it computed every position; since then the drafter passes only the learned ones).
Both compute the same loss (checked here). It prints milliseconds per optimizer step of each and their
ratio, the peak resident memory growth of one step of each, and the bytes of a drafter folder and of a
training checkpoint with and without the frozen embedding that drafter folders used to store.

Study, settled: EAGLE-3 training computes the target's distribution on the draft-vocabulary rows only (the
whole-vocabulary argmax in chunks), and drafter folders no longer store the frozen embedding. The old computation is
gone from draftsmith; this file keeps its own copy (`targets_before`) to measure against. Measured on 2026-11-30 on a
2-core AVX2 CPU, one run, with `--steps 4 --threads 1`: a step 1995 against 2665 ms (1.34x), the first step's peak
memory growth 298 against 778 MiB, a drafter folder 11.7 instead of 160.2 MiB.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from draftsmith.drafters import eagle  # noqa: E402
from tiny import base_tokenizer, tiny_model  # noqa: E402
from draftsmith.target import Target  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--vocab", type=int, default=152064, help="target vocabulary size")
parser.add_argument("--hidden", type=int, default=256, help="target hidden size")
parser.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size (0 = the full vocabulary)")
parser.add_argument("--batch", type=int, default=4, help="sequences per step")
parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
parser.add_argument("--trained-share", type=float, default=0.6, help="share of positions in the loss mask")
parser.add_argument("--steps", type=int, default=6, help="counted steps per variant (after one warm-up step each)")
parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
parser.add_argument("--memory-of", choices=["before", "after"], help=argparse.SUPPRESS)  # the child processes
args = parser.parse_args()
torch.set_num_threads(args.threads)


# ---------------------------------------------------------------- the two ways of computing the targets
def targets_before(self, last, target_head):
    """The computation before the change (the whole vocabulary's logits), kept here to measure against."""
    with torch.no_grad():
        target_logits = target_head(last).float()
        return target_logits.argmax(-1), torch.softmax(target_logits[..., self.draft_ids], dim=-1)


targets_after = eagle.Drafter._training_targets


# ---------------------------------------------------------------- setup
target = Target(tiny_model("qwen2", vocab_size=args.vocab, hidden_size=args.hidden, num_layers=8,
                           max_position_embeddings=4096), base_tokenizer(), name="tiny-large-vocab")
target.model.requires_grad_(False)
vocab = None
if args.draft_vocab:
    from draftsmith.data.vocab import build_draft_vocab

    vocab = build_draft_vocab(torch.randint(1, 100, (args.vocab,)), args.draft_vocab)
drafter = eagle.create(eagle.Config(ttt_steps=3), target, vocab)
optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
generator = torch.Generator().manual_seed(0)
ids = torch.randint(0, args.vocab, (args.batch, args.length), generator=generator)
mask = (torch.rand(args.batch, args.length, generator=generator) < args.trained_share).long()
batch = {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids),
         "features": target.forward(ids, layers=drafter.required_layers, logits=False).features}


def use(variant) -> None:
    eagle.Drafter._training_targets = variant


def step() -> float:
    started = time.perf_counter()
    loss, _ = drafter.loss(batch, target.head)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - started


def peak_growth(variant: str) -> float:
    """MiB by which a fresh process's peak resident size grows in its first training step with `variant`."""
    import subprocess

    command = [sys.executable, __file__, *sys.argv[1:], "--memory-of", variant]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()[-1])


def resident_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


if args.memory_of:  # a child: setup is done; reset the peak, one step, then how far the peak rose
    use({"before": targets_before, "after": targets_after}[args.memory_of])
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    start = resident_kib("VmRSS")
    step()
    print((resident_kib("VmHWM") - start) / 1024)
    raise SystemExit(0)

# ---------------------------------------------------------------- same loss, then time
drafter.eval()
use(targets_before)
reference = drafter.loss(batch, target.head)[0].item()
use(targets_after)
ours = drafter.loss(batch, target.head)[0].item()
drafter.train()
print(f"target: vocabulary {args.vocab}, hidden {args.hidden}; draft vocabulary {args.draft_vocab or args.vocab}; "
      f"batch {args.batch} x {args.length}, {mask.float().mean():.0%} of positions trained")
print(f"loss before {reference:.6f}, after {ours:.6f} (same computation: |diff| {abs(reference - ours):.2e})")
growth_before, growth_after = peak_growth("before"), peak_growth("after")
seconds = {"before": 0.0, "after": 0.0}
for round_ in range(args.steps):
    for name, variant in (("before", targets_before), ("after", targets_after))[:: 1 if round_ % 2 == 0 else -1]:
        use(variant)
        seconds[name] += step()
use(targets_after)
before_ms, after_ms = (1000 * seconds[k] / args.steps for k in ("before", "after"))
print(f"step time: before {before_ms:.0f} ms, after {after_ms:.0f} ms -> {before_ms / after_ms:.2f}x faster")
print(f"peak memory growth of a fresh process's first step: before {growth_before:.0f} MiB, "
      f"after {growth_after:.0f} MiB")

# ---------------------------------------------------------------- stored bytes
with tempfile.TemporaryDirectory() as scratch:
    drafter.save_pretrained(Path(scratch) / "d")
    stored = (Path(scratch) / "d" / "model.safetensors").stat().st_size
embedding = target.model.get_input_embeddings().weight.numel() * 4
trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
optimizer_state = 2 * trainable * 4
print(f"drafter folder: {stored / 2**20:.1f} MiB now, {(stored + embedding) / 2**20:.1f} MiB with the frozen "
      f"embedding it used to store ({(stored + embedding) / stored:.1f}x); {trainable / 1e6:.2f} M trainable parameters")
print(f"checkpoint (computed: accelerate state + drafter/ + AdamW moments): {(2 * stored + optimizer_state) / 2**20:.1f} MiB now, "
      f"{(2 * stored + 2 * embedding + optimizer_state) / 2**20:.1f} MiB before (the embedding twice)")
