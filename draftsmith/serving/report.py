"""Writing a `serve-sim run`: results.json and one self-contained report.html with latency–load plots."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from draftsmith.files import write_results
from draftsmith.serving.experiment import TOLERANCE

METRICS = [("e2e_ms", "mean"), ("e2e_ms", "p99"), ("ttft_ms", "p99"), ("tpot_ms", "mean")]
STYLES = {"off": ":", "fixed": "-", "adaptive": "--"}


def write(results: dict, out: str | Path) -> dict[str, Path]:
    """Write results.json, report.html and report.md into `out`; return their paths."""
    return write_results(out, results, {"report.html": page, "report.md": markdown}, indent=1)


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def check_lines(results: dict) -> list[str]:
    """The two validation checks as sentences (printed and at the top of the report)."""
    lines = []
    for label, check in results["validation"]["concurrency_1"].items():
        for mode, name in (("fixed", "speculative"), ("off", "plain")):
            row = check[mode]
            lines.append(f"concurrency 1, {label}, {name}: simulated vs measured eval E2E {_pct(row['error_total'])} "
                         f"over {len(check['prompts'])} prompts (worst prompt {_pct(row['error_max_prompt'])}) — "
                         f"{'PASS' if row['passed'] else 'FAIL'} (±{TOLERANCE:.0%})")
    batched = results["validation"]["batched_forwards"]
    if batched["passed"] is None:
        lines.append("batched forwards b=2..4: not checked (the profile holds no check)")
    else:
        lines.append(f"cost model vs real mixed batched forwards b=2..4: median |error| {batched['error_median']:.1%}, "
                     f"worst {_pct(batched['error_max'])} over {len(batched['rows'])} batches — "
                     f"{'PASS' if batched['passed'] else 'FAIL'} (±{TOLERANCE:.0%})")
    grid = results["validation"]["fit_on_grid"]
    lines.append(f"least-squares fit whose slopes extend the measured grid (inside it the model interpolates the "
                 f"measured points): decode median |error| {grid['decode_median']:.1%} "
                 f"(worst {grid['decode_max']:.1%}), prefill median {grid['prefill_median']:.1%} (worst {grid['prefill_max']:.1%})")
    return lines


def paying(row: dict) -> str:
    """Up to which rate speculation pays, in words, from a `break_even` row."""
    if row["pays_at_every_rate"]:
        return "pays at every simulated rate"
    if row.get("pays_at_no_rate"):
        return "pays at no simulated rate (slower than plain even at the lowest)"
    if not row["stops_paying_at_rate"]:
        return "n/a"
    return f"pays up to ≈{row['stops_paying_at_rate']:.3g} req/s (slower than plain above)"


def print_summary(results: dict) -> None:
    """Checks, break-even rates and the published comparison, on the terminal."""
    for line in check_lines(results):
        print(line)
    for label, row in results["break_even"].items():
        print(f"FCFS, {label}: speculation {paying(row)} (E2E ratio by rate: "
              + ", ".join(f"{r}: {q:.2f}" for r, q in zip(row["rates"], row["e2e_ratio_speculative_over_plain"])) + ")")


def markdown(results: dict) -> str:
    """The checks and, per traces set, TTFT / TPOT / E2E p99 (s) of every policy and mode at every rate."""
    lines = ["# draftsmith serve-sim", "", *(f"- {line}" for line in check_lines(results)), "",
             "## Where speculation pays (FCFS, mean E2E against plain decoding of the same requests)", "",
             *(f"- {label}: {paying(row)}" for label, row in results["break_even"].items()), ""]
    for label in sorted({r["traces"] for r in results["runs"]}):
        mine = [r for r in results["runs"] if r["traces"] == label]
        rates = sorted({r["rate"] for r in mine}, key=str)
        lines += [f"## {label}: p99 TTFT / TPOT / E2E (s)", "",
                  "| policy | speculation | " + " | ".join(f"rate {rate}" for rate in rates) + " |",
                  "|---|---|" + "---|" * len(rates)]
        for name in dict.fromkeys(r["policy"] for r in mine):
            for mode in dict.fromkeys(r["speculation"] for r in mine):
                cells = []
                for rate in rates:
                    (run,) = [r for r in mine if (r["policy"], r["speculation"], r["rate"]) == (name, mode, rate)]
                    s = run["summary"]
                    cells.append(" / ".join(f"{s[m]['p99'] / 1e3:.2f}" for m in ("ttft_ms", "tpot_ms", "e2e_ms")))
                lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(d: dict, key: str) -> str:
    value = d.get(key)
    return "n/a" if value is None else f"{value:.0f}"


def run_rows(runs: list[dict]) -> list[list]:
    """One row per simulation: TTFT/TPOT/E2E mean, p50, p99 (ms), goodput and preemptions."""
    rows = []
    for run in runs:
        s = run["summary"]
        rows.append([run["traces"], run["policy"], run["speculation"], run["rate"],
                     *(_fmt(s[m], k) for m in ("ttft_ms", "tpot_ms", "e2e_ms") for k in ("mean", "p50", "p99")),
                     f"{s['goodput_tokens_per_s']:.1f}", f"{s['mean_tokens_per_pass']:.2f}", s["preemptions"]])
    return rows


def plots(results: dict) -> dict[str, str]:
    """Latency–load curves per traces set and metric (colour = policy, line = speculation), per category for FCFS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if r["rate"] != "replay"]
    images = {}
    for label in sorted({r["traces"] for r in runs}):
        mine = [r for r in runs if r["traces"] == label]
        for metric, stat in METRICS:
            figure, axis = plt.subplots(figsize=(5.8, 3.6))
            for index, name in enumerate(sorted({r["policy"] for r in mine})):
                for mode in sorted({r["speculation"] for r in mine}):
                    line = sorted((r["rate"], r["summary"][metric][stat]) for r in mine if (r["policy"], r["speculation"]) == (name, mode))
                    axis.plot(*zip(*line), STYLES.get(mode, "-"), color=f"C{index}", marker="o", label=f"{name} / {mode}")
            axis.set(xlabel="arrival rate (req/s)", ylabel=f"{metric} {stat}", title=f"{label}: {metric} {stat}")
            axis.legend(fontsize=6)
            images[f"{label} {metric} {stat}"] = _png(figure, plt)
        figure, axis = plt.subplots(figsize=(5.8, 3.6))
        for index, category in enumerate(sorted({c for r in mine for c in r["per_category"]})):
            for mode in ("off", "fixed"):
                line = sorted((r["rate"], r["per_category"][category]["e2e_ms"]["mean"]) for r in mine
                              if r["policy"] == "fcfs" and r["speculation"] == mode and category in r["per_category"])
                if line:
                    axis.plot(*zip(*line), STYLES[mode], color=f"C{index}", marker="o", label=f"{category} / {mode}")
        axis.set(xlabel="arrival rate (req/s)", ylabel="E2E mean (ms)", title=f"{label}: FCFS by category")
        axis.legend(fontsize=7)
        images[f"{label} category"] = _png(figure, plt)
    return images


def _png(figure, plt) -> str:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def page(results: dict) -> str:
    """The HTML report: checks, break-even, published figures beside ours, plots, every run, per category."""
    checks = "".join(f"<li>{html.escape(line)}</li>" for line in check_lines(results))
    even = _table(["traces", "rates", "E2E speculative / plain (FCFS)", "pays up to (req/s)"],
                  [[k, v["rates"], ", ".join(f"{q:.2f}" for q in v["e2e_ratio_speculative_over_plain"]),
                    paying(v).removeprefix("pays up to ")]
                   for k, v in results["break_even"].items()])
    predictor = _table(["traces", "MAE at admission (tokens)", "MAE over all positions", "mean output tokens"],
                       [[k, f"{v['mae_at_admission_tokens']:.1f}", f"{v['mae_all_positions_tokens']:.1f}",
                         f"{v['mean_output_tokens']:.1f}"] for k, v in results["length_predictor"].items()])
    published = "".join(
        f"<h3>{html.escape(p['claim'])}</h3><p>{html.escape(p['source'])}. Their setup: {html.escape(p['setup'])}.</p>"
        + _table(["traces", "speculation", "rate", f"our mean E2E change vs {p['ours_vs']}"],
                 [[o["traces"], o["speculation"], o["rate"], _pct(o["mean_e2e_change"])] for o in p["ours"]])
        for p in results["published"])
    header = ["traces", "policy", "speculation", "rate", *(f"{m} {k}" for m in ("TTFT", "TPOT", "E2E") for k in ("mean", "p50", "p99")),
              "goodput tok/s", "tokens/pass", "preemptions"]
    categories = [[*row[:4], c, *(_fmt(s[m], k) for m in ("ttft_ms", "tpot_ms", "e2e_ms") for k in ("mean", "p99"))]
                  for row, run in zip(run_rows(results["runs"]), results["runs"]) for c, s in run["per_category"].items()]
    figures = "".join(f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"></figure>' for t, b in plots(results).items())
    setup = html.escape(json.dumps({k: results.get(k) for k in ("config", "profile", "traces")}, indent=1, default=str))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>draftsmith serve-sim</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 8px}}figure{{display:inline-block;margin:4px}}pre{{background:#f6f6f6;padding:1em;font-size:11px}}</style>
</head><body><h1>draftsmith serve-sim</h1>
<h2>Validation against reality</h2><ul>{checks}</ul>
<h2>Where speculation pays (FCFS, mean E2E against plain decoding)</h2>{even}
<h2>Length predictor error (leave-one-out, re-predicted as tokens come)</h2>{predictor}
<h2>Published figures beside ours</h2>{published}
<h2>Latency–load curves</h2>{figures}
<h2>Every simulation (ms)</h2>{_table(header, run_rows(results["runs"]))}
<h2>Per prompt category (ms)</h2>{_table(["traces", "policy", "speculation", "rate", "category", "TTFT mean", "TTFT p99",
                                           "TPOT mean", "TPOT p99", "E2E mean", "E2E p99"], categories)}
<h2>Setup</h2><pre>{setup}</pre>
<p>Goodput: output tokens (accepted drafts and target tokens, never rejected drafts) per second from the first
arrival to the last completion. TPOT: (finish − first token) / (output tokens − 1). Percentiles over requests.</p>
</body></html>
"""
