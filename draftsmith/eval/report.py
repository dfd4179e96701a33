"""Writing an eval run to disk: results.json, report.md and a self-contained report.html.

The HTML embeds its matplotlib plots as base64 PNG, so the one file can be mailed or attached.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from draftsmith.files import write_results


def write_report(results: dict, out: str | Path) -> dict[str, Path]:
    """Write the three files into `out`; return their paths."""
    return write_results(out, results, {"report.md": markdown, "report.html": lambda r: html_page(r, plots(r))})


# --------------------------------------------------------------------------- numbers as text
def _num(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def ratio(value) -> str:
    """A speedup as `1.23×`; a missing one (a baseline not timed) as plain `n/a`, with no × after it."""
    return "n/a" if value is None else f"{value:.2f}×"


def _dist(d: dict) -> str:
    return f"{_num(d['mean'], 1)} (p50 {_num(d['p50'], 1)}, p90 {_num(d['p90'], 1)})"


def summary_rows(results: dict) -> list[tuple[str, str]]:
    """(metric, value) pairs shown at the top of both reports."""
    baselines = results.get("baselines", {})
    rows = [
        ("acceptance length τ", _num(results["acceptance_length"])),
        ("per-position acceptance α", ", ".join(_num(a) for a in results["acceptance_per_position"]) or "n/a"),
        ("speedup vs our plain loop", ratio(results["speedup"])),
        ("speedup vs transformers generate()", ratio(results["speedup_vs_transformers"])),
        ("our plain loop vs generate()", ratio(results.get("plain_vs_transformers"))),
        ("tokens/s speculative (overall)", _num(results["tokens_per_s"]["overall"], 1)),
        ("tokens/s plain", _num(baselines.get("plain", {}).get("tokens_per_s"), 1)),
        ("tokens/s generate()", _num(baselines.get("transformers", {}).get("tokens_per_s"), 1)),
        ("TTFT ms", _dist(results["ttft_ms"])),
        ("TPOT ms", _dist(results["tpot_ms"])),
        ("end-to-end ms", _dist(results["e2e_ms"])),
        ("draft time fraction", _num(results["draft_time_fraction"], 3)),
        ("lossless (identical / checked)", f"{results['lossless']['identical']} / {results['lossless']['checked']}"),
    ]
    assisted = results.get("assisted_generate")
    if assisted:  # a draft LM: the same model in transformers' assisted generation
        rows += [("generate(assistant_model) vs generate()", ratio(assisted["speedup_vs_transformers"])),
                 ("ours vs generate(assistant_model)", ratio(assisted["ours_vs_assisted"])),
                 ("generate(assistant_model) identical to plain", f"{assisted['identical_to_plain']} / "
                  f"{results['lossless']['checked']}")]
    tuned = results.get("tuned_target")
    if tuned:  # Medusa-2: the tuned target verified, so lossless means identical to the tuned target's plain output
        rows += [("verified by", "the drafter's tuned target (Medusa-2), not the original"),
                 ("drift: tuned plain output identical to original target's",
                  f"{tuned['identical_to_original']} / {tuned['checked']} (token agreement "
                  f"{_num(tuned['token_agreement'], 3)})")]
    return rows


CATEGORY_COLUMNS = ("category", "prompts", "τ", "α per position", "speedup vs our plain loop", "draft time fraction",
                    "identical")


def category_rows(results: dict) -> list[tuple[str, ...]]:
    """One row per prompt category (CATEGORY_COLUMNS), then the overall figures; none without categories."""
    table = results.get("per_category") or {}
    if not table:
        return []
    rows = [(name, str(row["prompts"]), _num(row["acceptance_length"]),
             ", ".join(_num(a) for a in row.get("acceptance_per_position", [])) or "n/a", ratio(row["speedup"]),
             _num(row.get("draft_time_fraction"), 3), f"{row.get('identical_to_plain', 'n/a')} / {row['prompts']}")
            for name, row in table.items()]
    checked = results["lossless"]["checked"]
    return rows + [("all", str(checked), _num(results["acceptance_length"]),
                    ", ".join(_num(a) for a in results["acceptance_per_position"]) or "n/a",
                    ratio(results["speedup"]), _num(results["draft_time_fraction"], 3),
                    f"{results['lossless']['identical']} / {checked}")]


def methods_markdown(results_by_method: dict[str, dict]) -> str:
    """Several methods' results (drafter, suffix, hybrid ...) on the same prompts, one row each, in Markdown."""
    lines = ["| method | τ | speedup vs our plain loop | tokens/s | draft time fraction | lossless |",
             "|---|---|---|---|---|---|"]
    for name, results in results_by_method.items():
        if "skipped" in results:  # a method this target cannot run (train.pipeline.final_report)
            lines.append(f"| {name} | skipped: {results['skipped']} | | | | |")
            continue
        lines.append(f"| {name} | {_num(results['acceptance_length'])} | {ratio(results['speedup'])} | "
                     f"{_num(results['tokens_per_s']['overall'], 1)} | {_num(results['draft_time_fraction'], 3)} | "
                     f"{results['lossless']['identical']} / {results['lossless']['checked']} |")
    return "\n".join(lines) + "\n"


def markdown(results: dict) -> str:
    """The report as Markdown: summary table, run description, per-prompt table, definitions."""
    lines = ["# draftsmith eval", "", "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in summary_rows(results)]
    lines += ["", "## Run", "", "```json", json.dumps({k: results.get(k) for k in ("target", "drafter", "config", "environment")},
                                                     indent=2, default=str), "```", ""]
    categories = category_rows(results)
    if categories:
        lines += ["## By category", "", "| " + " | ".join(CATEGORY_COLUMNS) + " |", "|" + "---|" * len(CATEGORY_COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in categories] + [""]
    lines += ["## Per prompt", "", "| prompt | new tokens | τ | speedup | identical |", "|---|---|---|---|---|"]
    for row in results.get("per_prompt", []):
        lines.append(f"| {row['name']} | {row['new_tokens']} | {_num(row['acceptance_length'])} | "
                     f"{_num(row['speedup'])} | {row['identical_to_plain']} |")
    lines += ["", "## Definitions", ""]
    lines += [f"- **{name}**: {text}" for name, text in results.get("definitions", {}).items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots
def plots(results: dict) -> dict[str, str]:
    """Four plots as base64 PNG: accepted-length histogram, per-position acceptance, per-prompt speedup, latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images = {}
    per_prompt = results.get("per_prompt", [])
    figures = {
        "Accepted drafted tokens per verify pass": lambda ax: (
            ax.bar(range(len(results["accept_length_histogram"])), results["accept_length_histogram"]),
            ax.set_xlabel("accepted tokens"), ax.set_ylabel("verify passes")),
        "Per-position acceptance": lambda ax: (
            ax.plot(range(1, len(results["acceptance_per_position"]) + 1), results["acceptance_per_position"], marker="o"),
            ax.set_xticks(range(1, len(results["acceptance_per_position"]) + 1)),
            ax.set_ylim(0, 1.05), ax.set_xlabel("draft position"), ax.set_ylabel("α")),
        "Per-prompt speedup vs plain": lambda ax: (
            ax.bar(range(len(per_prompt)), [r["speedup"] for r in per_prompt]),
            ax.axhline(1.0, color="gray", linestyle="--"), ax.set_xlabel("prompt"), ax.set_ylabel("speedup")),
        "End-to-end latency per request": lambda ax: (
            ax.hist([[r["speculative_ms"] for r in per_prompt], [r["plain_ms"] for r in per_prompt]],
                    label=["speculative", "plain"], bins=max(3, min(20, len(per_prompt)))),
            ax.legend(), ax.set_xlabel("ms"), ax.set_ylabel("requests")),
    }
    categories = results.get("per_category") or {}
    if categories:  # speedup per category beside the overall figure
        names = list(categories)
        figures["Speedup vs plain by category"] = lambda ax: (
            ax.bar(range(len(names) + 1), [categories[n]["speedup"] or 0.0 for n in names] + [results["speedup"] or 0.0],
                   color=["C0"] * len(names) + ["C1"]),
            ax.set_xticks(range(len(names) + 1), names + ["all"], rotation=45, ha="right"),
            ax.axhline(1.0, color="gray", linestyle="--"), ax.set_ylabel("speedup"))
    for title, draw in figures.items():
        figure, axis = plt.subplots(figsize=(5.5, 3.4))
        draw(axis)
        axis.set_title(title)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90)
        plt.close(figure)
        images[title] = base64.b64encode(buffer.getvalue()).decode()
    return images


def html_page(results: dict, images: dict[str, str]) -> str:
    """One HTML file: summary table, embedded plots, the run description and the definitions."""
    rows = "".join(f"<tr><td>{html.escape(n)}</td><td>{html.escape(v)}</td></tr>" for n, v in summary_rows(results))
    figures = "".join(f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"></figure>'
                      for t, b in images.items())
    run = html.escape(json.dumps({k: results.get(k) for k in ("target", "drafter", "config", "environment")},
                                 indent=2, default=str))
    definitions = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                          for k, v in results.get("definitions", {}).items())
    categories = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                         for row in [CATEGORY_COLUMNS, *category_rows(results)])
    categories = f"<h2>By category</h2><table>{categories}</table>" if results.get("per_category") else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>draftsmith eval</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td{{border:1px solid #ccc;padding:4px 10px}}figure{{display:inline-block;margin:6px}}pre{{background:#f6f6f6;padding:1em}}</style>
</head><body><h1>draftsmith eval</h1>
<table>{rows}</table>
{categories}
<h2>Plots</h2>{figures}
<h2>Run</h2><pre>{run}</pre>
<h2>Definitions</h2><ul>{definitions}</ul>
</body></html>
"""
