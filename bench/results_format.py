"""How the rendered pages write figures and tables: numbers with fixed digits (a page is a pure function of the
records, the same in any clone) and markdown tables whose cells stay short (prose goes below a table, not in it)."""

from __future__ import annotations

import re

CELL_LIMIT = 300
"""the most characters a rendered table cell may hold; a longer one becomes a note below its table"""


def fmt(value, digits: int = 2, suffix: str = "") -> str:
    """A number with fixed digits; '–' for a missing one."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}{suffix}" if abs(value) >= 10000 else f"{value}{suffix}"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def pct(value, digits: int = 1) -> str:
    """A fraction as a percentage; '–' for a missing one."""
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def human_bytes(count: float) -> str:
    """A byte count in decimal units (KB = 1000 B)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if count < 1000 or unit == "PB":
            return f"{count:.1f} {unit}"
        count /= 1000
    return ""


def identical(count, total) -> str:
    """'count/total' outputs identical to plain decoding; '–' when not counted."""
    return "–" if count is None else f"{count}/{total}"


def short_hash(sha256: str | None) -> str:
    """The first 12 hex digits of a drafter's content hash; '–' for a record that names none (made before drafters
    were hashed, or of a drafter with no local folder): never a value the record does not hold."""
    return f"`{sha256[:12]}`" if sha256 else "–"


def short_commit(entry: dict) -> str:
    """A record's commit in 8 hex digits, marked where the tree it started from had uncommitted changes."""
    return (entry.get("commit") or "unknown")[:8] + (" (dirty)" if entry.get("dirty") else "")


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table of cells written as given (format them first); a cell over CELL_LIMIT characters is
    replaced by "note N" and written as a numbered note below the table."""
    notes: list[str] = []

    def cell(value) -> str:
        text = str(value).replace("|", "\\|")
        if len(text) <= CELL_LIMIT:
            return text
        notes.append(text)
        return f"note {len(notes)}"

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return lines + [""] + [line for number, text in enumerate(notes, 1) for line in (f"Note {number}: {text}", "")]


def long_cells(text: str, limit: int = CELL_LIMIT) -> list[tuple[int, int]]:
    """(line number, length) of every markdown table cell in `text` longer than `limit` characters."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]  # an escaped \| is inside a cell
            found += [(number, len(cell.strip())) for cell in cells if len(cell.strip()) > limit]
    return found
