"""Reading the records under results/ (bench/records.py writes them) and choosing which of them a page shows."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

SCRIPTS = {"hybrid_by_category": "hybrid", "levers_dflash": "levers"}
"""records whose bench is not their script's name: bench/hybrid.py writes HumanEval and by-category records,
bench/levers.py one bench per recipe whose data the arms train on"""
EVERY_RECORD = ("levers", "levers_dflash", "parallel_drafting")
"""benches whose records each compare other arms or settings (one lever's verdict, one chain length, does not
replace another): every record rendered, newest first"""


def script(bench: str) -> str:
    """The bench/ script (without .py) that writes `bench`'s records."""
    return SCRIPTS.get(bench, bench)


def all_records(results: Path = RESULTS) -> dict[str, list[dict]]:
    """Every record of each bench under `results`, newest first (by its date, then by file name)."""
    found = {}
    for path in sorted(results.glob("*/*.json")):
        entry = json.loads(path.read_text())
        if entry.get("bench"):
            found.setdefault(entry["bench"], []).append(((entry.get("date", ""), path.name), entry))
    return {bench: [entry for _, entry in sorted(keyed, key=lambda pair: pair[0], reverse=True)]
            for bench, keyed in found.items()}


def latest_records(results: Path = RESULTS) -> dict[str, dict]:
    """The latest record of each bench under `results` (latest by its date, then by file name)."""
    return {bench: entries[0] for bench, entries in all_records(results).items()}


# ----------------------------------------------------------------------------- the families bench
def family_names(entry: dict) -> set[str]:
    """The families a families record trained."""
    return set(entry.get("result", {}).get("families", {}))


def current_families(entries: list[dict]) -> list[dict]:
    """The families records (newest first) that no newer one replaces: a rerun of some families (one family's
    trainer fixed) replaces only a record whose families it all reran, so the comparison of every family stays."""
    kept = []
    for index, entry in enumerate(entries):
        if not any(family_names(entry) <= family_names(newer) for newer in entries[:index]):
            kept.append(entry)
    return kept


def runs_every_family(entry: dict) -> bool:
    """Whether a families record is a run of the whole bench: its command chose no subset with --families (the
    bench's default is every family), so it compares every family the bench had at that commit."""
    arguments = shlex.split(entry.get("command") or "")
    return not any(argument == "--families" or argument.startswith("--families=") for argument in arguments)


def newest_whole_families_run(entries: list[dict]) -> dict | None:
    """The newest record of the whole families bench (`runs_every_family`), whatever its budget; None if none.
    `entries`: the families records, newest first."""
    return next((entry for entry in entries if runs_every_family(entry)), None)


# ----------------------------------------------------------------------------- what a section shows
def shown(bench: str, entries: list[dict]) -> list[dict]:
    """The records of `bench` the page renders, newest first."""
    if bench in EVERY_RECORD:
        return entries
    return current_families(entries) if bench == "families" else entries[:1]
