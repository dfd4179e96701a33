"""Benchmark of `draftsmith capture`: ratios measured in one run, on the same data.

    .venv/bin/python bench/studies/capture.py --target smollm2-135m-instruct --samples 64

Prints one JSON object:
  capture_tokens_per_s / forward_tokens_per_s = throughput_ratio   (goal >= 0.9)
      forward = the same target forward over the same batches with no hooks, no copies, no disk;
      capture = the full offline path (hooks, dtype cast, shard assembly, sha256, write+fsync+rename).
      Runs are interleaved (forward, capture, forward, capture, ...) and the median of each is used.
  bytes_per_token / raw_bytes_per_token = size_ratio   (goal <= 1.02)
      raw = layers x hidden x bytes of the feature dtype (2 for bf16).
  peak_rss_mib (process peak resident memory), and peak_gpu_mib on a GPU.
The data: `--data DIR` (a prepared folder) or, by default, the first `--samples` conversations of
builtin:stdlib prepared for the target in a temporary folder.

Study, not measured: no record of a run is committed (it was listed among the canonical benches without one).
A run still writes its record under results/capture/, which docs/results.md lists but does not render.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for records.py

from draftsmith.data.capture import TokenDataset, batches_by_tokens, collate, parse_layers  # noqa: E402
from draftsmith.data.offline import CaptureConfig, write_capture  # noqa: E402
from draftsmith.data.prepared import PrepareConfig, load_prepared, prepare  # noqa: E402
from draftsmith.target import load_target, parse_dtype  # noqa: E402

import records  # bench/: the shared command line and the run's record


def forward_only(target, split, config) -> float:
    """Seconds for the bare target forward over the batches capture uses."""
    dataset, lengths = TokenDataset(split), split["length"]
    pad = target.tokenizer.pad_token_id or 0
    start = time.perf_counter()
    per_shard = config.samples_per_shard
    for first in range(0, len(split), per_shard):
        ids = range(first, min(first + per_shard, len(split)))
        for group in batches_by_tokens(lengths, ids, config.max_batch_tokens, config.max_batch_size):
            batch = collate([dataset[i] for i in group], pad)
            target.forward(batch["input_ids"].to(target.device), layers=[],
                           attention_mask=batch["attention_mask"].to(target.device), logits=False)
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def capture_once(target, config, out: Path) -> tuple[float, dict]:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    manifest = write_capture(CaptureConfig(**{**config.__dict__, "out": str(out)}), target=target)
    return time.perf_counter() - start, manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="prepared data folder (default: builtin:stdlib subset)")
    parser.add_argument("--samples", type=int, default=64, help="conversations from builtin:stdlib when no --data")
    parser.add_argument("--layers", default="eagle3")
    parser.add_argument("--dtype", default="bf16", help="feature dtype")
    parser.add_argument("--target-dtype", default="float32")
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workdir", default=None, help="where shards are written (default: a temp folder)")
    records.add_shared_options(parser, target="smollm2-135m-instruct", threads=0)
    args = parser.parse_args()
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    records.apply_threads(args)

    target = load_target(args.target, dtype=args.target_dtype, device=args.device)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-capture-"))
    data = args.data
    if data is None:
        data = str(workdir / "data")
        prepare(PrepareConfig(target=args.target, input=["builtin:stdlib"], out=data, max_rows=args.samples,
                              eval_fraction=0.0), target=target)
    split = load_prepared(data)["train"]
    config = CaptureConfig(target=args.target, data=data, layers=args.layers, dtype=args.dtype,
                           max_batch_tokens=args.max_batch_tokens, max_batch_size=args.max_batch_size,
                           samples_per_shard=max(1, len(split) // 4))
    forward_only(target, split.select(range(min(4, len(split)))), config)  # warm-up
    forward_times, capture_times = [], []
    for _ in range(args.repeats):
        forward_times.append(forward_only(target, split, config))
        seconds, manifest = capture_once(target, config, workdir / "features")
        capture_times.append(seconds)
    tokens = manifest["num_tokens"]
    layers = parse_layers(args.layers, target)
    raw = len(layers) * target.hidden_size * torch.finfo(parse_dtype(args.dtype)).bits // 8
    on_disk = sum(shard["bytes"] for shard in manifest["shards"])
    forward_tps = tokens / statistics.median(forward_times)
    capture_tps = tokens / statistics.median(capture_times)
    result = {
        "target": args.target, "device": args.device, "threads": torch.get_num_threads(),
        "samples": len(split), "tokens": tokens, "layers": layers, "dtype": args.dtype, "repeats": args.repeats,
        "forward_tokens_per_s": round(forward_tps, 1), "capture_tokens_per_s": round(capture_tps, 1),
        "throughput_ratio": round(capture_tps / forward_tps, 3),
        "bytes_per_token": round(on_disk / tokens, 1), "raw_bytes_per_token": raw,
        "size_ratio": round(on_disk / tokens / raw, 4),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if args.device.startswith("cuda"):
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(result))
    records.write("capture", result, args)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
