"""The side-by-side report of `draftsmith eval --engine vllm`: engine.json and engine.md (definitions in engine.py)."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.eval import metrics


def our_positions(generations, k: int) -> dict:
    """Our per-position counts over every verify pass: reached_i = passes whose walk reached draft position i,
    accepted_i = passes that accepted it (`metrics.acceptance`'s terms)."""
    cycles = [c for g in generations for c in g.cycles]
    reached = [sum(c.offered >= i for c in cycles) for i in range(1, k + 1)]
    accepted = [sum(c.accepted >= i for c in cycles) for i in range(1, k + 1)]
    return _positions(reached, accepted, len(cycles))


def engine_positions(outputs: list[dict]) -> dict:
    """The same counts from vLLM's counters: a draft reaches position i when positions 1..i-1 were accepted."""
    drafts = sum(o["counters"]["drafts"] for o in outputs)
    width = max((len(o["counters"]["accepted_per_position"]) for o in outputs), default=0)
    accepted = [sum(o["counters"]["accepted_per_position"][i] for o in outputs
                    if i < len(o["counters"]["accepted_per_position"])) for i in range(width)]
    return _positions([drafts, *accepted[:-1]][:width], accepted, drafts)


def _positions(reached: list[int], accepted: list[int], passes: int) -> dict:
    alpha = [a / r if r else None for a, r in zip(accepted, reached)]
    tau = 1 + sum(accepted) / passes if passes else None
    return {"passes": passes, "reached": reached, "accepted": accepted, "acceptance_per_position": alpha,
            "acceptance_length": tau}


def engine_timing(outputs: list[dict]) -> dict:
    """Tokens/s (Σ tokens / Σ end-to-end seconds), TTFT, TPOT and end-to-end latency (ms) of one engine method."""
    tokens, seconds = sum(len(o["token_ids"]) for o in outputs), sum(o["e2e_s"] for o in outputs)
    return {"tokens_per_s": tokens / seconds if seconds else None, "new_tokens": tokens,
            "ttft_ms": metrics.stats(o["ttft_s"] * 1e3 for o in outputs if o["ttft_s"] is not None),
            "tpot_ms": metrics.stats(o["tpot_s"] * 1e3 for o in outputs if o["tpot_s"] is not None),
            "e2e_ms": metrics.stats(o["e2e_s"] * 1e3 for o in outputs)}


def summarize(config, prompts, runs: dict, results: dict, served: str, drafter_config: dict | None,
              engine_target: str) -> dict:
    """engine.json: our decoder and every engine method on the same prompts, identity to the engine's plain output,
    acceptance counts and timings; methods the engine refused with its error and the vLLM file that raised it."""
    plain = results["plain"].get("outputs") if results["plain"].get("ok") else None
    k = config.draft_length

    def identical(generations_tokens: list[list[int]]) -> dict | None:
        if plain is None or not config.temperature == 0:
            return None
        flags = [tokens == o["token_ids"] for tokens, o in zip(generations_tokens, plain)]
        return {"identical": sum(flags), "checked": len(flags), "per_prompt": flags}

    ours = {"speculative": {**our_positions(runs["speculative"], k), **metrics.timing(runs["speculative"]),
                            "identical_to_engine_plain": identical([g.tokens for g in runs["speculative"]])},
            "plain": {**metrics.timing(runs["plain"]), "identical_to_engine_plain": identical([g.tokens for g in runs["plain"]])}}
    engine = {}
    for name, result in results.items():
        if not result.get("ok"):
            engine[name] = {key: result.get(key) for key in ("ok", "error", "refused_by", "speculative_config", "log")}
            continue
        outputs = result["outputs"]
        entry = {"ok": True, "speculative_config": result["speculative_config"], "load_s": result["load_s"],
                 **engine_timing(outputs), "identical_to_engine_plain": identical([o["token_ids"] for o in outputs])}
        if name != "plain":
            entry.update(engine_positions(outputs))
        engine[name] = entry
    base = engine.get("plain", {}).get("tokens_per_s")
    for entry in engine.values():
        if entry.get("ok") and base:
            entry["speedup_vs_engine_plain"] = entry["tokens_per_s"] / base
    report = {"engine": config.engine, "vllm_version": next((r.get("vllm_version") for r in results.values()
                                                             if r.get("vllm_version")), None),
              "target_folder": engine_target, "prompts": [p.name for p in prompts], "categories":
              [getattr(p, "category", None) for p in prompts], "draft_length": k, "max_new_tokens": config.max_new_tokens,
              "temperature": config.temperature, "enforce_eager": config.engine_eager,
              "drafter": {"spec": config.drafter, "served": served, "speculative_config": drafter_config},
              "ours": ours, "methods": engine, "definitions": DEFINITIONS}
    if engine.get("drafter", {}).get("ok"):
        report["parity"] = parity(ours["speculative"], engine["drafter"])
    return report


DEFINITIONS = {
    "identical_to_engine_plain": "prompts whose output equals vLLM's own plain (non-speculative) output, token for token",
    "reached/accepted": "per draft position i: verify passes that reached it / that accepted it (vLLM: drafts, then "
    "accepted at i-1; accepted at i)",
    "acceptance_per_position": "accepted_i / reached_i (ours: metrics.acceptance)",
    "acceptance_length": "1 + sum of accepted_i / passes (vLLM's mean acceptance length; equal to tau when every pass "
    "drafts)",
    "tokens_per_s": "sum of new tokens / sum of end-to-end seconds, one request at a time",
    "tpot_ms": "(last token - first token) / (new tokens - 1), per request",
}


def parity(ours: dict, engine: dict) -> dict:
    """Per-position acceptance ours vs the engine's with the drafter: counts, and the largest absolute difference."""
    width = min(len(ours["acceptance_per_position"]), len(engine["acceptance_per_position"]))
    gaps = [abs(a - b) for a, b in zip(ours["acceptance_per_position"][:width], engine["acceptance_per_position"][:width])
            if a is not None and b is not None]
    return {"counts_equal": ours["reached"][:width] == engine["reached"][:width]
            and ours["accepted"][:width] == engine["accepted"][:width],
            "max_abs_difference": max(gaps, default=None), "positions": width}


def write_engine_report(report: dict, out: Path) -> dict[str, Path]:
    """engine.json and engine.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "engine.json", "md": out / "engine.md"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    paths["md"].write_text(render(report))
    print(render_table(report))
    return paths


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _same(entry: dict) -> str:
    same = entry.get("identical_to_engine_plain")
    return "n/a" if same is None else f"{same['identical']}/{same['checked']}"


def _alpha(entry: dict) -> str:
    if "accepted" not in entry:
        return ""
    return " / ".join(f"{_fmt(a, 3)} ({n}/{r})" for a, n, r in
                      zip(entry["acceptance_per_position"], entry["accepted"], entry["reached"]))


def render_table(report: dict) -> str:
    """One row per decoder and method: identity, τ, per-position acceptance with counts, tokens/s, TTFT, TPOT."""
    rows = ["| decoder | method | identical to vLLM plain | τ | acceptance per position (accepted/reached) | "
            "tokens/s | TTFT p50 ms | TPOT p50 ms |", "|---|---|---|---|---|---|---|---|"]
    for label, entry in [("draftsmith", report["ours"]["speculative"] | {"name": "drafter"}),
                         ("draftsmith", report["ours"]["plain"] | {"name": "plain loop"})]:
        rows.append(f"| {label} | {entry['name']} | {_same(entry)} | {_fmt(entry.get('acceptance_length'))} | "
                    f"{_alpha(entry)} | {_fmt(entry['tokens_per_s'], 1)} | {_fmt(entry['ttft_ms']['p50'], 0)} | "
                    f"{_fmt(entry['tpot_ms']['p50'], 1)} |")
    for name, entry in report["methods"].items():
        if not entry.get("ok"):
            rows.append(f"| vLLM | {name} | refused: {entry.get('refused_by') or 'see log'} | | | | | |")
            continue
        rows.append(f"| vLLM | {name} | {_same(entry)} | {_fmt(entry.get('acceptance_length'))} | {_alpha(entry)} | "
                    f"{_fmt(entry['tokens_per_s'], 1)} | {_fmt(entry['ttft_ms']['p50'], 0)} | "
                    f"{_fmt(entry['tpot_ms']['p50'], 1)} |")
    return "\n".join(rows)


def render(report: dict) -> str:
    """engine.md: what ran, the table, parity, and every method the engine refused with its reason."""
    lines = [f"# draftsmith eval beside vLLM {report['vllm_version'] or ''}", "",
             f"{len(report['prompts'])} prompts, up to {report['max_new_tokens']} new tokens, temperature "
             f"{report['temperature']}, chains of {report['draft_length']}, one request at a time"
             f"{', vLLM eager (no torch.compile)' if report['enforce_eager'] else ''}. Target folder: "
             f"`{report['target_folder']}`. Drafter: `{report['drafter']['spec']}`, served as {report['drafter']['served']}.",
             "", render_table(report), ""]
    if "parity" in report:
        p = report["parity"]
        lines += [f"Per-position acceptance, ours vs vLLM's with the drafter: counts "
                  f"{'equal' if p['counts_equal'] else 'differ'}, largest absolute difference "
                  f"{_fmt(p['max_abs_difference'], 4)} over {p['positions']} positions.", ""]
    refused = {name: e for name, e in report["methods"].items() if not e.get("ok")}
    if refused or report["drafter"]["speculative_config"] is None:
        lines += ["## Not served by this vLLM build", ""]
        if report["drafter"]["speculative_config"] is None:
            lines.append(f"- drafter: {report['drafter']['served']}")
        lines += [f"- {name}: `{e.get('refused_by')}`: {' '.join(str(e.get('error')).split())}" for name, e in refused.items()]
        lines.append("")
    lines += ["## Definitions", "", *[f"- {key}: {text}" for key, text in report["definitions"].items()], ""]
    return "\n".join(lines)
