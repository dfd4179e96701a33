"""Training levers A/B'd at equal wall time on the default recipe's data, decoded, over seeds.

    .venv/bin/python bench/levers.py --minutes 4 --num-prompts 40 --seeds 0 1 \
        --arm muon eagle3 train.optimizer=muon \
        --arm eagle3.1 eagle3 drafter.fc_norm=true drafter.norm_output=true \
        --arm lk-hybrid eagle3 drafter.loss=lk_hybrid

Every arm is a recipe of recipes/smollm2-135m/ with overrides; that recipe with no overrides is its baseline (an
arm named after the recipe, added when not given). For each seed (train.seed), bench/families.py trains every arm
for --minutes of wall time on the first recipe's prepared data (the default recipe's general mix) and decodes all
of them as chains of their recipe's report.draft_length on the same HumanEval prompts, interleaved prompt by
prompt with the plain loop, greedy. Per arm and seed: training steps, the τ its last validation's per-step
held-out accuracy implies, decoded τ, speedup over the plain loop of that seed's run, outputs identical to plain.

An arm **won** when its decoded τ and its implied τ are both above its baseline's in every seed, **lost** when
both are below in every seed, and is **mixed** otherwise; a recipe default changes only on a win. Each seed's
families.py output is kept as OUT/bench-seed<S>.json, and a rerun with the same arms and settings reuses the seeds
already done (a crash loses only the seed it was in). The record goes to results/levers/, or results/levers_<recipe>/
when no arm is of the default recipe (they train on the first recipe's data then, e.g. the dflash recipe's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = "eagle3"


def arms_with_baselines(arms: list[list[str]]) -> dict[str, dict]:
    """NAME -> {"recipe", "overrides", "baseline"} for every --arm, each recipe's baseline arm first (in the
    order the recipes first appear, the default recipe's first when it is used)."""
    given = {name: {"recipe": recipe, "overrides": list(overrides)} for name, recipe, *overrides in arms}
    recipes = list(dict.fromkeys(arm["recipe"] for arm in given.values()))
    recipes.sort(key=lambda recipe: recipe != DEFAULT_RECIPE)  # its data is every arm's
    result = {}
    for recipe in recipes:
        if recipe in given and given[recipe]["recipe"] != recipe:
            raise SystemExit(f"--arm {recipe}: the name of a recipe's baseline must be that recipe's")
        if given.get(recipe, {}).get("overrides"):
            raise SystemExit(f"--arm {recipe}: an arm named after its recipe is that recipe's baseline and takes no "
                             "overrides; give the arm another name")
        result[recipe] = {"recipe": recipe, "overrides": [], "baseline": None}
    for name, arm in given.items():
        if name not in result:
            result[name] = {**arm, "baseline": arm["recipe"]}
    return result


def seed_figures(bench: dict, arms: dict[str, dict]) -> dict[str, dict]:
    """Per arm, its figures in one seed's families.py output."""
    figures = {}
    for name in arms:
        family = bench["families"][name]
        row = bench["methods"][f"{name} chain ({family['draft_length']})"]
        figures[name] = {"steps": family["steps"], "train_minutes": family["train_minutes"],
                         "held_out_accuracy": family["held_out_accuracy"],
                         "implied_tau": family["implied_acceptance_length"], "tau": row["acceptance_length"],
                         "speedup": row["speedup_vs_plain"], "identical": row["identical_to_plain"],
                         "draft_ms_per_pass": row["draft_ms_per_cycle"]}
    return figures


def verdict(arm: list[dict], baseline: list[dict]) -> str:
    """won / lost / mixed: an arm's figures per seed against its baseline's in the same seeds."""
    pairs = list(zip(arm, baseline, strict=True))
    if all(a["tau"] > b["tau"] and a["implied_tau"] > b["implied_tau"] for a, b in pairs):
        return "won"
    if all(a["tau"] < b["tau"] and a["implied_tau"] < b["implied_tau"] for a, b in pairs):
        return "lost"
    return "mixed"


def summarize(arms: dict[str, dict], seeds: dict[int, dict[str, dict]]) -> dict[str, dict]:
    """Per arm: its recipe, overrides, baseline, figures per seed, their means, and its verdict."""
    summary = {}
    order = sorted(seeds)
    for name, arm in arms.items():
        per_seed = [seeds[seed][name] for seed in order]
        entry = {**arm, "seeds": order, "per_seed": per_seed}
        for key in ("steps", "implied_tau", "tau", "speedup", "draft_ms_per_pass"):
            entry[f"mean_{key}"] = statistics.fmean(figures[key] for figures in per_seed)
        entry["identical"] = sum(figures["identical"] for figures in per_seed)
        if arm["baseline"] is not None:
            base = [seeds[seed][arm["baseline"]] for seed in order]
            entry["verdict"] = verdict(per_seed, base)
            entry["tau_vs_baseline"] = entry["mean_tau"] / statistics.fmean(b["tau"] for b in base)
            entry["implied_vs_baseline"] = entry["mean_implied_tau"] / statistics.fmean(b["implied_tau"] for b in base)
        summary[name] = entry
    return summary


def families_command(args: argparse.Namespace, arms: dict[str, dict], seed: int) -> list[str]:
    baselines = [name for name, arm in arms.items() if arm["baseline"] is None]
    command = [sys.executable, str(ROOT / "bench" / "families.py"), "--families", *baselines]
    for name, arm in arms.items():
        if arm["baseline"] is not None:
            command += ["--family", name, arm["recipe"], *arm["overrides"]]
    return command + ["--minutes", str(args.minutes), "--num-prompts", str(args.num_prompts),
                      "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
                      "--without", "generate", "lookup", "suffix", "--trees", "--hybrid", "--out", str(args.out),
                      "--no-record", "--set", f"train.seed={seed}", *args.set]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "RECIPE"),
                        help="an arm: its name, a recipe of recipes/smollm2-135m/ (file name without .yaml), then "
                             "its overrides (section.field=value); repeat for more")
    parser.add_argument("--minutes", type=float, default=4.0, help="training wall-time budget of every arm")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="train.seed of each repetition")
    parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                        help="overrides of every arm's recipe (passed to families.py --set)")
    records.add_shared_options(parser, num_prompts=40, max_new_tokens=96, threads=0, out="runs/bench-levers",
                               helps={"out": "where families.py puts its runs, and each seed's bench-seed<S>.json"})
    args = parser.parse_args()
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    if any(len(arm) < 2 for arm in args.arm):
        parser.error("--arm needs a name and a recipe")
    arms = arms_with_baselines(args.arm)
    out = Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    settings = {"arms": arms, "minutes": args.minutes, "num_prompts": args.num_prompts,
                "max_new_tokens": args.max_new_tokens, "set": args.set}
    seeds = {}
    for seed in args.seeds:
        kept = out / f"bench-seed{seed}.json"
        if kept.is_file() and json.loads(kept.read_text()).get("levers_settings") == settings:
            print(f"seed {seed}: reusing {kept}", flush=True)
        else:
            command = families_command(args, arms, seed)
            print(f"seed {seed}: running", " ".join(command), flush=True)
            subprocess.run(command, check=True, cwd=ROOT)
            bench = json.loads((out / "bench.json").read_text())
            bench["levers_settings"] = settings
            partial = kept.with_suffix(".json.partial")
            partial.write_text(json.dumps(bench, indent=2))
            partial.replace(kept)
        seeds[seed] = seed_figures(json.loads(kept.read_text()), arms)

    summary = summarize(arms, seeds)
    first = json.loads((out / f"bench-seed{args.seeds[0]}.json").read_text())
    result = {"minutes": args.minutes, "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
              "data_recipe": data_recipe(arms), "seeds": args.seeds, "set": args.set, "arms": summary, "environment": first.get("environment"),
              "small_batch_linear_rows": {seed: json.loads((out / f"bench-seed{seed}.json").read_text()).get(
                  "small_batch_linear_rows") for seed in args.seeds}}
    print(f"\n{args.minutes:g} min per arm, seeds {' '.join(map(str, args.seeds))}, {args.num_prompts} HumanEval "
          f"prompts, {args.max_new_tokens} new tokens, greedy")
    print(f"{'arm':<14} {'steps':>6} {'implied τ':>18} {'decoded τ':>18} {'speedup':>16} {'identical':>9}  verdict")
    for name, entry in summary.items():
        def both(key: str, digits: int = 2) -> str:
            return " / ".join(f"{figures[key]:.{digits}f}" for figures in entry["per_seed"])
        total = args.num_prompts * len(args.seeds)
        print(f"{name:<14} {entry['mean_steps']:6.0f} {both('implied_tau'):>18} {both('tau'):>18} "
              f"{both('speedup'):>16} {entry['identical']:>4}/{total}  {entry.get('verdict', 'baseline')}")
    records.write(record_name(arms), result, args)


def data_recipe(arms: dict[str, dict]) -> str:
    """The recipe whose prepared data every arm trains on: the first baseline's (the default recipe's when used)."""
    return next(name for name, arm in arms.items() if arm["baseline"] is None)


def record_name(arms: dict[str, dict]) -> str:
    """levers for A/Bs on the default recipe's data, levers_<recipe> on another's: each keeps its own latest record."""
    recipe = data_recipe(arms)
    return "levers" if recipe == DEFAULT_RECIPE else f"levers_{recipe.replace('-', '_')}"


if __name__ == "__main__":
    main()
