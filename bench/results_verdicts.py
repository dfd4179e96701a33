"""Goal verdicts over repeated runs: a goal is a ratio one record's result gives and the value it must reach; the
verdict reads every record of the bench (each a run) and is given only from MIN_RUNS runs on: "met" when the median
ratio reaches the goal, else "missed", shown with the spread (min–max), the count, how many runs reached it and the
commit of every run. With fewer runs the page says so instead of a verdict: one run's figure is not a verdict."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from results_format import fmt, short_commit, short_hash, table

MIN_RUNS = 3


@dataclass(frozen=True)
class Goal:
    """One goal: `ratio(result)` (None where a record cannot give it) must be at least `threshold`, or above it
    when `strict`."""

    label: str
    ratio: Callable[[dict], float | None]
    threshold: float
    strict: bool = False

    def reached(self, value: float) -> bool:
        return value > self.threshold if self.strict else value >= self.threshold

    def text(self) -> str:
        return f"{self.label} {'>' if self.strict else '≥'} {self.threshold:g}"


# ----------------------------------------------------------------------------- the ratios, from one record's result
def _speedup(methods: dict, name: str) -> float | None:
    return methods.get(name, {}).get("speedup_vs_plain")


def hybrid_over_plain(result: dict) -> float | None:
    """The hybrid's speedup over plain decoding (bench/hybrid.py, overall)."""
    return _speedup(result.get("methods", {}), "hybrid")


def hybrid_over_better_single(result: dict) -> float | None:
    """The hybrid's speedup over the better of suffix matching alone and the drafter alone (overall)."""
    methods = result.get("methods", {})
    singles = [_speedup(methods, name) for name in ("suffix", "drafter")]
    hybrid = _speedup(methods, "hybrid")
    return hybrid / max(singles) if hybrid and all(singles) else None


def worst_category(result: dict) -> tuple[str, float] | None:
    """(category, ratio) where the hybrid's speedup over the better single method is lowest (per category)."""
    ratios = {name: row["hybrid"]["speedup"] / max(row["suffix"]["speedup"], row["drafter"]["speedup"])
              for name, row in result.get("per_category", {}).items()
              if all(row.get(m, {}).get("speedup") for m in ("hybrid", "suffix", "drafter"))}
    return min(ratios.items(), key=lambda pair: pair[1]) if ratios else None


def worst_category_ratio(result: dict) -> float | None:
    worst = worst_category(result)
    return worst[1] if worst else None


def mix_over_code_on_humaneval(result: dict) -> float | None:
    """The general-mix arm's HumanEval speedup over the code-only arm's (bench/general_mix.py)."""
    arms = result.get("arms", {})
    code, mix = (arms.get(arm, {}).get("humaneval", {}).get("speedup") for arm in ("code", "mix"))
    return mix / code if code and mix else None


def mix_over_code_worst_other_category(result: dict) -> float | None:
    """The lowest ratio of the mix arm's speedup to the code arm's over the suite's categories other than code."""
    arms = result.get("arms", {})
    code, mix = (arms.get(arm, {}).get("suite", {}).get("per_category", {}) for arm in ("code", "mix"))
    ratios = [mix[name]["speedup"] / code[name]["speedup"] for name in code
              if name != "code" and name in mix and code[name].get("speedup")]
    return min(ratios) if ratios else None


def largest_cache_over_per_request(result: dict) -> float | None:
    """The speedup of suffix matching with the largest cross-request cache over per-request suffix matching
    (bench/repeated_workload.py)."""
    methods = result.get("methods", {})
    cached = [row for row in methods.values() if row.get("cache")]
    per_request = methods.get("suffix, per request", {}).get("speedup")
    if not cached or not per_request:
        return None
    return max(cached, key=lambda row: row["cache"]["bound_tokens"])["speedup"] / per_request


GOALS: dict[str, tuple[Goal, ...]] = {  # bench -> its goals, as the bench's docstring states them
    "hybrid": (Goal("hybrid ÷ plain", hybrid_over_plain, 2.2),
               Goal("hybrid ÷ better single", hybrid_over_better_single, 1.2)),
    "hybrid_by_category": (Goal("worst category: hybrid ÷ its better single", worst_category_ratio, 0.97),),
    "general_mix": (Goal("HumanEval: mix ÷ code", mix_over_code_on_humaneval, 0.9),
                    Goal("worst category but code: mix ÷ code", mix_over_code_worst_other_category, 1.0, strict=True)),
    "repeated_workload": (Goal("largest cache ÷ per-request suffix", largest_cache_over_per_request, 1.0,
                               strict=True),),
}


# ----------------------------------------------------------------------------- the verdict, over runs
def verdict(goal: Goal, entries: list[dict]) -> dict:
    """The goal over every record in `entries` that gives its ratio: runs, median, min, max, how many reached it,
    and the verdict ("met", "missed", or "not enough runs (n=…)" below MIN_RUNS)."""
    values = [value for value in (goal.ratio(entry.get("result", {})) for entry in entries) if value is not None]
    if len(values) < MIN_RUNS:
        return {"runs": len(values), "verdict": f"not enough runs (n={len(values)})",
                "median": None, "min": min(values, default=None), "max": max(values, default=None),
                "reached": sum(goal.reached(value) for value in values)}
    median = statistics.median(values)
    return {"runs": len(values), "median": median, "min": min(values), "max": max(values),
            "reached": sum(goal.reached(value) for value in values),
            "verdict": "met" if goal.reached(median) else "missed"}


def goal_lines(bench: str, entries: list[dict]) -> list[str]:
    """The page's goals of `bench` over all its records (`entries`, newest first): one row per goal, then each run's
    ratios with its commit (and its drafter's hash where the bench names a drafter), oldest first."""
    goals = GOALS.get(bench)
    if not goals or not entries:
        return []
    lines = [f"Goals over runs: every record of this bench is one run; a verdict needs at least {MIN_RUNS} runs and "
             "is met when the median ratio reaches the goal.", ""]
    rows = []
    for goal in goals:
        found = verdict(goal, entries)
        spread = f"{fmt(found['min'])}–{fmt(found['max'])}" if found["runs"] else "–"
        rows.append([goal.text(), found["runs"], fmt(found["median"]), spread,
                     f"{found['reached']} of {found['runs']}", f"**{found['verdict']}**"])
    lines += table(["goal", "runs", "median", "min–max", "runs reaching it", "verdict"], rows)
    names_drafter = any("drafter" in entry.get("result", {}) for entry in entries)
    header = ["run ended", "commit"] + (["drafter sha256"] if names_drafter else []) + [g.label for g in goals]
    rows = []
    for entry in reversed(entries):
        result = entry.get("result", {})
        changed = " (tree changed during the run)" if entry.get("tree_changed_during_run") else ""
        rows.append([entry.get("date"), short_commit(entry) + changed]
                    + ([short_hash(result.get("drafter_sha256"))] if names_drafter else [])
                    + [fmt(goal.ratio(result), 3) for goal in goals])
    return lines + table(header, rows)
