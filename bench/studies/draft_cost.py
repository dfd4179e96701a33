"""Benchmark: what one drafting call costs, per drafter shape, on the real target, measured side by side.

    OMP_NUM_THREADS=2 .venv/bin/python bench/studies/draft_cost.py --draft-vocab runs/smollm2-135m-instruct/data

Draft time per verify cycle does not depend on what the weights learned, so untrained drafters of each shape are
timed in the decoder's conditions: the target's features of a real 320-token text, the committed prefix growing by
3 tokens per cycle (each call catches its cache up, as in decoding), greedy, torch's linear layers swapped for W·xᵀ
where the tuning finds that faster (as `draftsmith eval` does). Shapes: DFlash blocks of 4, 8 and 16 with 1, 2 and 4
draft layers over the target's whole vocabulary, DFlash and DSpark blocks of 8 over the draft vocabulary, DSpark's
block of 8 (its Markov walk adds one r x N product per position), and EAGLE-3 chains of 3 and 7 (one draft-layer
step per token). Prints the median milliseconds per call and each over EAGLE-3's chain of 7. Run it alone.

Study, not measured: no record of a run is committed (it was listed among the canonical benches without one).
A run still writes its record under results/draft_cost/, which docs/results.md lists but does not render.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for records.py

from draftsmith.data.vocab import load_draft_vocab  # noqa: E402
from draftsmith.drafters import DecodeState, DraftShape, Sampling, dflash, eagle  # noqa: E402
from draftsmith import small_batch  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--draft-vocab", required=True,
                    help="a prepared data folder with draft_vocab.safetensors (as the EAGLE-3 recipe's data.draft_vocab)")
parser.add_argument("--cycles", type=int, default=40, help="drafting calls timed per shape (the first 5 not counted)")
parser.add_argument("--rounds", type=int, default=3, help="rounds over all shapes, interleaved; the median of all")
records.add_shared_options(parser, target="smollm2-135m-instruct", threads=0)
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
records.apply_threads(args)

torch.manual_seed(0)
target = load_target(args.target)
vocab = load_draft_vocab(args.draft_vocab, target)
rows = small_batch.tune_and_install(target.model)["rows"]
text = inspect.getsource(inspect)
tokens = torch.tensor(target.tokenizer.encode(text)[:320])[None]

shapes = {}
for block, layers in ((4, 1), (8, 1), (16, 1), (8, 2), (8, 4)):
    shapes[f"dflash B={block}, {layers} layer{'s' if layers > 1 else ''}"] = (
        dflash.create(dflash.Config(block_size=block, num_layers=layers), target), block - 1)
shapes["dflash B=8, draft vocab"] = (dflash.create(dflash.Config(block_size=8), target, draft_vocab=vocab), 7)
shapes["dspark B=8 (uncut)"] = (dflash.create(dflash.Config(block_size=8, variant="dspark", confidence_cut=False),
                                              target), 7)
shapes["dspark B=8 (uncut), draft vocab"] = (dflash.create(dflash.Config(block_size=8, variant="dspark",
                                                                         confidence_cut=False), target, draft_vocab=vocab), 7)
eagle3 = eagle.create(eagle.Config(), target, draft_vocab=vocab)
shapes["eagle3 chain 3"] = (eagle3, 3)
shapes["eagle3 chain 7"] = (eagle3, 7)
proposers = {}
for name, (drafter, length) in shapes.items():
    proposer = drafter.proposer(target)
    small_batch.install_on_proposer(proposer, target, rows)
    proposers[name] = (proposer, length)
layers = sorted({i for proposer, _ in proposers.values() for i in proposer.required_layers})
with torch.no_grad():
    features = target.forward(tokens, layers=layers, logits=False).features


def time_calls(proposer, length: int) -> list[float]:
    """Milliseconds of each drafting call after the first 5, the prefix growing by 3 tokens per call."""
    proposer.reset()
    times = []
    for cycle in range(args.cycles + 5):
        end = 200 + 3 * cycle
        state = DecodeState(tokens[:, :end], {i: f[:, : end - 1] for i, f in features.items()}, prompt_length=100)
        began = time.perf_counter()
        proposer.propose(state, DraftShape(length=length), Sampling())
        times.append(1000 * (time.perf_counter() - began))
    return times[5:]


measured = {name: [] for name in proposers}
for _ in range(args.rounds):
    for name, (proposer, length) in proposers.items():
        measured[name] += time_calls(proposer, length)
baseline = statistics.median(measured["eagle3 chain 7"])
print(f"{torch.get_num_threads()} threads; target {target.name}; draft vocabulary {vocab.size} tokens; "
      f"{args.rounds} x {args.cycles} calls per shape")
print(f"{'drafter':<36} {'ms/call':>8} {'vs eagle3 chain 7':>18}")
for name, times in measured.items():
    print(f"{name:<36} {statistics.median(times):8.2f} {statistics.median(times) / baseline:17.2f}x")
medians = {name: statistics.median(times) for name, times in measured.items()}
records.write("draft_cost", {"target": target.name, "draft_vocab_size": vocab.size, "rounds": args.rounds,
                             "cycles": args.cycles, "threads": torch.get_num_threads(), "ms_per_call": medians,
                             "baseline": "eagle3 chain 7",
                             "vs_baseline": {name: ms / baseline for name, ms in medians.items()}}, args)
