"""What every canonical bench shares: its common command-line options, and the record it leaves of its run.

A record is one JSON file, `results/<bench>/<UTC date-time>-<short commit>.json`, written atomically:

    {"schema": 2, "bench": "hybrid",
     "command": "python bench/hybrid.py --drafter runs/...",                what ran, exactly
     "commit": "<40 hex>", "dirty": false, "diff": null,                    the tree the run STARTED from (`start()`)
     "started": "2026-12-03T13:41:00Z", "date": "2026-12-03T14:05:09Z",     UTC, when the bench began and ended
     "tree_changed_during_run": false,                                      did HEAD or the diff move under the run
     "machine": {"cpu": "...", "amx": false, "avx512": true, "avx2": true,
                 "cores": 2, "torch_threads": 2, "memory_gib": 7.8, "gpu": null},
     "versions": {"python": "3.12.3", "torch": "2.13.0", "transformers": "..."},
     "result": {...}}                                                       the bench's own result JSON

A bench calls `start()` as it starts: the commit and dirty flag are taken then, so a run that spans a commit is
credited to the commit it started from; a tree that changed before the record is written says so
("tree_changed_during_run": true, with "commit_at_end" and "dirty_at_end") rather than crediting the new commit.
A dirty start keeps its `git diff HEAD` text (tracked files, as the dirty flag counts them) in a file beside the
record, `<record>.diff`, which "diff" names. A drafter a result names is named by content as well as by path:
`drafter_sha256(folder)`. Records of schema 1 predate these fields: their commit was read when they were written,
and they name no drafter hash.

`bench/render_results.py` renders docs/results.md from the records.

This module imports neither torch nor draftsmith at load time (the renderer and its test read records without
them), and it does not import bench/common.py: that file flushes denormals on import, which would change what a
bench that does not flush them measures.
"""

from __future__ import annotations

import argparse
import hashlib
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
SCHEMA = 2
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


# ----------------------------------------------------------------------------- the tree a run started from
def step(output: Path, command: list[str], reuse: bool = False) -> None:
    """Run one command of a bench (a subprocess that must succeed), unless `reuse` and its `output` exists."""
    if reuse and output.exists():
        print(f"reusing {output}", flush=True)
        return
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)


def _git(*arguments: str, root: Path = ROOT, strip: bool = True) -> str:
    done = subprocess.run(["git", *arguments], cwd=root, capture_output=True, text=True, check=False)
    if done.returncode:
        return ""
    return done.stdout.strip() if strip else done.stdout


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def tree_state(root: Path = ROOT) -> dict:
    """HEAD of the repository at `root` and its uncommitted changes to tracked files (`git diff HEAD`; '' if none)."""
    diff = _git("diff", "HEAD", root=root, strip=False)
    return {"commit": _git("rev-parse", "HEAD", root=root) or None, "dirty": bool(diff), "diff": diff}


_start: dict | None = None
"""what `start()` took: the tree, its root and the time; None until a bench calls it"""


def start(root: Path = ROOT) -> dict:
    """Take the commit, dirty flag and diff of the tree as this run starts: what its record will credit."""
    global _start
    _start = {**tree_state(root), "started": _now(), "root": root}
    return _start


def tree_fields(root: Path = ROOT) -> tuple[dict, str]:
    """The record's tree fields, taken at `start()` and compared with the tree now, and the diff to keep beside the
    record ('' for a clean start). Without a `start()`, the tree at the end, with "started": null saying so."""
    now = tree_state(_start["root"] if _start else root)
    if _start is None:
        print("records: start() was not called; the record credits the commit at the end of the run", file=sys.stderr)
        return {"commit": now["commit"], "dirty": now["dirty"], "started": None}, now["diff"]
    changed = (now["commit"], now["diff"]) != (_start["commit"], _start["diff"])
    fields = {"commit": _start["commit"], "dirty": _start["dirty"], "started": _start["started"],
              "tree_changed_during_run": changed}
    if changed:
        fields.update(commit_at_end=now["commit"], dirty_at_end=now["dirty"])
    return fields, _start["diff"]


# ----------------------------------------------------------------------------- a drafter, named by content
def drafter_folder(name: str | Path) -> Path | None:
    """The local folder of a drafter given as a folder, or as a hub id already in the local cache; else None."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name), local_files_only=True))
    except Exception:  # not a hub id, or not downloaded: nothing to hash, and no value invented
        return None


def drafter_sha256(name: str | Path) -> str | None:
    """sha256 over a drafter folder's config.json and safetensors files (subfolders too: a Medusa-2 export's tuned
    target), each fed as its relative path then its bytes, in sorted path order; None without such files."""
    folder = drafter_folder(name)
    if folder is None:
        return None
    files = sorted((path for path in folder.rglob("*")
                    if path.is_file() and (path.name == "config.json" or path.suffix == ".safetensors")),
                   key=lambda path: path.relative_to(folder).as_posix())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- the record
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


def record(bench: str, result: dict, tree: dict | None = None) -> dict:
    """The record of this run of `bench`: what ran (command, the tree it started from, machine, versions, dates)
    and `result`. `tree`: the tree's fields (`tree_fields()` when not given)."""
    return {"schema": SCHEMA, "bench": bench, "command": command_line(),
            **(tree if tree is not None else tree_fields()[0]),
            "date": _now(),
            "machine": machine(),
            "versions": {"python": platform.python_version(), "torch": _version("torch"),
                         "transformers": _version("transformers")},
            "result": result}


def write(bench: str, result: dict, args: argparse.Namespace | None = None, results: Path = RESULTS) -> Path | None:
    """Write this run's record under results/<bench>/ atomically (temp file + rename), and beside it the diff of a
    dirty start; nothing with --no-record."""
    if args is not None and not getattr(args, "record", True):
        return None
    if str(ROOT) not in sys.path:  # this tree's draftsmith, for benches that only put bench/ on the path
        sys.path.insert(0, str(ROOT))
    from draftsmith.files import write_atomically

    tree, diff = tree_fields()
    entry = record(bench, result, {**tree, "diff": None})  # "diff" beside the commit it is against
    stamp = entry["date"].replace("-", "").replace(":", "")
    path = results / bench / f"{stamp}-{(entry['commit'] or 'nocommit')[:8]}.json"
    entry["diff"] = path.with_suffix(".diff").name if diff else None
    # a round trip through JSON first: a result that cannot be written must fail before a file is touched
    text = json.dumps(json.loads(json.dumps(entry, default=str)), indent=1, sort_keys=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if diff:  # on disk before the record that names it
        write_atomically(path.with_suffix(".diff"), diff)
    write_atomically(path, text)
    print(f"record: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
    return path
