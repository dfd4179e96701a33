"""One table function per canonical bench: a record's `result` -> the markdown lines of its section (figures
formatted with fixed digits by results_format). Goal verdicts are not here: one record is one run, and a verdict
is over runs (results_verdicts)."""

from __future__ import annotations

from results_format import fmt, human_bytes, identical, pct, short_commit, short_hash, table
from results_verdicts import (hybrid_over_better_single, hybrid_over_plain, largest_cache_over_per_request,
                              mix_over_code_on_humaneval, mix_over_code_worst_other_category, worst_category)


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
                     fmt(info.get("implied_acceptance_length")), fmt((info.get("trainable_parameters") or 0) / 1e6),
                     short_hash(info.get("sha256"))])
    lines += table(["family", "recipe", "steps", "train min", "training tok/s", "× target forward",
                    "held-out accuracy per step", "implied τ", "trainable M", "drafter sha256"], rows)
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
                     fmt(best.get("implied_acceptance_length"), 3), short_hash(info.get("sha256"))])
    lines += table(["draft vocabulary", "steps trained", "train min", "best/ step", "held-out acc 0 / 1",
                    "implied τ", "drafter sha256"], rows)
    rows = [[name, fmt(row.get("tokens_per_s")), fmt(row.get("acceptance_length")),
             fmt(row.get("speedup_vs_plain"), 2, "×"), fmt(row.get("speedup_vs_generate_prompt_lookup"), 2, "×"),
             pct(row.get("draft_time_fraction"), 0), identical(row.get("identical_to_plain"), prompts)]
            for name, row in result.get("methods", {}).items()]
    return lines + table(["method", "tok/s", "τ", "vs plain", "vs generate(prompt_lookup)", "draft time",
                          "identical"], rows)


def serving(result: dict) -> list[str]:
    """serve-sim: the drafters traced, the validation checks, where speculation pays, and mean / p99 E2E per
    policy and rate."""
    drafters = result.get("drafters", {})
    named = ", ".join(f"`{folder}` (sha256 {short_hash(sha)})" for folder, sha in drafters.items())
    lines = [f"Drafters traced: {named}.", ""] if drafters else []
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


def feature_storage(result: dict) -> list[str]:
    """Disk a capture takes per storage option, from the formula `draftsmith capture` writes by."""
    lines = [(f"Hidden size {result.get('hidden_size')} ({result.get('num_layers')} layers), "
             f"{result.get('conversations'):,} conversations × {result.get('tokens_per_conversation'):,} tokens."), ""]
    rows = [[o["features"], f"{o['bytes_per_token']:,}", human_bytes(o["capture_bytes"]), "0 B"]
            for o in result.get("options", [])]
    return lines + table(["features stored", "bytes per token", "whole capture", "online (data.online)"], rows)


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
    return lines + [f"This run: the mix's HumanEval speedup {fmt(mix_over_code_on_humaneval(result), 3)}× the code "
                    f"arm's; in its worst category but code, {fmt(mix_over_code_worst_other_category(result), 3)}× the "
                    "code arm's (the goals, over runs, are below).", ""]


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
    lines = [f"`{result.get('drafter')}` (sha256 {short_hash(result.get('drafter_sha256'))}) on "
             f"{result.get('num_prompts')} prompts of {result.get('prompts')}{times}, "
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
    checks, worst = result.get("checks", {}), worst_category(result)
    overall = (f"hybrid {fmt(hybrid_over_plain(result))}× plain and {fmt(hybrid_over_better_single(result), 3)}× the "
               "better single method; " if result.get("prompts") == "humaneval" else "")  # HumanEval's goal only
    where = f"worst category {fmt(worst[1], 3)}× its better single method ({worst[0]}); " if worst else ""
    return lines + [f"This run: {overall}{where}lossless: {fmt(checks.get('lossless'))} (the goals, over runs, are "
                    "below).", ""]


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
    return lines + [f"This run: the largest cache {fmt(largest_cache_over_per_request(result), 3)}× per-request suffix "
                    f"matching's speedup (the goal, over runs, is below); every cache within its bound: "
                    f"{fmt(checks.get('cache_within_bound'))}.", ""]


def parity(result: dict) -> list[str]:
    """The same drafters decoded by an older commit's code and by the record's: the figures that must be equal, side
    by side, and each side's speedup over its own plain loop."""
    sides = result.get("sides", {})
    old, new = (short_commit(sides.get(side, {})) for side in ("old", "new"))
    trained = (f"Drafters trained {result.get('steps')} steps each by the new code ({', '.join(result['families'])}), "
               if result.get("families") else "No drafter trained; ")
    lines = [f"{trained}decoded by {old} (old, "
             f"`--against {result.get('against')}`) and {new} (new): the first {result.get('num_prompts')} prompts of "
             f"{', '.join(result.get('prompt_sets') or [])}, {result.get('max_new_tokens')} new tokens, greedy, whole "
             f"chains, no adaptive lengths, torch's own linear layers; {result.get('equal')} of "
             f"{result.get('compared')} methods equal in every drafted, accepted and emitted count."
             + (f" Not decoded: {', '.join(result['not_decoded'])}." if result.get("not_decoded") else ""), ""]
    rows = []
    for row in result.get("rows", []):
        sides_of = [row.get(side, {}) for side in ("old", "new")]
        lossless = ["error" if "error" in side else identical(*(side.get("lossless") or [None, None]))
                    for side in sides_of]
        verdict = row.get("comparison", {})
        rows.append([row.get("method"), row.get("prompts"), *(fmt(side.get("acceptance_length"), 3) for side in sides_of),
                     *lossless, *(fmt(side.get("speedup"), 2, "×") for side in sides_of),
                     "yes" if verdict.get("equal") else "no: " + ", ".join(verdict.get("differences", []))])
    return lines + table(["method", "prompts", "old τ", "new τ", "old identical", "new identical", "old speedup",
                          "new speedup", "equal"], rows)


def regeneration(result: dict) -> list[str]:
    """The same rows regenerated by our loop and by vLLM in one run: throughput of each, the ratio, greedy identity."""
    sides = result.get("sides", {})
    engine = sides.get("vllm", {})
    lines = [f"{result.get('rows')} rows of {', '.join(result.get('inputs') or [])} answered greedily by "
             f"`regenerate_conversations` ({result.get('max_new_tokens')} new tokens, batches of "
             f"{result.get('batch_size')}, {result.get('dtype')}), by our loop and by vLLM {result.get('vllm_version')} "
             f"({'eager' if result.get('engine_eager') else 'compiled'}); each side's time is the whole call, the "
             f"engine's start-up ({fmt(engine.get('start_seconds'), 0)} s) included.", ""]
    rows = [[name, fmt(side.get("seconds"), 1), fmt(side.get("rows_per_minute")),
             fmt(side.get("answer_tokens_per_minute"), 0), fmt(side.get("answer_tokens")),
             fmt(side.get("cpu_seconds"), 1), fmt(side.get("rows_per_cpu_minute"))] for name, side in sides.items()]
    lines += table(["side", "seconds", "rows / min", "answer tokens / min", "answer tokens", "CPU seconds",
                    "rows / CPU min"], rows)
    differing = result.get("differing", {})
    gaps = ", ".join(fmt(d.get("our_logit_gap"), 3) for d in differing.values())
    return lines + [f"vLLM against our loop: {fmt(result.get('engine_ratio'), 2, '×')} rows per minute "
                    f"({fmt(result.get('engine_ratio_without_start'), 2, '×')} without its start-up, "
                    f"{fmt(result.get('engine_ratio_cpu'), 2, '×')} per CPU second); identical "
                    f"answers {identical(result.get('identical_rows'), result.get('rows'))} rows"
                    + (f"; our logit gaps where the others first part: {gaps}" if differing else "") + ".", ""]


def serving_engine(result: dict) -> list[str]:
    """vLLM serving a Poisson load beside serve-sim on the same arrivals: TTFT / TPOT p50 of each side per method and
    rate, sim/engine, saturation, and whether the p50s are within the bench's tolerance."""
    lines = [f"{result.get('prompts')} prompts, {result.get('num_requests')} requests per rate, at most "
             f"{result.get('cap')} in flight, draft length {result.get('draft_length')}, vLLM "
             f"{result.get('vllm_version')} ({'eager' if result.get('engine_eager') else 'compiled'}); TTFT and TPOT "
             f"p50 within {pct(result.get('tolerance'), 0)} at {result.get('within')} of {result.get('judged')} "
             "unsaturated (method, rate) pairs" + (" (a contended smoke run)" if result.get("contended") else "") + ".",
             ""]
    rows = []
    for row in result.get("rows", []):
        engine, sim, ratio = row.get("engine", {}), row.get("sim", {}), row.get("ratio", {})
        cells = [row.get("method"), fmt(row.get("rate"), 3), fmt(engine.get("saturated"))]
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
            cells += [fmt((engine.get(metric) or {}).get("p50"), 0), fmt((sim.get(metric) or {}).get("p50"), 0),
                      fmt(ratio.get(metric))]
        rows.append(cells + ["not judged" if not row.get("judged") else fmt(row.get("within"))])
    lines += table(["method", "rate (req/s)", "saturated", "TTFT p50 engine (ms)", "TTFT p50 sim (ms)", "sim/engine",
                    "TPOT p50 engine (ms)", "TPOT p50 sim (ms)", "sim/engine", "E2E p50 engine (ms)",
                    "E2E p50 sim (ms)", "sim/engine", "within"], rows)
    alone = result.get("alone", {})
    return lines + [f"Alone, at the lowest rate: engine plain TTFT p50 {fmt(alone.get('engine_plain_ttft_p50_ms'), 0)} ms "
                    f"against the cost model's prefill {fmt(alone.get('cost_model_prefill_ms'), 0)} ms; engine plain "
                    f"TPOT p50 {fmt(alone.get('engine_plain_tpot_p50_ms'), 1)} ms against its decode pass "
                    f"{fmt(alone.get('cost_model_step_ms'), 1)} ms (b = 1).", ""]


def data_paths(result: dict) -> list[str]:
    """The default recipe's data paths side by side: trainable tokens per data minute, and each arm's drafter decoded
    alone on hand-written and suite prompts."""
    arms = result.get("arms", {})
    sets = sorted({name for arm in arms.values() for name in arm.get("prompt_sets", {})})
    lines = [f"Each arm is recipes/smollm2-135m/eagle3.yaml with `{' '.join(result.get('overrides') or [])}` and its own "
             f"overrides; its drafter decodes the first {result.get('num_prompts')} prompts of each set, "
             f"{result.get('max_new_tokens')} new tokens, greedy, chains with the report's fallback. Data minutes are "
             "the prepare report's and the capture manifest's own seconds. One run, one seed.", ""]
    rows = []
    for name, arm in arms.items():
        cells = []
        for prompts in sets:
            s = arm.get("prompt_sets", {}).get(prompts, {})
            cells.append(f"τ {fmt(s.get('acceptance_length'), 2)}, α1 {fmt(s.get('first_position_acceptance'), 2)}, "
                         f"{fmt(s.get('speedup'), 2, '×')}")
        rows.append([name, " ".join(arm.get("overrides") or []) or "(as shipped)", fmt(arm.get("data_minutes"), 1),
                     fmt(arm.get("trainable_tokens")), fmt(arm.get("tokens_per_data_minute")), fmt(arm.get("steps")),
                     *cells])
    return lines + table(["arm", "overrides", "data min", "trainable tokens", "tokens / data min", "steps",
                          *[f"{prompts}: τ, α1, × plain" for prompts in sets]], rows) + [""]
