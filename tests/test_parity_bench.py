"""bench/parity.py: one side's eval output becomes the figures compared, two sides agree only when every drafted,
accepted and emitted count does, the record keeps cycles as a hash, and the renderer puts a record in its table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("parity_bench", ROOT / "bench" / "parity.py")
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


def side(cycles=((2, 1, 2), (2, 2, 3)), speedup=1.1, histogram=(0, 1, 1)) -> dict:
    """One side's figures from a results.json and traces.json of two verify passes on one prompt."""
    results = {"acceptance_length": 2.5, "acceptance_per_position": [1.0, 0.5], "verify_passes": 2, "new_tokens": 5,
               "accept_length_histogram": list(histogram), "lossless": {"checked": 1, "identical": 1},
               "speedup": speedup, "tokens_per_s": {"overall": 9.0}, "baselines": {"plain": {"tokens_per_s": 8.0}}}
    traces = {"main": "2", "prompts": [{"name": "suite-0", "runs": {"2": {"cycles": [[*c, 0.5, 3.0] for c in cycles]}}}]}
    return parity.figures(results, traces)


def test_figures_read_counts_and_cycles_without_timings():
    figures = side()
    assert figures["lossless"] == [1, 1]
    assert figures["accepted_per_position"] == [2, 1]  # position 1 accepted by both passes, position 2 by one
    assert figures["cycles"] == {"suite-0": [[2, 1, 2], [2, 2, 3]]}  # draft and verify milliseconds dropped
    assert figures["plain_tokens_per_s"] == 8.0


def test_timings_differ_yet_the_sides_are_equal():
    verdict = parity.compare(side(speedup=1.1), side(speedup=0.7))
    assert verdict == {"equal": True, "differences": []}


def test_a_different_cycle_is_found_and_located():
    verdict = parity.compare(side(), side(cycles=((2, 1, 2), (2, 1, 2), (1, 0, 1))))
    assert not verdict["equal"] and verdict["differences"] == ["cycles"]
    assert verdict["first_difference"] == {"prompt": "suite-0", "cycle": 1, "old": [[2, 2, 3]],
                                           "new": [[2, 1, 2], [1, 0, 1]]}
    assert parity.compare(side(), side(histogram=(1, 1)))["differences"] == ["accepted_per_position",
                                                                             "accept_length_histogram"]


def test_a_side_that_failed_is_never_equal():
    assert parity.compare({"error": "cannot read config.json"}, side()) == {"equal": False, "differences": ["error"]}


def test_the_record_keeps_cycles_as_a_count_and_a_hash():
    a, b = parity.compact(side()), parity.compact(side(cycles=((2, 2, 3), (2, 1, 2))))
    assert a["cycles"]["count"] == b["cycles"]["count"] == 2
    assert a["cycles"]["sha256"] != b["cycles"]["sha256"]
    assert parity.compact({"error": "x"}) == {"error": "x"}


def test_every_method_decodes_whole_chains_without_adaptive_lengths():
    first = parity.methods_of("eagle3", "d/eagle3", "eagle", 2, True, "4,4,8", 10)
    assert list(first) == ["eagle3 hybrid", "eagle3 chain (2)", "eagle3 tree (4,4,8)"]
    assert first["eagle3 hybrid"][:2] == ["--drafter", "hybrid:d/eagle3"]
    assert first["eagle3 chain (2)"][-4:] == ["--fallback", "false", "--confidence-cut", "false"]
    draft_lm = parity.methods_of("draft-lm", "d/lm", "draft_lm", 4, False, "4,4,8", 10)
    assert list(draft_lm) == ["draft-lm chain (4)"]
    assert "--confidence-cut" not in draft_lm["draft-lm chain (4)"]  # a draft LM has no confidences to cut by
    for options in (first["eagle3 hybrid"], *parity.training_free(10).values()):
        assert "--no-adaptive-lookup" in options


def test_a_family_trains_in_folders_of_its_own_under_out():
    written = {"data": {"prepared": "runs/{target}/data-mix", "features": "runs/{target}/features-mix-top8",
                        "draft_vocab": "runs/{target}/data-mix", "online": False}}
    options = parity.train_options(written, "eagle3", Path("/o"), 30, ["data.max_length=256"])
    assert options[:4] == ["output_dir=/o/drafters/eagle3", "data.prepared=/o/data-mix", "data.draft_vocab=/o/data-mix",
                           "data.features=/o/features-mix-top8"]
    assert "train.max_steps=30" in options and "train.max_minutes=0" in options and options[-1] == "data.max_length=256"
    online = parity.train_options({"data": {"prepared": "runs/{target}/data", "draft_vocab": None}}, "mtp", Path("/o"),
                                  30, [])
    assert [o for o in online if o.startswith("data.")] == ["data.prepared=/o/data"]


def test_the_renderer_tables_a_record():
    import results_tables

    row = {"method": "suffix", "prompts": "humaneval", "old": parity.compact(side()), "new": {"error": "boom"},
           "comparison": {"equal": False, "differences": ["error"]}}
    lines = results_tables.parity({"against": "2becfc6", "sides": {"old": {"commit": "a" * 40},
                                                                    "new": {"commit": "b" * 40}},
                                   "steps": 30, "num_prompts": 6, "prompt_sets": ["humaneval"], "max_new_tokens": 48,
                                   "equal": 0, "compared": 1, "rows": [row]})
    text = "\n".join(lines)
    assert "aaaaaaaa (old" in text and "| suffix | humaneval | 2.500 | – | 1/1 | error | 1.10× | – | no: error |" in text
