"""The engine load bench (bench/serving_engine.py, draftsmith/serving/engine_load.py): the scenario's arrivals, the
per-request figures and percentiles, the saturation flag and the side-by-side table without an engine; one short
replay in vLLM (marker `engine`, skipped without .venv-engine) with 4 requests at one rate."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from draftsmith.serving import engine_load
from draftsmith.serving.simulator import Request, simulate, summarize
from draftsmith.serving.traces import TracedPrompt

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"


# --------------------------------------------------------------------------- the scenario
def test_every_rate_replays_the_same_draws_and_prompts():
    names = ["a", "b", "c"]
    slow, fast = (engine_load.schedule(rate, 7, seed=3, prompt_names=names) for rate in (0.5, 2.0))
    assert [row["prompt"] for row in slow] == [row["prompt"] for row in fast]
    assert np.allclose([row["time"] for row in slow], [4 * row["time"] for row in fast])  # gaps scale as 1/rate
    times = [row["time"] for row in slow]
    assert times == sorted(times) and times[0] > 0
    assert set(row["prompt"] for row in slow[:3]) == set(names)  # a permutation, cycled
    other = engine_load.schedule(0.5, 7, seed=4, prompt_names=names)
    assert [row["time"] for row in other] != times


def test_the_engine_request_points_at_prompts_by_index():
    prompts = [{"name": "a", "token_ids": [1, 2, 3], "max_tokens": 5}, {"name": "b", "token_ids": [4], "max_tokens": 9}]
    rows = [{"time": 0.1, "prompt": "b"}, {"time": 0.4, "prompt": "a"}]
    request = engine_load.engine_request("/target", prompts, {1.0: rows}, cap=2, speculative_config=None)
    assert request["schedules"] == [{"label": 1.0, "arrivals": [{"time": 0.1, "prompt": 1}, {"time": 0.4, "prompt": 0}]}]
    assert request["max_model_len"] >= 3 + 5 and request["cap"] == 2


# --------------------------------------------------------------------------- per-request figures
def served(arrival, first, finish, tokens, prompt="a", submitted=None):
    return {"arrival": arrival, "submitted": arrival if submitted is None else submitted, "first_token": first,
            "finish": finish, "tokens": tokens, "prompt": prompt}


def test_times_and_percentiles_per_request():
    requests = [served(float(i), i + 0.1 * (i + 1), i + 0.1 * (i + 1) + 0.9, 10) for i in range(10)]
    summary = engine_load.summarize_engine(requests)
    ttft = [100.0 * (i + 1) for i in range(10)]
    assert summary["ttft_ms"]["p50"] == pytest.approx(np.percentile(ttft, 50))
    assert summary["ttft_ms"]["p90"] == pytest.approx(np.percentile(ttft, 90))
    assert summary["tpot_ms"]["p50"] == pytest.approx(100.0)  # 0.9 s over the 9 tokens after the first
    assert summary["e2e_ms"]["p90"] == pytest.approx(np.percentile([t + 900 for t in ttft], 90))
    assert summary["requests"] == 10
    assert engine_load.request_times(served(0.0, 0.2, 0.2, 1))["tpot_ms"] is None


def test_the_engine_side_measures_as_the_simulator_does():
    """A simulated run written as the worker's records gives serve-sim's own TTFT, TPOT and E2E p50 and p90."""
    class Cost:
        def step(self, batch, new_tokens, context):
            return 0.01 + 0.004 * batch

        def prefill(self, batch, prompt_tokens):
            return 0.02 * batch

    def prompt(name, new_tokens):
        return TracedPrompt(name, "chat", 30, new_tokens, 0.0, {}, {}, {})

    def off(batch, cost, view):
        return 0

    prompts = [prompt("a", 12), prompt("b", 5), prompt("c", 20)]
    requests = [Request(i, t, prompts[i % 3]) for i, t in enumerate([0.0, 0.01, 0.05, 0.3, 0.31, 0.6])]
    done = simulate(requests, Cost(), ((lambda r, v: (r.arrival,)), False), off, max_batch=2)
    theirs = summarize(done)
    ours = engine_load.summarize_engine([served(r.arrival, r.first_token, r.finish, r.emitted) for r in done])
    for metric in engine_load.METRICS:
        for stat in ("p50", "p90"):
            assert ours[metric][stat] == pytest.approx(theirs[metric][stat]), (metric, stat)


def test_a_short_or_disordered_request_is_reported():
    asked = {"a": 4}
    assert engine_load.check_requests([served(0.0, 0.1, 0.5, 4)], asked) == []
    short = engine_load.check_requests([served(0.0, 0.1, 0.5, 3)], asked)
    assert len(short) == 1 and "3 tokens, asked 4" in short[0]
    disordered = engine_load.check_requests([served(0.5, 0.1, 0.6, 4)], asked)
    assert len(disordered) == 1 and "out of order" in disordered[0]
    assert engine_load.check_requests([served(0.0, None, 0.6, 4)], asked)


def test_saturation_is_latency_growing_across_the_run():
    arrivals = list(range(9))
    steady = engine_load.saturation(arrivals, [100, 120, 90, 110, 100, 95, 105, 115, 100])
    assert steady["saturated"] is False
    growing = engine_load.saturation(arrivals, [100, 150, 200, 260, 320, 380, 440, 500, 560])
    assert growing["saturated"] is True and growing["growth"] == pytest.approx(500 / 150)
    shuffled = engine_load.saturation(arrivals[::-1], [100, 150, 200, 260, 320, 380, 440, 500, 560][::-1])
    assert shuffled["growth"] == pytest.approx(growing["growth"])  # by arrival, not by list order
    assert engine_load.saturation([0, 1], [1, 2])["saturated"] is None


# --------------------------------------------------------------------------- side by side
def figures(ttft, tpot, e2e, saturated=False):
    return {"ttft_ms": {"p50": ttft, "p90": 2 * ttft}, "tpot_ms": {"p50": tpot, "p90": 2 * tpot},
            "e2e_ms": {"p50": e2e, "p90": 2 * e2e}, "saturated": saturated}


def test_side_by_side_judges_unsaturated_rates_within_15_percent():
    engine = {"plain": {0.5: figures(100, 20, 1000), 1.0: figures(100, 20, 1000), 4.0: figures(900, 40, 9000, True)},
              "suffix": {0.5: figures(100, 20, 1000)}}
    sim = {"plain": {0.5: figures(110, 18, 900), 1.0: figures(116, 20, 1000), 4.0: figures(100, 20, 1000)},
           "suffix": {0.5: figures(100, 20, 1000)}}
    rows = {(row["method"], row["rate"]): row for row in engine_load.side_by_side(engine, sim)}
    assert rows[("plain", 0.5)]["ratio"]["ttft_ms"] == pytest.approx(1.1)
    assert rows[("plain", 0.5)]["within"] is True
    assert rows[("plain", 1.0)]["within"] is False  # TTFT 16% over
    assert rows[("plain", 4.0)]["judged"] is False and rows[("plain", 4.0)]["within"] is None
    lines = engine_load.table_lines(list(rows.values()))
    assert len(lines) == 1 + 4
    assert "not judged" in lines[3] and "NO" in lines[2] and lines[1].rstrip().endswith("yes")
    assert "1.10" in lines[1] and "110/220" in lines[1]


def test_a_method_missing_on_one_side_has_no_row():
    engine = {"drafter": {1.0: figures(100, 20, 1000)}}
    assert engine_load.side_by_side(engine, {"plain": {1.0: figures(100, 20, 1000)}}) == []


def test_the_results_page_renders_a_record_of_the_bench():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("render_results", ROOT / "bench" / "render_results.py")
    render_results = importlib.util.module_from_spec(spec)
    sys.modules["render_results"] = render_results
    spec.loader.exec_module(render_results)
    engine, sim = figures(100, 20, 1000), figures(110, 18, 900)
    rows = engine_load.side_by_side({"plain": {0.5: engine}}, {"plain": {0.5: sim}})
    result = {"prompts": 16, "num_requests": 40, "cap": 4, "draft_length": 3, "vllm_version": "0.32.0",
              "engine_eager": False, "tolerance": 0.15, "within": 1, "judged": 1, "rows": rows,
              "alone": {"engine_plain_ttft_p50_ms": 95.0, "cost_model_prefill_ms": 60.0}}
    text = "\n".join(render_results.CANONICAL["serving_engine"][1](result))
    for figure in ("at 1 of 1 unsaturated", "| plain | 0.500 | no | 100 | 110 | 1.10 |", "0.90", "| yes |",
                   "TTFT p50 95 ms against the cost model's prefill 60 ms"):
        assert figure in text, figure


# --------------------------------------------------------------------------- in vLLM
@pytest.mark.engine
def test_vllm_serves_four_requests_at_one_rate_with_ordered_times(smollm2, tmp_path):
    """4 requests, Poisson at 2/s, at most 2 in flight, in vLLM: each gets the tokens asked, and arrival ≤ submitted ≤
    first token ≤ finish, in the stream's clock and in the engine core's."""
    if not ENGINE_PYTHON.is_file():
        if os.environ.get("CI"):
            pytest.fail("CI run without .venv-engine: `make engine` makes it (.ci/run runs it before the tests).")
        pytest.skip("needs vLLM's venv: `make engine`")
    from draftsmith.engine_process import target_folder

    texts = ["def add(a, b):", "The capital of France is", "Write a haiku about rain.", "1, 2, 3, 4,"]
    prompts = [{"name": f"p{i}", "token_ids": smollm2.tokenizer(text)["input_ids"], "max_tokens": 6 + 2 * i}
               for i, text in enumerate(texts)]
    rows = engine_load.schedule(2.0, 4, seed=0, prompt_names=[p["name"] for p in prompts])
    request = engine_load.engine_request(target_folder("smollm2-135m-instruct"), prompts, {2.0: rows}, cap=2,
                                         speculative_config=None, enforce_eager=True)
    result = engine_load.run_engine(ENGINE_PYTHON, request, tmp_path, "plain")
    assert result["ok"], result
    [schedule] = result["schedules"]
    asked = {p["name"]: p["max_tokens"] for p in prompts}
    assert engine_load.check_requests(schedule["requests"], asked) == []
    assert [r["prompt"] for r in schedule["requests"]] == [row["prompt"] for row in rows]
    for r in schedule["requests"]:
        engine = r["engine"]
        assert r["submitted"] <= engine["queued_ts"] <= engine["first_token_ts"] <= engine["last_token_ts"] <= r["finish"]
    assert result["scheduler"]["max_num_seqs"] == 2 and result["scheduler"]["prefix_caching"] is False
    summary = engine_load.summarize_engine(schedule["requests"])
    assert 0 < summary["ttft_ms"]["p50"] <= summary["e2e_ms"]["p50"]
