"""Render docs/results.md and the README's families table from the records under results/ (bench/records.py).

    python bench/render_results.py            # write docs/results.md and the README's families table
    python bench/render_results.py --check    # exit 1 when either is not what the records render, or has a long cell
    python bench/render_results.py --stale    # per bench: did the code it measures change since its record?

The work is split by job: results_load.py reads the records and chooses which a page shows; results_tables.py has
one table function per canonical bench; results_verdicts.py gives each bench's goals over all its runs;
results_page.py puts them together into the pages (results_format.py formats figures and tables for all of them).
This file is the command line, and the staleness check, which alone reads the current commit.

Staleness is not on the page, by choice. A note computed against the current HEAD would make the page a function
of the commit it is read at: every commit touching draftsmith/ would turn the committed page wrong (and `--check`
red) without any record changing, or `--check` would have to recompute the notes and so could never catch a page
that disagrees with them. Instead the page is a pure function of the records (deterministic, the same in any
clone), states each table's commit and whether its tree was dirty, and `--stale` answers "is this still true of
the code now?" at the moment it is asked: per bench, the files it depends on (draftsmith/, its own script,
bench/common.py, and recipes/ for the benches that train from them) that changed between the record's commit and
HEAD (`git diff --name-only <commit> HEAD -- <paths>`), or that the commit is not in this clone.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the results_* modules beside this file

from results_format import CELL_LIMIT, long_cells  # noqa: E402
from results_load import RESULTS, ROOT, latest_records, script  # noqa: E402
from results_page import CANONICAL, README, README_END, README_START, render, render_readme  # noqa: E402

PAGE = ROOT / "docs" / "results.md"


# ----------------------------------------------------------------------------- staleness, asked at run time
def watched(bench: str) -> list[str]:
    """The paths whose change can change what `bench` measures."""
    paths = ["draftsmith", f"bench/{script(bench)}.py", "bench/common.py"]
    uses_families = bench in ("parallel_drafting", "levers", "levers_dflash")
    paths += ["bench/families.py"] if uses_families else []
    recipes = uses_families or bench in ("families", "eagle3_smollm2", "general_mix", "dflash_peer", "parity")
    return paths + (["recipes"] if recipes else [])


def _git(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=False)


def staleness(entry: dict, head: str = "HEAD") -> str:
    """One line: whether the files `entry`'s bench depends on changed between its commit and `head`."""
    commit, bench = entry.get("commit"), entry.get("bench")
    if not commit or _git("cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return f"{bench}: cannot tell (commit {(commit or 'unknown')[:8]} is not in this clone)"
    changed = _git("diff", "--name-only", commit, head, "--", *watched(bench)).stdout.split()
    dirty = " (and it was measured on a tree with uncommitted changes)" if entry.get("dirty") else ""
    if not changed:
        return f"{bench}: current, nothing under {', '.join(watched(bench))} changed since {commit[:8]}{dirty}"
    return (f"{bench}: STALE, {len(changed)} file(s) under {', '.join(watched(bench))} changed since {commit[:8]} "
            f"(e.g. {', '.join(changed[:3])}){dirty}")


# ----------------------------------------------------------------------------- the command line
def rendered_part(text: str) -> str:
    """What this script writes of a page: all of docs/results.md, only the README's block."""
    return text.split(README_START, 1)[1].split(README_END, 1)[0] if README_START in text else text


def check(pages: dict[Path, str], results: Path) -> int:
    """0 when every page is what the records render and no rendered table cell is over CELL_LIMIT characters."""
    wrong = [str(path) for path, text in pages.items() if not path.is_file() or path.read_text() != text]
    if wrong:
        print(f"{' and '.join(wrong)} not what {results} renders: run python bench/render_results.py", file=sys.stderr)
    long = [f"{path} ({length} characters in its line {line} of the rendered part)" for path, text in pages.items()
            for line, length in long_cells(rendered_part(text))]
    if long:
        print(f"rendered table cells over {CELL_LIMIT} characters: {', '.join(long)}", file=sys.stderr)
    typed = [f"{path.relative_to(ROOT)}:{line} ({length})" for path in sorted((ROOT / "docs").glob("*.md"))
             if path not in pages for line, length in long_cells(path.read_text())]
    if typed:  # not this script's to fix, and so not a failure: said so that whoever edits those pages sees it
        print(f"note: hand-written table cells over {CELL_LIMIT} characters (prose belongs below a table): "
              f"{', '.join(typed)}", file=sys.stderr)
    return 1 if wrong or long else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records' folder (default: results/)")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write or check (default: docs/results.md)")
    parser.add_argument("--readme", type=Path, default=README,
                        help="the README whose families table is rendered too (default: README.md)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the page or the README's table differs from what the records render, or "
                             f"holds a table cell over {CELL_LIMIT} characters")
    parser.add_argument("--stale", action="store_true", help="per canonical bench, whether its record is stale at HEAD")
    args = parser.parse_args()
    if args.stale:
        records = latest_records(args.results)
        for bench in CANONICAL:
            print(staleness(records[bench]) if bench in records else f"{bench}: no record")
        return 0
    pages = {args.page: render(args.results), args.readme: render_readme(args.readme.read_text(), args.results)}
    if args.check:
        return check(pages, args.results)
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
