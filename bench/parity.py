"""The same drafters decoded by an older commit's code and by the current commit's, side by side: same drafts?

    .venv/bin/python bench/parity.py --against 2becfc6 --num-prompts 6 --max-new-tokens 48

A refactor of the drafters must not change a single draft. Both sides are `git worktree`s in a temporary folder
(removed at the end): old = --against, new = the commit this run started from (records.start()), so edits others
make to the working tree during the run enter neither side. Each side runs `python -m draftsmith` with the same
.venv python, its working directory and PYTHONPATH set to its worktree (each side's `draftsmith.__file__` is printed
and checked). The new side trains one small drafter per family (`draftsmith train recipes/smollm2-135m/<family>.yaml`
of its tree: --steps steps, no time budget, the recipe's data folders moved under OUT, --set on top; a family
whose OUT/drafters/<family>/best exists is reused unless --retrain). Every method is then decoded by the old code and
the new at the same time (two processes under the same load, so their speedups over their own plain loops compare)
on the first --num-prompts of each prompt set, greedy: suffix matching and prompt lookup first, then each family as
soon as it is trained: the first family in the hybrid with suffix matching, as a chain and as an EAGLE-2 tree, every
other family as a chain of its recipe's report length. Chains are whole (--fallback false, --confidence-cut false), suffix, prompt lookup and the hybrid do
not adapt their lengths or skip the drafter by measured cost (--no-adaptive-lookup), and torch's own linear layers
run (--no-small-batch-linear: the small-batch forms are chosen by timing and round otherwise), so nothing a draft
depends on is timed.

Compared per method: outputs identical to plain decoding on each side (the lossless count), τ, per-position
acceptance and accepted counts, the accepted-length histogram, verify passes, new tokens, and every verify cycle's
drafted / accepted / emitted counts per prompt (--save-traces): these must be equal. Speedups over each side's own
plain loop are shown beside them (timings, not compared). A drafter the old code cannot read is reported as a
format change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # bench/: the shared command line and the run's record

ROOT = Path(__file__).resolve().parents[1]
RECIPES = Path("recipes") / "smollm2-135m"  # inside each side's tree
FAMILIES = ["eagle3", "peagle", "eagle1", "medusa1", "medusa2", "mtp", "dflash", "dspark", "draft-lm"]
TRAINING_FREE = ["suffix", "prompt lookup"]
DETERMINISTIC = ("lossless", "acceptance_length", "acceptance_per_position", "accepted_per_position",
                 "accept_length_histogram", "verify_passes", "new_tokens", "cycles")
"""what greedy decoding of the same drafter must give equal on both sides (everything but timings)"""


# ----------------------------------------------------------------------------- comparing two sides
def figures(results: dict, traces: dict | None) -> dict:
    """What one side's `draftsmith eval` measured of a method: the deterministic figures (DETERMINISTIC) and the
    timings shown beside them. Per-position accepted counts come from the histogram (position i is accepted by
    every pass that accepted i or more drafted tokens); cycles are (drafted, accepted, emitted) per verify pass."""
    histogram = results.get("accept_length_histogram") or []
    lossless = results.get("lossless") or {}
    cycles = None
    if traces is not None:
        main = traces.get("main")
        cycles = {prompt["name"]: [cycle[:3] for cycle in prompt["runs"][main]["cycles"]]
                  for prompt in traces.get("prompts", [])}
    return {"lossless": [lossless.get("identical"), lossless.get("checked")],
            "acceptance_length": results.get("acceptance_length"),
            "acceptance_per_position": results.get("acceptance_per_position"),
            "accepted_per_position": [sum(histogram[i:]) for i in range(1, len(histogram))],
            "accept_length_histogram": histogram, "verify_passes": results.get("verify_passes"),
            "new_tokens": results.get("new_tokens"), "cycles": cycles,
            "speedup": results.get("speedup"), "tokens_per_s": (results.get("tokens_per_s") or {}).get("overall"),
            "plain_tokens_per_s": ((results.get("baselines") or {}).get("plain") or {}).get("tokens_per_s")}


def compare(old: dict, new: dict) -> dict:
    """Whether two sides' figures of a method agree: `equal` over every DETERMINISTIC field, the fields that differ,
    and for cycles the first prompt and cycle where they part. A side that did not run (an error) is not equal."""
    if "error" in old or "error" in new:
        return {"equal": False, "differences": ["error"]}
    differences = [key for key in DETERMINISTIC if old.get(key) != new.get(key)]
    verdict = {"equal": not differences, "differences": differences}
    if "cycles" in differences and old.get("cycles") and new.get("cycles"):
        for name in sorted(set(old["cycles"]) | set(new["cycles"])):
            a, b = old["cycles"].get(name) or [], new["cycles"].get(name) or []
            if a != b:
                index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                verdict["first_difference"] = {"prompt": name, "cycle": index, "old": a[index:index + 3],
                                               "new": b[index:index + 3]}
                break
    return verdict


def compact(side: dict) -> dict:
    """A side's figures for the record: its cycles as their count and a sha256 (equal cycles, equal hashes; the
    cycles themselves stay in OUT/bench.json)."""
    if not side.get("cycles"):
        return side
    text = json.dumps(side["cycles"], sort_keys=True).encode()
    return {**side, "cycles": {"count": sum(len(cycles) for cycles in side["cycles"].values()),
                               "sha256": hashlib.sha256(text).hexdigest()}}


# ----------------------------------------------------------------------------- the two sides
@contextmanager
def worktree(revision: str):
    """A detached `git worktree` of `revision` in a temporary folder, removed (with its git bookkeeping) on exit."""
    folder = Path(tempfile.mkdtemp(prefix="draftsmith-parity-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), revision], cwd=ROOT, check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, check=False)
        shutil.rmtree(folder.parent, ignore_errors=True)


def side_environment(tree: Path) -> dict:
    """The environment that makes `python -m draftsmith` import the package of `tree` (run with cwd=tree too)."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def imported_from(tree: Path) -> str:
    """The draftsmith/__init__.py that `python` imports on that side; refuse a side that imports another tree."""
    done = subprocess.run([sys.executable, "-c", "import draftsmith; print(draftsmith.__file__)"], cwd=tree,
                          env=side_environment(tree), capture_output=True, text=True, check=True)
    path = Path(done.stdout.strip()).resolve()
    if not path.is_relative_to(tree.resolve()):
        raise SystemExit(f"the side at {tree} imports draftsmith from {path}, not from its own tree")
    return str(path)


def revision_of(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True,
                          check=True).stdout.strip()


# ----------------------------------------------------------------------------- drafters, trained by the new code
def recipe(tree: Path, family: str) -> dict:
    """A family's recipe as written in `tree` (read as YAML: neither side's code is imported here)."""
    import yaml

    return yaml.safe_load((tree / RECIPES / f"{family}.yaml").read_text())


def moved_folder(value: str | None, out: Path) -> str | None:
    """A recipe's data folder (runs/{target}/X) moved to OUT/X; None stays None."""
    return None if not value else str(out / Path(value).name)


def train_options(written: dict, family: str, out: Path, steps: int, extra: list[str]) -> list[str]:
    """The `draftsmith train` overrides of a family (`written`: its recipe): its folders under OUT, a step budget
    and no time budget, one validation (which keeps best/) at the last step, no report, then `extra`."""
    data = written.get("data") or {}
    folders = [f"output_dir={out / 'drafters' / family}"]
    folders += [f"data.{key}={moved_folder(data[key], out)}" for key in ("prepared", "draft_vocab", "features")
                if data.get(key)]
    return [*folders, f"train.max_steps={steps}", "train.max_minutes=0", f"train.eval_every={steps}",
            f"train.checkpoint_every={steps}", "eval.num_prompts=0", "eval.batches=2", "report.num_prompts=0",
            "tracking.report_to=[]", *extra]


def train_family(tree: Path, family: str, out: Path, steps: int, extra: list[str], retrain: bool) -> dict:
    """Train a family with the code of `tree` (or reuse OUT/drafters/<family>/best); its folder, hash and steps."""
    run = out / "drafters" / family
    trained = retrain or not (run / "best").is_dir()
    options = train_options(recipe(tree, family), family, out, steps, extra)
    if trained:
        shutil.rmtree(run, ignore_errors=True)
        command = [sys.executable, "-m", "draftsmith", "train", str(RECIPES / f"{family}.yaml"), *options]
        print("+", f"[{tree}]", " ".join(command[1:]), flush=True)
        done = subprocess.run(command, cwd=tree, env=side_environment(tree), stderr=subprocess.PIPE, text=True)
        if done.returncode:  # reported, and the other families still run
            print(done.stderr[-3000:], file=sys.stderr, flush=True)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return {"error": lines[-1] if lines else f"exit {done.returncode}", "options": options}
    training = json.loads((run / "training.json").read_text()) if (run / "training.json").is_file() else {}
    return {"folder": str(run / "best"), "sha256": records.drafter_sha256(run / "best"), "steps": training.get("steps"),
            "trained_by_this_run": trained, "options": options}


# ----------------------------------------------------------------------------- methods, decoded on both sides
def training_free(lookup: int) -> dict:
    """method -> its `draftsmith eval` options: suffix matching and prompt lookup, whole drafts of `lookup` tokens."""
    return {"suffix": ["--drafter", "suffix", "--draft-length", str(lookup), "--no-adaptive-lookup"],
            "prompt lookup": ["--drafter", "prompt-lookup", "--draft-length", str(lookup), "--no-adaptive-lookup"]}


def methods_of(family: str, folder: str, kind: str, draft_length: int, first: bool, tree: str, lookup: int) -> dict:
    """method -> its `draftsmith eval` options for one family's drafter: the first family in the hybrid with suffix
    matching (suffix drafts of `lookup`, the drafter's chains of its length), as a chain and as a tree; any other
    family as a chain. Chains are whole: no fallback, no confidence cut (a draft LM has no confidences)."""
    cut = [] if kind == "draft_lm" else ["--confidence-cut", "false"]
    chain = {f"{family} chain ({draft_length})": ["--drafter", folder, "--draft-length", str(draft_length),
                                                  "--fallback", "false", *cut]}
    if not first:
        return chain
    return {f"{family} hybrid": ["--drafter", f"hybrid:{folder}", "--draft-length", str(lookup),
                                 "--hybrid-drafter-length", str(draft_length), "--no-adaptive-lookup", *cut],
            **chain, f"{family} tree ({tree})": ["--drafter", folder, "--tree", tree, *cut]}


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text).strip("-")


def decode(tree: Path, options: list[str], prompts: str, folder: Path, args) -> dict:
    """`draftsmith eval` of one method on one side; its figures, or the error that stopped it."""
    shutil.rmtree(folder, ignore_errors=True)
    command = [sys.executable, "-m", "draftsmith", "eval", "--target", "smollm2-135m-instruct", *options,
               "--prompts", prompts, "--num-prompts", str(args.num_prompts), "--max-new-tokens",
               str(args.max_new_tokens), "--threads", str(args.threads), "--no-transformers-baseline",
               "--no-small-batch-linear", "--save-traces", "--out", str(folder)]
    print("+", f"[{tree}]", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, cwd=tree, env=side_environment(tree), capture_output=True, text=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "eval.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    traces = folder / "traces.json"
    return figures(json.loads((folder / "results.json").read_text()),
                   json.loads(traces.read_text()) if traces.is_file() else None)


# ----------------------------------------------------------------------------- the table
def cell(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def print_table(rows: dict) -> None:
    print(f"\n{'method':<26} {'prompts':<14} {'old τ':>6} {'new τ':>6} {'old ll':>6} {'new ll':>6} "
          f"{'old ×':>6} {'new ×':>6}  equal  differences")
    for key, row in rows.items():
        old, new, verdict = row["old"], row["new"], row["comparison"]
        lossless = ["/".join(map(str, side["lossless"])) if "lossless" in side else "err" for side in (old, new)]
        print(f"{row['method']:<26} {row['prompts']:<14} {cell(old.get('acceptance_length')):>6} "
              f"{cell(new.get('acceptance_length')):>6} {lossless[0]:>6} {lossless[1]:>6} "
              f"{cell(old.get('speedup'), 2):>6} {cell(new.get('speedup'), 2):>6}  "
              f"{'yes' if verdict['equal'] else 'NO':<5}  {', '.join(verdict['differences'])}")
        for side in ("old", "new"):
            if "error" in row[side]:
                print(f"    {side}: {row[side]['error']}")


# ----------------------------------------------------------------------------- the run
def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default="2becfc6", help="the older revision whose code decodes the same drafters")
    parser.add_argument("--families", nargs="*", default=FAMILIES,
                        help="recipes of recipes/smollm2-135m/ (without .yaml) to train and decode; the first one "
                             "also drafts the tree and the hybrid; none: only suffix matching and prompt lookup")
    parser.add_argument("--steps", type=int, default=30, help="training steps per family (no time budget)")
    parser.add_argument("--set", nargs="*", metavar="SECTION.FIELD=VALUE",
                        default=["prepare.input=[builtin:stdlib]", "prepare.regenerate=false",
                                 "prepare.max_rows_per_input=16", "prepare.eval_fraction=0.25", "data.max_length=256"],
                        help="overrides of every family's training (default: 16 rows of builtin:stdlib as they are, "
                             "for every family, the default recipe's regenerated mix too: a parity check needs "
                             "drafters that draft, not good ones, and regeneration costs minutes of CPU)")
    parser.add_argument("--retrain", action="store_true", help="train every family again, even where OUT has one")
    parser.add_argument("--prompt-sets", nargs="+", default=["builtin:suite", "humaneval"],
                        help="prompt sets decoded (the first --num-prompts of each)")
    parser.add_argument("--tree", default="4,4,8", help="the first family's EAGLE-2 tree DEPTH,TOPK,TOTAL")
    parser.add_argument("--lookup-length", type=int, default=10,
                        help="suffix matching's and prompt lookup's draft length, and the hybrid's")
    parser.add_argument("--max-minutes", type=float, default=0,
                        help="start no decode after this many minutes of the run, training included (0 = none); the "
                             "methods left are recorded as not decoded")
    parser.add_argument("--methods", nargs="*", default=None, metavar="METHOD",
                        help="decode only the methods whose names start with one of these (default: all)")
    records.add_shared_options(parser, num_prompts=6, max_new_tokens=48, threads=1, out="runs/bench-parity",
                               helps={"num_prompts": "prompts of each prompt set (the first N)",
                                      "threads": "torch CPU threads of every eval, both sides",
                                      "out": "where the drafters, their data and both sides' evaluations go"})
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    start = records.start()  # the commit and diff this run is credited to, taken before it measures anything
    out, began = Path(args.out).resolve(), time.monotonic()
    rows, sides, skipped = {}, {}, []
    with worktree(args.against) as old_tree, worktree(start["commit"]) as new_tree:
        trees = {"old": old_tree, "new": new_tree}
        for name, tree in trees.items():
            sides[name] = {"commit": revision_of(tree), "draftsmith": imported_from(tree)}
            print(f"{name}: {sides[name]['commit'][:8]} imports {sides[name]['draftsmith']}", flush=True)
        def out_of_time() -> bool:
            return bool(args.max_minutes) and time.monotonic() - began > args.max_minutes * 60

        def decode_all(methods: dict) -> None:
            """Decode every method on every prompt set on both sides at once (same load: timings compare)."""
            for method, options in methods.items():
                if args.methods is not None and not method.startswith(tuple(args.methods)):
                    continue
                for prompts in args.prompt_sets:
                    if out_of_time():
                        skipped.append(f"{method} | {prompts}")
                        continue
                    row = {"method": method, "prompts": prompts, "options": options}
                    with ThreadPoolExecutor(2) as pool:
                        decoding = {side: pool.submit(decode, tree, options, prompts,
                                                      out / "eval" / side / slug(f"{method}-{prompts}"), args)
                                    for side, tree in trees.items()}
                    row.update({side: future.result() for side, future in decoding.items()})
                    row["comparison"] = compare(row["old"], row["new"])
                    rows[f"{method} | {prompts}"] = row
                    print_table({f"{method} | {prompts}": row})

        # what needs no training first, then each family trained and at once decoded: a run cut by --max-minutes
        # keeps whole comparisons of what it reached
        decode_all(training_free(args.lookup_length))
        trained = {}
        for index, family in enumerate(args.families):
            if out_of_time():
                trained[family] = {"error": "not trained: --max-minutes spent"}
                continue
            trained[family] = info = train_family(new_tree, family, out, args.steps, args.set, args.retrain)
            if "error" in info:
                print(f"{family}: not trained, not decoded: {info['error']}", flush=True)
                continue
            written = recipe(new_tree, family)
            decode_all(methods_of(family, info["folder"], (written.get("drafter") or {}).get("kind"),
                                  (written.get("report") or {}).get("draft_length", 4), index == 0, args.tree,
                                  args.lookup_length))
    print_table(rows)
    if skipped:
        print(f"not decoded (--max-minutes {args.max_minutes:g} spent): " + ", ".join(skipped))
    unreadable = sorted({row["method"] for row in rows.values()
                         if "error" in row["old"] and "error" not in row["new"]})
    if unreadable:
        print("the old code failed where the new one ran (a format change?): " + ", ".join(unreadable))
    result = {"against": args.against, "sides": sides, "families": trained, "steps": args.steps,
              "overrides": args.set, "prompt_sets": args.prompt_sets, "num_prompts": args.num_prompts,
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "tree": args.tree,
              "lookup_length": args.lookup_length, "rows": list(rows.values()),
              "equal": sum(row["comparison"]["equal"] for row in rows.values()), "compared": len(rows),
              "not_decoded": skipped}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1, default=str))  # every cycle, for a closer look
    records.write("parity", {**result, "rows": [{**row, "old": compact(row["old"]), "new": compact(row["new"])}
                                                for row in rows.values()]}, args)


if __name__ == "__main__":
    main()
