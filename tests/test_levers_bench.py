"""bench/levers.py: arms get their recipe's baseline, one seed's families.py output becomes figures per arm, the
verdict compares an arm with its baseline seed by seed, and the renderer puts a record's figures in its table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("levers_bench", ROOT / "bench" / "levers.py")
levers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(levers)


def test_every_recipe_gets_its_baseline_arm_the_default_recipes_first():
    arms = levers.arms_with_baselines([["dpace", "dflash", "drafter.position_weighting=dpace"],
                                       ["muon", "eagle3", "train.optimizer=muon"]])
    assert list(arms) == ["eagle3", "dflash", "dpace", "muon"]
    assert arms["eagle3"] == {"recipe": "eagle3", "overrides": [], "baseline": None}
    assert arms["muon"] == {"recipe": "eagle3", "overrides": ["train.optimizer=muon"], "baseline": "eagle3"}
    assert arms["dpace"]["baseline"] == "dflash"
    with pytest.raises(SystemExit, match="takes no overrides"):
        levers.arms_with_baselines([["eagle3", "eagle3", "train.lr=1e-2"]])


def test_arms_on_another_recipes_data_keep_a_record_of_their_own():
    on_default = levers.arms_with_baselines([["dpace", "dflash", "drafter.position_weighting=dpace"],
                                             ["muon", "eagle3", "train.optimizer=muon"]])
    assert levers.data_recipe(on_default) == "eagle3" and levers.record_name(on_default) == "levers"
    dflash_only = levers.arms_with_baselines([["all", "dflash", "drafter.anchors_per_sequence=0"]])
    assert levers.data_recipe(dflash_only) == "dflash" and levers.record_name(dflash_only) == "levers_dflash"
    assert levers.record_name(levers.arms_with_baselines([["x", "draft-lm", "train.lr=1e-3"]])) == "levers_draft_lm"


def bench_output(figures: dict[str, tuple[float, float]]) -> dict:
    """A families.py bench.json with each arm's (implied τ, decoded τ)."""
    families = {name: {"draft_length": 2, "steps": 100, "train_minutes": 4.0, "held_out_accuracy": [0.4, 0.3],
                       "implied_acceptance_length": implied} for name, (implied, _) in figures.items()}
    methods = {f"{name} chain (2)": {"acceptance_length": tau, "speedup_vs_plain": tau * 0.8, "identical_to_plain": 40,
                                     "draft_ms_per_cycle": 5.0} for name, (_, tau) in figures.items()}
    return {"families": families, "methods": {"plain": {}, **methods}}


def test_a_lever_wins_only_above_its_baseline_in_every_seed_on_both_taus():
    arms = levers.arms_with_baselines([["a", "eagle3", "x=1"], ["b", "eagle3", "x=2"], ["c", "eagle3", "x=3"]])
    seeds = {0: levers.seed_figures(bench_output({"eagle3": (1.5, 1.6), "a": (1.6, 1.7), "b": (1.4, 1.5),
                                                  "c": (1.6, 1.5)}), arms),
             1: levers.seed_figures(bench_output({"eagle3": (1.5, 1.6), "a": (1.55, 1.61), "b": (1.45, 1.55),
                                                  "c": (1.6, 1.7)}), arms)}
    summary = levers.summarize(arms, seeds)
    assert [summary[n].get("verdict") for n in ("eagle3", "a", "b", "c")] == [None, "won", "lost", "mixed"]
    assert summary["a"]["mean_tau"] == pytest.approx((1.7 + 1.61) / 2)
    assert summary["a"]["tau_vs_baseline"] == pytest.approx((1.7 + 1.61) / 2 / 1.6)
    assert summary["b"]["implied_vs_baseline"] == pytest.approx(1.425 / 1.5)
    assert summary["a"]["identical"] == 80 and summary["a"]["per_seed"][1]["speedup"] == pytest.approx(1.61 * 0.8)


def test_the_command_trains_every_arm_under_its_name_and_seed():
    arms = levers.arms_with_baselines([["muon", "eagle3", "train.optimizer=muon"]])
    args = type("Args", (), {"minutes": 4.0, "num_prompts": 40, "max_new_tokens": 96, "threads": 0,
                             "out": "runs/x", "set": ["train.lr=2e-3"]})()
    command = levers.families_command(args, arms, seed=1)
    text = " ".join(command)
    assert "--families eagle3 --family muon eagle3 train.optimizer=muon" in text
    assert command[-2:] == ["train.seed=1", "train.lr=2e-3"] and "--trees --hybrid" in text
