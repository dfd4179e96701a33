"""Render docs/results.md from the latest record of each canonical bench under results/ (bench/records.py).

    python bench/render_results.py            # write docs/results.md and the README's families table
    python bench/render_results.py --check    # exit 1 when either is not what the records render
    python bench/render_results.py --stale    # per bench: did the code it measures change since its record?

One section per canonical bench, in CANONICAL's order: the command, commit, machine and date of its latest
record, then tables built from the record's `result` by that bench's table function (one per bench, below); a
bench without a record gets a line saying so and the command that makes one.

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
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGE = ROOT / "docs" / "results.md"


# ----------------------------------------------------------------------------- formatting
def fmt(value, digits: int = 2, suffix: str = "") -> str:
    """A number with fixed digits (so the page is deterministic); '–' for a missing one."""
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
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table; cells are written as given (format them first)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines + [""]


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if count < 1000 or unit == "PB":
            return f"{count:.1f} {unit}"
        count /= 1000
    return ""


def identical(count, total) -> str:
    return "–" if count is None else f"{count}/{total}"


# ----------------------------------------------------------------------------- one table function per bench
def families(result: dict) -> list[str]:
    """Training per family, then every decoded method."""
    prompts = result.get("prompts")
    lines = [(f"{prompts} HumanEval prompts, {result.get('max_new_tokens')} new tokens, T=0; "
             f"{fmt(result.get('minutes_per_family'), 1)} min of training per family; "
             f"peak RSS {fmt(result.get('peak_rss_gib'))} GiB."), ""]
    rows = []
    for name, info in result.get("families", {}).items():
        recipe = info.get("recipe", name) + (f" ({' '.join(info['overrides'])})" if info.get("overrides") else "")
        rows.append([name + (" (variant, not decoded)" if info.get("variant") else ""), recipe, fmt(info.get("steps")),
                     fmt(info.get("train_minutes"), 1), fmt(info.get("training_tokens_per_s"), 0),
                     fmt(info.get("training_over_forward"), 2, "×"),
                     " / ".join(fmt(a, 3) for a in info.get("held_out_accuracy") or []) or "–",
                     fmt(info.get("implied_acceptance_length")), fmt((info.get("trainable_parameters") or 0) / 1e6)])
    lines += table(["family", "recipe", "steps", "train min", "training tok/s", "× target forward",
                    "held-out accuracy per step", "implied τ", "trainable M"], rows)
    methods = result.get("methods", {})
    versus_generate = any("speedup_vs_generate" in row for row in methods.values())
    rows = []
    for name, row in methods.items():
        cells = [name, fmt(row.get("tokens_per_s")), fmt(row.get("acceptance_length")),
                 fmt(row.get("speedup_vs_plain"), 2, "×")]
        cells += [fmt(row.get("speedup_vs_generate"), 2, "×")] if versus_generate else []
        cells += [pct(row.get("draft_time_fraction"), 0), fmt(row.get("draft_ms_per_cycle"), 1),
                  identical(row.get("identical_to_plain"), prompts)]
        rows.append(cells)
    header = ["method", "tok/s", "τ", "vs plain"] + (["vs generate()"] if versus_generate else [])
    return lines + table(header + ["draft time", "draft ms/cycle", "identical"], rows)


def eagle3_smollm2(result: dict) -> list[str]:
    """The budget, each vocabulary's drafter, then every decoded method."""
    prompts = result.get("prompts")
    lines = [f"{fmt(result.get('training_minutes_budget'), 1)} min of training per drafter "
             f"({'online' if result.get('online') else 'offline'}, {fmt(result.get('capture_minutes'), 1)} of them "
             f"capturing; {result.get('steps')} steps planned); training {fmt(result.get('training_tokens_per_s'), 0)} "
             f"tok/s = {fmt(result.get('training_over_forward'))}× the target's forward-only "
             f"{fmt(result.get('target_forward_tokens_per_s'), 0)}; {prompts} HumanEval prompts, "
             f"{result.get('max_new_tokens')} new tokens, T=0; peak RSS {fmt(result.get('peak_rss_gib'))} GiB"
             + ("; drafters reused from an earlier run" if result.get("reused_drafters") else "") + ".", ""]
    rows = []
    for size, info in result.get("drafters", {}).items():
        best = info.get("held_out") or {}
        rows.append([size, fmt(info.get("steps_trained")), fmt(info.get("train_minutes"), 1), fmt(best.get("step")),
                     f"{fmt(best.get('acc_0'), 3)} / {fmt(best.get('acc_1'), 3)}",
                     fmt(best.get("implied_acceptance_length"), 3)])
    lines += table(["draft vocabulary", "steps trained", "train min", "best/ step", "held-out acc 0 / 1",
                    "implied τ"], rows)
    rows = [[name, fmt(row.get("tokens_per_s")), fmt(row.get("acceptance_length")),
             fmt(row.get("speedup_vs_plain"), 2, "×"), fmt(row.get("speedup_vs_generate_prompt_lookup"), 2, "×"),
             pct(row.get("draft_time_fraction"), 0), identical(row.get("identical_to_plain"), prompts)]
            for name, row in result.get("methods", {}).items()]
    return lines + table(["method", "tok/s", "τ", "vs plain", "vs generate(prompt_lookup)", "draft time",
                          "identical"], rows)


def long_context(result: dict) -> list[str]:
    """Per context length and method: decode speed, τ and the costs per cycle; then the goals' ratios."""
    config = result.get("config", {})
    prompts = config.get("num_prompts")
    lines = [(f"{prompts} HumanEval prompts with N tokens of standard-library code in front, "
             f"{config.get('max_new_tokens')} new tokens, T=0, {config.get('dtype')}; drafter `{config.get('drafter')}`,"
             f" chain of {config.get('draft_length')}, tree {config.get('tree')}. Decode tok/s leaves the prefill out."), ""]
    rows, costs = [], []
    for context, row in result.get("results", {}).items():
        for name, entry in row.items():
            if not isinstance(entry, dict) or "tokens_per_s" not in entry:
                continue
            rows.append([context, name, fmt(entry["tokens_per_s"]), fmt(entry.get("speedup"), 2, "×"),
                         fmt(entry.get("acceptance_length")), fmt(entry.get("verify_ms"), 1),
                         pct(entry.get("rollback_fraction"), 2), fmt(entry.get("draft_ms"), 1),
                         identical(entry.get("identical"), prompts)])
        matching = row.get("prompt_lookup_matching_ms", {})
        costs.append([context, fmt(row.get("prompt_tokens"), 0), fmt(row.get("old_tree_rollback_ms")),
                      pct(row.get("old_tree_rollback_fraction")), fmt(matching.get("index"), 3),
                      fmt(matching.get("full scan"), 3)])
    lines += table(["N", "method", "decode tok/s", "speedup", "τ", "verify ms", "rollback, % of verify",
                    "drafter ms", "identical"], rows)
    lines += table(["N", "prompt tokens", "old tree rollback ms", "of a tree verify", "lookup match ms (index)",
                    "lookup match ms (full scan)"], costs)
    rows = [[name, fmt(s.get("speedup_ratio")), pct(s.get("worst_rollback_fraction"), 2)]
            for name, s in result.get("summary", {}).items()]
    return lines + table(["method", "speedup at largest N / at smallest N", "worst rollback, % of verify"], rows)


def serving(result: dict) -> list[str]:
    """serve-sim: the validation checks, where speculation pays, and mean / p99 E2E per policy and rate."""
    lines = []
    checks = []
    for label, check in result.get("validation", {}).get("concurrency_1", {}).items():
        for mode, name in (("fixed", "speculative"), ("off", "plain")):
            row = check.get(mode, {})
            checks.append([f"concurrency 1, {label}, {name}", pct(row.get("error_total")),
                           pct(row.get("error_max_prompt")), fmt(row.get("passed"))])
    batched = result.get("validation", {}).get("batched_forwards", {})
    if batched.get("passed") is not None:
        checks.append(["batched forwards b=2..4, cost model vs measured", pct(batched.get("error_median")),
                       pct(batched.get("error_max")), fmt(batched.get("passed"))])
    lines += table(["check (simulated vs measured)", "error", "worst", "within 10%"], checks)
    rows = []
    for label, row in result.get("break_even", {}).items():
        where = ("pays at every rate" if row.get("pays_at_every_rate") else "pays at no rate"
                 if row.get("pays_at_no_rate") else fmt(row.get("stops_paying_at_rate"), 3))
        rows.append([label, ", ".join(fmt(r, 3) for r in row.get("rates", [])),
                     ", ".join(fmt(q) for q in row.get("e2e_ratio_speculative_over_plain", [])), where])
    lines += table(["traces", "rates (req/s)", "mean E2E speculative / plain (FCFS)", "pays up to (req/s)"], rows)
    runs = result.get("runs", [])
    for label in sorted({r["traces"] for r in runs}):
        mine = [r for r in runs if r["traces"] == label]
        rates = sorted({r["rate"] for r in mine}, key=str)
        lines += [f"{label}: mean / p99 end-to-end latency (s)", ""]
        rows = []
        for policy in dict.fromkeys(r["policy"] for r in mine):
            for mode in dict.fromkeys(r["speculation"] for r in mine):
                cells = []
                for rate in rates:
                    match = [r for r in mine if (r["policy"], r["speculation"], r["rate"]) == (policy, mode, rate)]
                    e2e = match[0]["summary"]["e2e_ms"] if match else {}
                    cells.append(f"{fmt(e2e.get('mean', 0) / 1e3)} / {fmt(e2e.get('p99', 0) / 1e3)}" if match else "–")
                rows.append([policy, mode, *cells])
        lines += table(["policy", "speculation", *(f"rate {rate}" for rate in rates)], rows)
    return lines


def train_step_profile(result: dict) -> list[str]:
    """Where one online EAGLE-3 step's time goes, and the step against the target's forward-only pass."""
    step = result.get("step_ms") or 0
    lines = [(f"A batch of {result.get('batch_size')} samples, {result.get('tokens')} tokens (median length "
             f"{fmt(result.get('median_length'), 0)}), {result.get('ttt_steps')} TTT steps, fp32, medians of "
             f"{result.get('repeats')} runs."), ""]
    lines += table(["part", "ms", "share of the step"],
                   [[name, fmt(ms, 1), pct(ms / step if step else None)]
                    for name, ms in result.get("parts_ms", {}).items()] + [["one training step", fmt(step, 1), "100.0%"]])
    rows = [[name, fmt(entry.get("ms"), 0), fmt(entry.get("tokens_per_s"), 0), fmt(entry.get("over_forward"), 2, "×")]
            for name, entry in result.get("steps", {}).items()]
    return lines + table(["step", "ms", "tokens/s", "× the target's forward-only tokens/s"], rows)


def draft_cost(result: dict) -> list[str]:
    """Milliseconds per drafting call of each untrained drafter shape, and each over EAGLE-3's chain of 7."""
    lines = [(f"Target {result.get('target')}; draft vocabulary {result.get('draft_vocab_size')} tokens; "
             f"{result.get('rounds')} × {result.get('cycles')} calls per shape, medians."), ""]
    baseline = result.get("baseline", "eagle3 chain 7")
    rows = [[name, fmt(ms), fmt(result.get("vs_baseline", {}).get(name), 2, "×")]
            for name, ms in result.get("ms_per_call", {}).items()]
    return lines + table(["drafter", "ms per call", f"vs {baseline}"], rows)


def decode(result: dict) -> list[str]:
    """Our loops against generate(): tokens/s, τ, speedups and the verify-cost bound, then the cost curve."""
    config = result.get("config", {})
    prompts = config.get("num_prompts")
    lines = [f"{prompts} HumanEval prompts, {config.get('max_new_tokens')} new tokens, T=0, {config.get('dtype')}; "
             f"our plain loop / generate(): **{fmt(result.get('plain_ours_vs_generate'))}×**; "
             + "; ".join(f"{name} / generate(prompt_lookup): **{fmt(ratio)}×**" for name, ratio in
                         result.get("prompt_lookup_ours_vs_generate_prompt_lookup", {}).items()) + ".", ""]
    speedup, bound = result.get("speedup_vs_own_plain", {}), result.get("fraction_of_bound", {})
    rows = [[name, fmt(tps), identical(result.get("identical_to_plain_ours", {}).get(name), prompts),
             fmt(result.get("acceptance_length", {}).get(name)), fmt(speedup.get(name), 2, "×" if name in speedup else ""),
             pct(bound.get(name), 0)] for name, tps in result.get("tokens_per_s", {}).items()]
    lines += table(["method", "tok/s", "identical", "τ", "speedup over its own plain", "of the bound τ·t(1)/t(k+1)"], rows)
    curve = result.get("verify_cost_relative", {})
    lines += [(f"Verify cost t(k)/t(1) at {result.get('context_tokens')} tokens of context "
              f"(t(1) = {fmt(result.get('verify_cost_ms', {}).get('1'), 1)} ms):"), ""]
    return lines + table(["k", *curve], [["t(k)/t(1)", *(fmt(v) for v in curve.values())]])


CAPTURE_FIGURES = [("forward_tokens_per_s", "target forward only, tokens/s", 1),
                   ("capture_tokens_per_s", "capture (hooks, cast, shards, sha256, fsync), tokens/s", 1),
                   ("throughput_ratio", "capture / forward (goal ≥ 0.9)", 3),
                   ("bytes_per_token", "bytes per token on disk", 1), ("raw_bytes_per_token", "raw bytes per token", 0),
                   ("size_ratio", "on disk / raw (goal ≤ 1.02)", 4), ("peak_rss_mib", "peak RSS, MiB", 1),
                   ("peak_gpu_mib", "peak GPU memory, MiB", 1)]


def capture(result: dict) -> list[str]:
    """`draftsmith capture` against the bare forward: throughput and bytes."""
    lines = [(f"{result.get('samples')} samples, {result.get('tokens')} tokens, layers {result.get('layers')}, "
             f"features in {result.get('dtype')}, on {result.get('device')}; medians of {result.get('repeats')} "
             "interleaved runs."), ""]
    return lines + table(["figure", "value"], [[label, fmt(result[key], digits)] for key, label, digits in CAPTURE_FIGURES
                                              if key in result])


def feature_storage(result: dict) -> list[str]:
    """Disk a capture takes per storage option, from the formula `draftsmith capture` writes by."""
    lines = [(f"Hidden size {result.get('hidden_size')} ({result.get('num_layers')} layers), "
             f"{result.get('conversations'):,} conversations × {result.get('tokens_per_conversation'):,} tokens."), ""]
    rows = [[o["features"], f"{o['bytes_per_token']:,}", human_bytes(o["capture_bytes"]), "0 B"]
            for o in result.get("options", [])]
    return lines + table(["features stored", "bytes per token", "whole capture", "online (data.online)"], rows)


def sharded_target(result: dict) -> list[str]:
    """Per process of each group: the target's weights it holds, its memory, a feature forward's time."""
    lines = [(f"{result.get('target')} ({result.get('dtype')}), a feature forward of {result.get('tokens')} tokens, "
             f"{result.get('cores')} cores shared, MALLOC_MMAP_THRESHOLD_={result.get('mmap_threshold') or 'default'}."),
             ""]
    rows = [[r["processes"], r["rank"], f"{fmt(r['weights_mib'], 1)} of {fmt(r['whole_mib'], 1)}", pct(r["share"]),
             fmt(r["resident_mib"], 0), fmt(r["peak_mib"], 0), fmt(r["forward_s"], 3), r.get("features_vs_one_process")]
            for r in result.get("rows", [])]
    return lines + table(["processes", "rank", "target weights held (MiB)", "share of the whole",
                          "resident beyond the runtime MiB", "peak MiB", "forward s", "features vs 1 process"], rows)


def general_mix(result: dict) -> list[str]:
    arms = result.get("arms", {})
    code, mix = arms.get("code", {}), arms.get("mix", {})
    lines = [f"The default recipe (EAGLE-3, its time budgets) trained on code alone and on the general mix; each decodes "
             f"{result.get('num_prompts')} prompts of builtin:suite and {result.get('humaneval_prompts')} HumanEval "
             f"prompts, {result.get('max_new_tokens')} new tokens, chains of {result.get('draft_length')} with the "
             "fallback, greedy; speedups against our plain loop.", ""]
    lines += table(["arm", "rows", "tokens", "steps", "implied τ"],
                   [[name, fmt(arm.get("rows")), fmt(arm.get("tokens")), fmt(arm.get("steps")),
                     fmt(arm.get("implied_acceptance_length"))] for name, arm in arms.items()])
    names = sorted(set(code.get("suite", {}).get("per_category", {})) | set(mix.get("suite", {}).get("per_category", {})))
    rows = []
    for name in names:
        a = code.get("suite", {}).get("per_category", {}).get(name, {})
        b = mix.get("suite", {}).get("per_category", {}).get(name, {})
        rows.append([name, fmt(a.get("prompts")), fmt(a.get("acceptance_length")), fmt(a.get("speedup"), 2, "×"),
                     fmt(b.get("acceptance_length")), fmt(b.get("speedup"), 2, "×")])
    for label, key in (("suite, all", "suite"), ("HumanEval", "humaneval")):
        a, b = code.get(key, {}), mix.get(key, {})
        rows.append([f"**{label}**", fmt(result.get("num_prompts" if key == "suite" else "humaneval_prompts")),
                     fmt(a.get("acceptance_length")), fmt(a.get("speedup"), 2, "×"),
                     fmt(b.get("acceptance_length")), fmt(b.get("speedup"), 2, "×")])
    lines += table(["category", "prompts", "code τ", "code speedup", "mix τ", "mix speedup"], rows)
    checks = result.get("checks", {})
    return lines + [f"Mix keeps ≥ 90% of the code arm's HumanEval speedup: "
                    f"{fmt(checks.get('humaneval_kept_90_percent'))}; mix faster in every category but code: "
                    f"{fmt(checks.get('mix_wins_every_non_code_category'))}.", ""]


def memory_plan(result: dict) -> list[str]:
    """Parameters of each target and its EAGLE-3 drafter, then bytes per training process by launcher."""
    def gb(count: float) -> str:
        return fmt(count / 1e9, 2)

    lines = [(f"Per training process over {result.get('processes')} processes: the target in {result.get('dtype')}, "
              f"draftsmith's EAGLE-3 drafter trained at {result.get('state_bytes_per_parameter')} bytes per "
              "parameter (float32 weights, gradients, AdamW's two moments), the features of one online micro-batch "
              f"of {result.get('batch_size')} × {result.get('max_length')} tokens; activations not counted. "
              "Parameter counts of the real modules built on the meta device."), ""]
    targets = result.get("targets", [])
    lines += table(["target", "parameters", "drafter trainable", "by part", "draft vocabulary",
                    "with the whole vocabulary"],
                   [[t["architecture"], fmt(t["target_parameters"] / 1e9, 2) + " B",
                     fmt(t["drafter_trainable"] / 1e6, 1) + " M",
                     ", ".join(f"{part} {fmt(count / 1e6, 1) + ' M' if count >= 1e5 else f'{count:,}'}"
                               for part, count in t["drafter_parameters"].items()),
                     f"{t['draft_vocab']:,}", fmt(t["drafter_trainable_full_vocab"] / 1e6, 1) + " M"]
                    for t in targets])
    rows = [[t["architecture"], r["launcher"], r["target"], gb(r["target_bytes"]), gb(r["drafter_state_bytes"]),
             gb(r["features_bytes"]), f"**{gb(r['total_bytes'])}**"] for t in targets for r in t.get("rows", [])]
    return lines + table(["target", "drafter under", "target held", "target GB", "drafter state GB",
                          "features GB", "total GB"], rows)


def parallel_drafting(result: dict) -> list[str]:
    """P-EAGLE against EAGLE-3 at one chain length: the two ratios, then the families tables of the run."""
    s = result.get("parallel_drafting", {})
    names = ("eagle3", "peagle")
    rows = [[name, fmt(s.get("draft_ms_per_pass", {}).get(name), 1), fmt(s.get("tau", {}).get(name)),
             fmt(s.get("speedup_vs_plain", {}).get(name), suffix="x"),
             identical(s.get("identical_to_plain", {}).get(name), result.get("prompts"))] for name in names]
    changed = s.get("peagle_overrides") or []
    lines = [f"Chains of {s.get('length')}, both drafters trained for that many steps"
             + (f"; P-EAGLE with {', '.join(f'`{o}`' for o in changed)}" if changed else "") + ":", ""]
    lines += table(["drafter", "draft ms per verify pass", "τ", "speedup vs plain", "identical to plain"], rows)
    lines += [f"P-EAGLE over EAGLE-3: draft time per verify pass **{fmt(s.get('draft_ms_ratio'))}x**, "
              f"τ **{fmt(s.get('tau_ratio'))}x**.", ""]
    return lines + families(result)


def levers(result: dict) -> list[str]:
    """Each lever against its recipe's baseline: figures per seed (seed order), means' ratios, the verdict."""
    seeds = result.get("seeds", [])
    data = result.get("data_recipe", "eagle3")
    data = "the default recipe's data" if data == "eagle3" else f"the `{data}` recipe's data"
    lines = [f"Every arm trained {fmt(result.get('minutes'), 1)} min of wall time on {data}, per "
             f"seed ({', '.join(map(str, seeds))}); decoded as its recipe's chain on {result.get('num_prompts')} "
             f"HumanEval prompts, {result.get('max_new_tokens')} new tokens, greedy, beside the plain loop. Figures "
             "per seed as a / b. **won**: decoded and implied τ above the baseline's in every seed; **lost**: below "
             "in every seed; a recipe default changes only on a win.", ""]

    def per_seed(arm: dict, key: str, digits: int = 2, suffix: str = "") -> str:
        return " / ".join(fmt(figures.get(key), digits, suffix) for figures in arm.get("per_seed", []))

    rows = []
    total = (result.get("num_prompts") or 0) * len(seeds)
    for name, arm in result.get("arms", {}).items():
        change = " ".join(arm.get("overrides", [])) or f"{arm.get('recipe')} as shipped"
        rows.append([name, f"`{change}`", arm.get("baseline") or "–",
                     per_seed(arm, "steps", 0), per_seed(arm, "implied_tau"), per_seed(arm, "tau"),
                     per_seed(arm, "speedup", 2, "×"), fmt(arm.get("tau_vs_baseline"), 3, "×"),
                     identical(arm.get("identical"), total), f"**{arm['verdict']}**" if arm.get("verdict") else "–"])
    return lines + table(["arm", "change", "baseline", "steps", "implied τ", "decoded τ", "speedup vs plain",
                          "decoded τ vs baseline", "identical", "verdict"], rows)


def dflash_peer(result: dict) -> list[str]:
    """Our DFlash arms against the speculators library's model and loss: per seed, per-position held-out accuracy,
    implied and decoded τ; each arm's mean decoded τ over the peer's."""
    seeds = [str(s) for s in result.get("seeds", [])]
    lines = [f"Every arm trained {result.get('steps')} steps on the `dflash` recipe's data and micro-batches, per seed "
             f"({', '.join(seeds)}), from the same starting weights; the speculators arm is the library's "
             f"`DFlashDraftModel` forward (its anchors, up to {result.get('peer_anchors')} per batch, targets, weights "
             f"and loss) with its trainer's default optimiser (AdamW, lr {result.get('peer_lr')}). One evaluator: "
             "held-out top-1 accuracy per block position over every allowed block, and our decoder on "
             f"{result.get('num_prompts')} HumanEval prompts, {result.get('max_new_tokens')} new tokens, greedy. "
             "Figures per seed as a / b.", ""]
    rows = []
    for name, arm in result.get("arms", {}).items():
        figures = [result.get("per_seed", {}).get(seed, {}).get(name, {}) for seed in seeds]
        accuracy = " / ".join(", ".join(fmt(a) for a in f.get("held_out_accuracy", [])[:3]) for f in figures)
        rows.append([name, f"`{' '.join(arm.get('overrides', [])) or 'as shipped'}`" if not arm.get("peer") else
                     "speculators' model, loss and optimiser", accuracy,
                     " / ".join(fmt(f.get("implied_tau")) for f in figures),
                     " / ".join(fmt(f.get("tau")) for f in figures),
                     " / ".join(fmt(f.get("speedup"), suffix="×") for f in figures),
                     fmt(arm.get("tau_vs_speculators"), 3, "×") if not arm.get("peer") else "–",
                     identical(sum(f.get("identical") or 0 for f in figures),
                               (result.get("num_prompts") or 0) * len(seeds))])
    return lines + table(["arm", "training", "held-out accuracy, positions 1-3", "implied τ", "decoded τ",
                          "speedup vs plain", "decoded τ vs speculators", "identical"], rows)


def hybrid(result: dict) -> list[str]:
    """Suffix alone, the drafter alone and their hybrid against one plain loop, overall and per category."""
    methods = ("suffix", "drafter", "hybrid")
    rounds = result.get("rounds", 1)
    decoded = result.get("num_prompts") * rounds if result.get("num_prompts") is not None else None
    times = f", each decoded {rounds} times by every method (category rows count decodes)" if rounds > 1 else ""
    lines = [f"`{result.get('drafter')}` on {result.get('num_prompts')} prompts of {result.get('prompts')}{times}, "
             f"{result.get('max_new_tokens')} new tokens, greedy: suffix chains up to {result.get('suffix_length')}, "
             f"drafter chains of {result.get('draft_length')}, the hybrid both in one tree per pass.", ""]
    overall = result.get("methods", {})
    rows = [[name, fmt(overall.get(name, {}).get("acceptance_length")),
             fmt(overall.get(name, {}).get("speedup_vs_plain"), 2, "×"),
             pct(overall.get(name, {}).get("draft_time_fraction")),
             identical(overall.get(name, {}).get("identical_to_plain"), decoded)] for name in methods]
    lines += table(["method", "τ", "speedup vs plain", "draft time", "identical to plain"], rows)
    categories = result.get("per_category", {})
    if len(categories) > 1:
        lines += table(["category", "prompts", *(f"{name} τ / speedup" for name in methods)],
                       [[name, fmt(row.get("prompts")),
                         *(f"{fmt(row.get(m, {}).get('acceptance_length'))} / {fmt(row.get(m, {}).get('speedup'), 2, '×')}"
                           for m in methods)] for name, row in categories.items()])
    checks = result.get("checks", {})
    goal = (f"Hybrid ≥ 2.2× plain: {fmt(checks.get('hybrid_at_least_2_2x_plain'))}; ≥ 1.2× the better single "
            f"method: {fmt(checks.get('hybrid_at_least_1_2x_the_better_single'))}; "
            if result.get("prompts") == "humaneval" else "")  # the HumanEval goal: not what a category run is for
    return lines + [f"{goal}{'no' if goal else 'No'} category below the better single method − 3%: "
                    f"{fmt(checks.get('no_category_below_the_better_single_minus_3_percent'))}; "
                    f"lossless: {fmt(checks.get('lossless'))}.", ""]


def repeated_workload(result: dict) -> list[str]:
    """Per-request matching against the cross-request cache on an agent's repeating requests."""
    lines = [f"{result.get('num_prompts')} requests of a tool-using assistant (shared instructions, six tool outputs, "
             f"four task templates, no request twice), {result.get('max_new_tokens')} new tokens, chains up to "
             f"{result.get('draft_length')}, greedy; each method against its own plain loop.", ""]
    rows = []
    for name, row in result.get("methods", {}).items():
        cache, later = row.get("cache") or {}, row.get("later_half", {})
        rows.append([name, fmt(row.get("acceptance_length")), fmt(row.get("speedup"), 2, "×"),
                     fmt(later.get("acceptance_length")), fmt(later.get("speedup"), 2, "×"),
                     f"{cache['peak_tokens']:,} / {cache['bound_tokens']:,}" if cache else "–",
                     fmt(cache.get("evicted_documents")) if cache else "–",
                     human_bytes(cache["bytes"]) if cache.get("bytes") else "–",
                     identical(row.get("lossless", {}).get("identical"), row.get("lossless", {}).get("checked"))])
    lines += table(["method", "τ", "speedup", "later half τ", "later half speedup", "cache peak / bound (tokens)",
                    "documents evicted", "cache in memory", "identical to plain"], rows)
    checks = result.get("checks", {})
    return lines + [f"Cache beats per-request suffix matching: {fmt(checks.get('cache_beats_per_request'))}; "
                    f"every cache within its bound: {fmt(checks.get('cache_within_bound'))}.", ""]


CANONICAL = {  # bench (its script's name) -> (title, table function, a command that makes a record)
    "families": ("Drafter families at one CPU budget", families,
                 "python bench/families.py --minutes 20 --num-prompts 40"),
    "parallel_drafting": ("P-EAGLE against EAGLE-3 chains", parallel_drafting,
                          "python bench/parallel_drafting.py --length 4 --minutes 10 --num-prompts 20"),
    "levers": ("Training levers, A/B at equal wall time over seeds", levers,
               "python bench/levers.py --minutes 4 --num-prompts 40 --seeds 0 1 --arm muon eagle3 train.optimizer=muon"),
    "levers_dflash": ("DFlash training levers, A/B at equal wall time over seeds", levers,
                      "python bench/levers.py --minutes 4 --num-prompts 20 --seeds 0 1 "
                      "--arm dflash-all dflash drafter.anchors_per_sequence=0"),
    "dflash_peer": ("DFlash: our trainer against the speculators library's, at equal steps", dflash_peer,
                    "python bench/dflash_peer.py --steps 150 --seeds 0 1 --num-prompts 20 --arm draftsmith "
                    "--arm draftsmith-matched drafter.anchors_per_sequence=128 train.lr=1e-3"),
    "eagle3_smollm2": ("EAGLE-3 at a training budget", eagle3_smollm2,
                       "python bench/eagle3_smollm2.py --minutes 50 --num-prompts 40"),
    "general_mix": ("Code-only against the general mix, by category", general_mix,
                    "python bench/general_mix.py --num-prompts 40 --humaneval-prompts 20"),
    "long_context": ("Long prompts", long_context,
                     "python bench/long_context.py --drafter DRAFTER --contexts 256 2048 8192 --threads 1"),
    "hybrid": ("Suffix matching, the drafter and their hybrid", hybrid,
               "python bench/hybrid.py --drafter runs/bench-eagle3/eagle3-v2048/best --prompts humaneval "
               "--num-prompts 40 --max-new-tokens 128"),
    "hybrid_by_category": ("Suffix matching, the drafter and their hybrid, by category", hybrid,
                           "python bench/hybrid.py --drafter runs/bench-eagle3/eagle3-v2048/best --prompts builtin:suite "
                           "--num-prompts 100 --max-new-tokens 96 --rounds 2"),
    "repeated_workload": ("Repeated requests: the cross-request suffix cache", repeated_workload,
                          "python bench/repeated_workload.py --num-prompts 24 --cache-tokens 4096 512"),
    "serving": ("Serving under load (serve-sim)", serving, "python bench/serving.py --drafter DRAFTER"),
    "train_step_profile": ("Where a training step's time goes", train_step_profile,
                           "python bench/train_step_profile.py --data DATA --ttt-steps 2 --topk 8"),
    "draft_cost": ("Draft cost per call, by drafter shape", draft_cost,
                   "python bench/draft_cost.py --draft-vocab DATA"),
    "decode": ("Our decoding loops against generate()", decode,
               "python bench/decode.py --num-prompts 10 --max-new-tokens 128"),
    "capture": ("Feature capture against the bare forward", capture, "python bench/capture.py --samples 64"),
    "feature_storage": ("Disk a feature capture takes", feature_storage,
                        "python bench/feature_storage.py --hidden-size 4096 --num-layers 32"),
    "sharded_target": ("A target sharded over processes", sharded_target, "python bench/sharded_target.py"),
    "memory_plan": ("Memory per GPU to train EAGLE-3 for a big target", memory_plan,
                    "python bench/memory_plan.py --processes 8 --draft-vocab 32000"),
}


# ----------------------------------------------------------------------------- records and the page
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


def family_names(entry: dict) -> set[str]:
    return set(entry.get("result", {}).get("families", {}))


def current_families(entries: list[dict]) -> list[dict]:
    """The families records (newest first) that no newer one replaces: a rerun of some families (one family's
    trainer fixed) replaces only a record whose families it all reran, so the comparison of every family stays."""
    kept = []
    for index, entry in enumerate(entries):
        if not any(family_names(entry) <= family_names(newer) for newer in entries[:index]):
            kept.append(entry)
    return kept


def shown(bench: str, entries: list[dict]) -> list[dict]:
    """The records of `bench` the page renders, newest first."""
    if bench in EVERY_RECORD:
        return entries
    return current_families(entries) if bench == "families" else entries[:1]


def provenance(entry: dict) -> list[str]:
    """Where a table's figures come from: command, commit, machine, versions, date."""
    m, v = entry.get("machine", {}), entry.get("versions", {})
    units = ", ".join(name for name in ("amx", "avx512", "avx2") if m.get(name)) or "none of AMX/AVX-512/AVX2"
    if m.get("isa_limit"):  # the libraries were told to use less than the CPU has
        units += "; limited to " + ", ".join(f"{key}={value}" for key, value in m["isa_limit"].items())
    commit = (entry.get("commit") or "unknown")[:8] + (" (uncommitted changes in the tree)" if entry.get("dirty") else "")
    return [f"`{entry.get('command')}`", "",
            f"- commit {commit}, {entry.get('date')}",
            f"- {m.get('cpu')} ({units}), {m.get('cores')} cores, {m.get('torch_threads')} torch threads, "
            f"{fmt(m.get('memory_gib'), 1)} GiB" + (f", GPU {m['gpu']}" if m.get("gpu") else ""),
            f"- python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}", ""]


def render(results: Path = RESULTS) -> str:
    """docs/results.md from the records alone (nothing here reads the current commit)."""
    records = all_records(results)
    lines = ["# Benchmark results", "",
             ("Generated by `python bench/render_results.py` from the latest record of each canonical bench under "
             "`results/` (every record, newest first, of the lever A/Bs and P-EAGLE comparisons, whose records each "
             "test other arms or lengths, and every families record that no later one covering all its families "
             "replaced); do not edit it by hand. Each section names the command, commit, machine "
             "and date its figures come from. Speedups are ratios measured side by side in one run. Whether the code "
             "a record measured has changed since is not on this page: `python bench/render_results.py --stale` says."), ""]
    for bench, (title, tables, command) in CANONICAL.items():
        lines += [f'<a id="{bench}"></a>', "", f"## {title} (`bench/{script(bench)}.py`)", ""]
        entries = records.get(bench)
        if not entries:
            lines += [f"No record yet: `{command}` makes one.", ""]
            continue
        for entry in shown(bench, entries):
            lines += provenance(entry) + tables(entry.get("result", {}))
    others = sorted(set(records) - set(CANONICAL))
    if others:
        lines += ["Records of benches that are not canonical (not rendered): " + ", ".join(others) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------- the README's figures
README = ROOT / "README.md"
README_START, README_END = "<!-- results:families (bench/render_results.py writes this table) -->", "<!-- /results -->"


def readme_families(entries: list[dict]) -> list[str]:
    """The README's one figure per family: each family's chain τ and speedup over our plain loop in the current
    families record (`current_families`) that compares the most families, the newest of those, with the record's
    date and commit, linked to its section of docs/results.md. `entries`: the families records, newest first."""
    current = current_families(entries)
    entry = max(current, key=lambda one: len(family_names(one))) if current else None  # max keeps the first: newest
    if entry is None:
        return ["No families record yet: [docs/results.md](docs/results.md#families) says how to make one.", ""]
    result = entry.get("result", {})
    methods, rows = result.get("methods", {}), []
    for family, info in result.get("families", {}).items():
        row = methods.get(f"{family} chain ({info.get('draft_length')})")
        if info.get("variant") or row is None:
            continue
        rows.append([family, f"chain of {info.get('draft_length')}", fmt(info.get("train_minutes"), 1),
                     fmt(row.get("acceptance_length")), fmt(row.get("speedup_vs_plain"), 2, "×"),
                     identical(row.get("identical_to_plain"), result.get("prompts"))])
    if "prompt lookup" in methods:
        row = methods["prompt lookup"]
        rows.append(["prompt lookup", "chain, adaptive", "–", fmt(row.get("acceptance_length")),
                     fmt(row.get("speedup_vs_plain"), 2, "×"), identical(row.get("identical_to_plain"),
                                                                         result.get("prompts"))])
    m = entry.get("machine", {})
    return ([f"SmolLM2-135M on {m.get('cores')} CPU cores ({m.get('cpu')}), {result.get('prompts')} HumanEval prompts, "
             f"{result.get('max_new_tokens')} new tokens, greedy, every family trained about "
             f"{fmt(result.get('minutes_per_family'), 1)} min; commit {(entry.get('commit') or '')[:8]}, "
             f"{(entry.get('date') or '')[:10]} ([all figures](docs/results.md#families)):", ""]
            + table(["family", "drafts", "trained min", "τ", "speedup vs plain", "identical"], rows))


def render_readme(text: str, results: Path = RESULTS) -> str:
    """`text` (the README) with the block between README_START and README_END rendered from the records."""
    if README_START not in text or README_END not in text:
        raise ValueError(f"README.md has no '{README_START}' ... '{README_END}' block to render into")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    block = "\n".join(readme_families(all_records(results).get("families", []))).rstrip("\n")
    return f"{head}{README_START}\n{block}\n{README_END}{tail}"


# ----------------------------------------------------------------------------- staleness, asked at run time
def watched(bench: str) -> list[str]:
    """The paths whose change can change what `bench` measures."""
    paths = ["draftsmith", f"bench/{script(bench)}.py", "bench/common.py"]
    uses_families = bench in ("parallel_drafting", "levers", "levers_dflash")
    paths += ["bench/families.py"] if uses_families else []
    recipes = uses_families or bench in ("families", "eagle3_smollm2", "general_mix", "dflash_peer")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records' folder (default: results/)")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write or check (default: docs/results.md)")
    parser.add_argument("--readme", type=Path, default=README,
                        help="the README whose families table is rendered too (default: README.md)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the page or the README's table differs from what the records render")
    parser.add_argument("--stale", action="store_true", help="per canonical bench, whether its record is stale at HEAD")
    args = parser.parse_args()
    if args.stale:
        records = latest_records(args.results)
        for bench in CANONICAL:
            print(staleness(records[bench]) if bench in records else f"{bench}: no record")
        return 0
    pages = {args.page: render(args.results), args.readme: render_readme(args.readme.read_text(), args.results)}
    if args.check:
        wrong = [str(path) for path, text in pages.items() if not path.is_file() or path.read_text() != text]
        if wrong:
            print(f"{' and '.join(wrong)} not what {args.results} renders: run python bench/render_results.py",
                  file=sys.stderr)
            return 1
        return 0
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
