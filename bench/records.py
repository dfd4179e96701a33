"""What every canonical bench shares: its common command-line options, and the record it leaves of its run.

A record is one JSON file, `results/<bench>/<UTC date-time>-<short commit>.json`, written atomically:

    {"schema": 1, "bench": "draft_cost",
     "command": "python bench/draft_cost.py --draft-vocab runs/...",       what ran, exactly
     "commit": "<40 hex>", "dirty": false,                                  the tree it ran from
     "date": "2026-12-03T14:05:09Z",                                        UTC, when the bench ended
     "machine": {"cpu": "...", "amx": false, "avx512": true, "avx2": true,
                 "cores": 2, "torch_threads": 2, "memory_gib": 7.8, "gpu": null},
     "versions": {"python": "3.12.3", "torch": "2.13.0", "transformers": "..."},
     "result": {...}}                                                       the bench's own result JSON

`bench/render_results.py` renders docs/results.md from the latest record of each bench.

This module imports neither torch nor draftsmith at load time (the renderer and its test read records without
them), and it does not import bench/common.py: that file flushes denormals on import, which would change what a
bench that does not flush them measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
SCHEMA = 1
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")

SHARED_OPTIONS = {  # name -> (type, the help every bench shows unless it says more)
    "target": (str, "target model: built-in alias, hub id, local folder or .gguf file"),
    "num_prompts": (int, "HumanEval prompts decoded per method"),
    "max_new_tokens": (int, "new tokens per prompt"),
    "threads": (int, "torch CPU threads (0 = torch's default, or OMP_NUM_THREADS)"),
    "out": (str, "where the bench's own output goes"),
}


# ----------------------------------------------------------------------------- the shared command line
def add_shared_options(parser: argparse.ArgumentParser, helps: dict[str, str] | None = None, **defaults) -> None:
    """Add the shared options named in `defaults` (target, num_prompts, max_new_tokens, threads, out) with each
    bench's own default, and --no-record. `helps` replaces an option's help where the bench means more by it."""
    for name, default in defaults.items():
        kind, text = SHARED_OPTIONS[name]
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                            help=(helps or {}).get(name, text))
    parser.add_argument("--no-record", dest="record", action="store_false",
                        help=f"do not write this run's record under {RESULTS.relative_to(ROOT)}/ (a trial run)")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU threads when --threads asks for a number (0 keeps torch's default)."""
    if getattr(args, "threads", 0):
        import torch

        torch.set_num_threads(args.threads)


# ----------------------------------------------------------------------------- the record
def _git(*arguments: str) -> str:
    done = subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu() -> tuple[str, set[str]]:
    """The CPU's model name and its feature flags (Linux /proc/cpuinfo; the platform's name elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), set()
    fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return fields.get("model name", platform.machine()), set(fields.get("flags", "").split())


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict:
    """The machine a bench ran on: CPU model and the vector units timings depend on, cores, threads, memory, GPU."""
    import torch  # every bench has it loaded by now

    cpu, flags = _cpu()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "amx": bool(flags & {"amx_bf16", "amx_tile"}), "avx512": "avx512f" in flags,
            "avx2": "avx2" in flags, "cores": cores, "torch_threads": torch.get_num_threads(),
            "memory_gib": _memory_gib(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            # a limit on the instruction sets oneDNN and MKL use (a slower kind of CPU emulated), when one was set
            "isa_limit": {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)} or None}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def command_line() -> str:
    """The exact command that ran this process, with the script's path relative to the repository."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def record(bench: str, result: dict, results: Path = RESULTS) -> dict:
    """The record of this run of `bench`: what ran (command, commit, machine, versions, date) and `result`."""
    return {"schema": SCHEMA, "bench": bench, "command": command_line(),
            "commit": _git("rev-parse", "HEAD") or None,
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine(),
            "versions": {"python": platform.python_version(), "torch": _version("torch"),
                         "transformers": _version("transformers")},
            "result": result}


def write(bench: str, result: dict, args: argparse.Namespace | None = None, results: Path = RESULTS) -> Path | None:
    """Write this run's record under results/<bench>/ atomically (temp file + rename); nothing with --no-record."""
    if args is not None and not getattr(args, "record", True):
        return None
    if str(ROOT) not in sys.path:  # this tree's draftsmith, for benches that only put bench/ on the path
        sys.path.insert(0, str(ROOT))
    from draftsmith.files import write_atomically

    entry = record(bench, result)
    stamp = entry["date"].replace("-", "").replace(":", "")
    path = results / bench / f"{stamp}-{(entry['commit'] or 'nocommit')[:8]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # a round trip through JSON first: a result that cannot be written must fail before the file is touched
    text = json.dumps(json.loads(json.dumps(entry, default=str)), indent=1, sort_keys=False) + "\n"
    write_atomically(path, text)
    print(f"record: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
    return path
