"""File helpers every step shares: writes a reader never sees half-done, JSON read with errors a user can act on, a
run's results beside its report pages, file hashes, and the cache folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.errors import DraftsmithError


def write_atomically(path: str | Path, data: bytes | str) -> None:
    """Write `data` so readers see the old file or the new one, never a part of it, even after a crash:
    write a temporary file beside it, fsync, rename over `path`, fsync the folder."""
    path = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(blob)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def replace_folder(staging: str | Path, destination: str | Path) -> None:
    """Move a finished folder into place by rename; an older folder there is removed only afterwards."""
    staging, destination = Path(staging), Path(destination)
    if not destination.exists():
        os.replace(staging, destination)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old-", dir=destination.parent))
    os.replace(destination, retired / destination.name)
    os.replace(staging, destination)
    shutil.rmtree(retired, ignore_errors=True)


def read_json(path: str | Path, missing: str, fmt: str | None = None, named: str = "") -> Any:
    """The JSON in `path`: an error saying `missing` when there is no such file, its line when it is not JSON, and with
    `fmt` one naming what it is not (`named`, e.g. "a draftsmith traces file") when its "format" is another."""
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(missing)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"{path}:{err.lineno}: not valid JSON ({err.msg}).") from None
    if fmt is not None and data.get("format") != fmt:
        raise DraftsmithError(f"'{path}' is not {named} (format {data.get('format')!r}, expected {fmt}).")
    return data


def write_results(out: str | Path, results: dict, pages: dict[str, Callable[[dict], str]],
                  indent: int = 2) -> dict[str, Path]:
    """results.json in `out` (created), then each page (file name -> its render from the results), written after it so
    that a page which fails to render leaves the results on disk. Returns the paths by kind: json, md, html."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json"}
    paths["json"].write_text(json.dumps(results, indent=indent, default=str) + "\n")
    for name, render in pages.items():
        path = paths[Path(name).suffix[1:]] = out / name
        path.write_text(render(results))
    return paths


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    """Where draftsmith keeps derived files (dequantized GGUF weights, built-in prompt sets): $DRAFTSMITH_CACHE, else
    draftsmith/ under $XDG_CACHE_HOME or ~/.cache."""
    if os.environ.get("DRAFTSMITH_CACHE"):
        return Path(os.environ["DRAFTSMITH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "draftsmith"
