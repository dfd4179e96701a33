"""Memory of a frozen target sharded over processes (`target.shard: fsdp`), side by side for 1, 2, ... processes
in one run: per process, the bytes of the target's weights it holds, its resident and peak memory, the time of a
feature forward, and whether its features equal the single process's.

    .venv/bin/python bench/studies/sharded_target.py                       # SmolLM2-135M, 1 and 2 processes
    .venv/bin/python bench/studies/sharded_target.py --processes 1,2,4 --target PATH_OR_HUB_ID --tokens 512

Each process count runs in its own `torchrun` group (gloo on a CPU, NCCL on GPUs); the one-process row is the
whole target in one process, unsharded. "Resident" is what the process holds after its forwards beyond what torch
and Python held before the target loaded (freed buffers handed back with malloc_trim first: glibc otherwise keeps
the all-gather buffers of the last forward mapped); on GPUs, allocated device memory. The peak includes loading
the whole target before it is sharded: every process loads it once (from a shared page cache with safetensors;
on GPUs only one layer at a time is whole on the device). On a CPU, glibc keeps the gathered layers' freed
buffers (about one whole target over a forward, spread over gloo's threads' arenas) unless large blocks are
mapped and unmapped on their own: every row runs with MALLOC_MMAP_THRESHOLD_ set to --mmap-threshold
(measured on SmolLM2-135M, 2 processes: peak 1.76 GB without it, 1.01 GB with it; 0 = glibc's default).

Study, not measured: no record of a run is committed (it was listed among the canonical benches without one).
A run still writes its record under results/sharded_target/, which docs/results.md lists but does not render.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for records.py

import records  # bench/: the shared command line and the run's record


def memory_mib() -> tuple[float, float]:
    """(resident, peak resident) MiB of this process, from /proc/self/status."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def worker(args) -> None:
    """One process of a group: load, shard when there are several, time feature forwards, report."""
    from draftsmith.data.capture import parse_layers
    from draftsmith.sharding import shard_target, weight_bytes
    from draftsmith.target import flush_denormals, load_target

    flush_denormals()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    runtime, _ = memory_mib()  # torch and Python before the target
    target = load_target(args.target, dtype=args.dtype, device="cpu")
    layers = parse_layers("eagle3", target)
    if world > 1:
        shard_target(target, device)
    else:
        target.model.to(device)
    local, total = weight_bytes(target.model)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (1, args.tokens), generator=generator)
    target.forward(ids, layers=layers, logits=False)  # warm-up
    began = time.perf_counter()
    for _ in range(args.repeats):
        features = target.forward(ids, layers=layers, logits=False).features
    seconds = (time.perf_counter() - began) / args.repeats
    del features
    features = target.forward(ids, layers=layers, logits=False).features  # what the record keeps
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed all-gather buffers mapped until asked
    resident, peak = memory_mib()
    resident -= runtime
    if torch.cuda.is_available():
        resident, peak = torch.cuda.memory_allocated() / 2**20, torch.cuda.max_memory_allocated() / 2**20
    record = {"processes": world, "rank": rank, "weights_mib": local / 2**20, "whole_mib": total / 2**20,
              "share": local / total, "runtime_mib": runtime, "resident_mib": resident, "peak_mib": peak, "forward_s": seconds}
    torch.save({k: v.cpu() for k, v in features.items()}, Path(args.out) / f"features-{world}-{rank}.pt")
    (Path(args.out) / f"record-{world}-{rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", help="dtype the target is loaded in")
    parser.add_argument("--processes", default="1,2", help="process counts to compare, e.g. 1,2,4")
    parser.add_argument("--tokens", type=int, default=256, help="tokens of the timed forward")
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per process")
    parser.add_argument("--mmap-threshold", type=int, default=1 << 20,
                        help="MALLOC_MMAP_THRESHOLD_ for every process (bytes; 0 = glibc's default)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    records.add_shared_options(parser, target="smollm2-135m-instruct")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    cores = len(os.sched_getaffinity(0))
    out = Path(tempfile.mkdtemp(prefix="sharded-target-"))
    rows = []
    for count in [int(n) for n in args.processes.split(",")]:
        threads = max(1, cores // count)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={count}",
                   __file__, "--worker", "--out", str(out), "--target", args.target, "--dtype", args.dtype,
                   "--tokens", str(args.tokens), "--repeats", str(args.repeats)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        if args.mmap_threshold:
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        rows += [json.loads((out / f"record-{count}-{rank}.json").read_text()) for rank in range(count)]
    reference = torch.load(out / "features-1-0.pt")
    print(f"{args.target} ({args.dtype}), a feature forward of {args.tokens} tokens, {cores} cores shared, "
          f"MALLOC_MMAP_THRESHOLD_={args.mmap_threshold or 'default'}")
    print("| processes | rank | target weights held (MiB) | share of the whole | resident beyond the runtime MiB "
          "| peak MiB | forward s | features vs 1 process |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        theirs = torch.load(out / f"features-{r['processes']}-{r['rank']}.pt")
        difference = max(float((theirs[k].float() - reference[k].float()).abs().max()) for k in reference)
        same = "identical" if difference == 0 else f"max |diff| {difference:.2e}"
        print(f"| {r['processes']} | {r['rank']} | {r['weights_mib']:.1f} of {r['whole_mib']:.1f} | {r['share']:.1%} "
              f"| {r['resident_mib']:.0f} | {r['peak_mib']:.0f} | {r['forward_s']:.3f} | {same} |")
        r["features_vs_one_process"] = same
    records.write("sharded_target", {"target": args.target, "dtype": args.dtype, "tokens": args.tokens,
                                     "repeats": args.repeats, "cores": cores, "mmap_threshold": args.mmap_threshold,
                                     "rows": rows}, args)


if __name__ == "__main__":
    main()
