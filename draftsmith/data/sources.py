"""Reading conversation rows from jsonl / json / parquet files, `datasets` folders or names, and builtins.

Every reader yields `(source, line, row)`; a row that cannot even be parsed is yielded as a
`RowError` in place of the row so that the caller reports it with its file and line. Files that
cannot be read at all, or hold no rows, are a `DraftsmithError` (nothing sensible to continue with).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from draftsmith.data.templates import RowError
from draftsmith.errors import DraftsmithError

BUILTIN_PREFIX = "builtin:"
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_rows(spec: str) -> Iterator[tuple[str, int, object]]:
    """Rows of one input: a file, a folder (saved `datasets` or data files), `builtin:NAME`, or a hub name."""
    if spec.startswith(BUILTIN_PREFIX):
        from draftsmith.data import real
        from draftsmith.data.corpus import BUILTIN_CORPORA, builtin_corpus_path

        name = spec[len(BUILTIN_PREFIX):]
        if name not in (*BUILTIN_CORPORA, *real.builtin_names()) and name != "suite":
            known = ", ".join(f"builtin:{known}" for known in (*BUILTIN_CORPORA, *real.builtin_names()))
            raise DraftsmithError(f"Unknown built-in corpus '{spec}'. The built-in corpora are {known} (builtin:real "
                                  "and its parts: real text from installed packages, data/real.py).")
        # builtin:real and its parts: real text from installed packages (data/real.py); the others: corpus.py
        path = real.corpus_path(name) if name in real.builtin_names() else builtin_corpus_path(name)
        yield from _read_file(path, label=spec)
        return
    path = Path(spec).expanduser()
    if path.is_file():
        yield from _read_file(path)
    elif path.is_dir():
        yield from _read_folder(path)
    elif path.suffix in FILE_SUFFIXES or spec.startswith((".", "/", "~")):
        raise DraftsmithError(f"Input file '{spec}' does not exist. Check the path.")
    else:
        yield from _read_hub(spec)


def _read_file(path: Path, label: str | None = None) -> Iterator[tuple[str, int, object]]:
    label = label or str(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            rows = _parquet_rows(path)
        elif suffix == ".json":
            rows = _json_rows(path)
        else:  # .jsonl and anything else: one JSON object per line
            rows = _jsonl_rows(path)
        count = 0
        for line, row in rows:
            count += 1
            yield label, line, row
    except OSError as err:
        raise DraftsmithError(f"Cannot read input file '{label}': {err}.") from err
    if count == 0:
        raise DraftsmithError(f"Input file '{label}' is empty: it holds no rows.")


def _jsonl_rows(path: Path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as err:
                yield line_number, RowError(f"broken JSON: {err.msg} at column {err.colno}")


def _json_rows(path: Path):
    """A .json file: a list of rows (line = 1-based item index) or a single row object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"Input file '{path}' is not valid JSON: {err.msg} at line {err.lineno}.") from err
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    yield from enumerate(data if isinstance(data, list) else [data], start=1)


def _parquet_rows(path: Path):
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for broken files
        raise DraftsmithError(f"Cannot read parquet file '{path}': {type(err).__name__}: {err}.") from err
    yield from enumerate(table.to_pylist(), start=1)


def _read_folder(path: Path):
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            split = "train" if "train" in loaded else next(iter(loaded))
            loaded = loaded[split]
        yield from _dataset_rows(loaded, str(path))
        return
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in FILE_SUFFIXES)
    if not files:
        raise DraftsmithError(
            f"Folder '{path}' is neither a saved `datasets` folder nor holds .jsonl/.json/.parquet files."
        )
    for file in files:
        yield from _read_file(file)


def _read_hub(name: str):
    """`org/name` or `org/name:split` from the Hugging Face hub (or its local cache)."""
    import datasets

    name, _, split = name.partition(":")
    try:
        loaded = datasets.load_dataset(name, split=split or "train")
    except Exception as err:
        raise DraftsmithError(
            f"Input '{name}' is not a local file or folder, and loading it as a `datasets` name failed "
            f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}). Without "
            "network, pass a local .jsonl/.json/.parquet file, a saved dataset folder, or builtin:stdlib."
        ) from err
    yield from _dataset_rows(loaded, name)


def _dataset_rows(dataset, label: str):
    if len(dataset) == 0:
        raise DraftsmithError(f"Dataset '{label}' is empty: it holds no rows.")
    for index, row in enumerate(dataset, start=1):
        yield label, index, row
