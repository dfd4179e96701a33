"""serve-sim: cost model, trace replay, policies on hand-made workloads, conservation, checks, bad input."""

import json

import numpy as np
import pytest

from draftsmith import cli
from draftsmith.errors import DraftsmithError
from draftsmith.serving import experiment, policies
from draftsmith.serving.costmodel import CostModel, load_profile
from draftsmith.serving.simulator import Request, summarize, workload
from draftsmith.serving.traces import TracedPrompt, TraceSet

TARGET = {"name": "tiny", "config_sha256": "c" * 64, "tokenizer_sha256": "t" * 64}


def step_seconds(b, n, c):
    """A cost inside the fitted family (so the fit is exact): fixed part, per row token, per cached token."""
    return 0.010 + 0.002 * b * n + 1e-5 * b * c


def cost_model(batches=(1, 2, 4, 8)):
    axes = [list(batches), [1, 2, 3, 5, 9], [16, 64, 256]]
    decode = np.array([[[step_seconds(b, n, c) for c in axes[2]] for n in axes[1]] for b in axes[0]])
    prefill_axes = [list(batches), [8, 64]]
    prefill = np.array([[0.005 + 1e-4 * b * n for n in prefill_axes[1]] for b in prefill_axes[0]])
    return CostModel(axes, decode, prefill_axes, prefill, dict(TARGET), {"cpu": "test"}, [])


def traced(name, new_tokens, accepted_per_cycle=0, length=4, category="all", prompt_tokens=8, draft_s=0.001):
    """A prompt whose every verify cycle at `length` drafts `length` and accepts `accepted_per_cycle`."""
    cycles, starts, position = [], [], 1
    while position < new_tokens:
        emitted = min(accepted_per_cycle + 1, new_tokens - position)
        cycles.append([length, accepted_per_cycle, emitted, draft_s])
        starts.append(position)
        position += emitted
    table = np.array(cycles, dtype=float).reshape(-1, 4)
    return TracedPrompt(name, category, prompt_tokens, new_tokens, 1.0, {length: 1.0}, {length: table},
                        {length: np.array(starts, dtype=float)})


def trace_set(prompts, length=4):
    return TraceSet("traces.json", dict(TARGET), {"kind": "test"}, length, [length], prompts, {})


def run(prompts, arrivals, policy, mode="off", max_batch=1, length=4):
    requests = [Request(i, t, p) for i, (p, t) in enumerate(zip(prompts, arrivals))]
    return experiment.simulate_one(cost_model(), trace_set(prompts, length), policy, mode, requests, max_batch)


def finish_order(requests):
    return [r.prompt.name for r in sorted(requests, key=lambda r: r.finish)]


# --------------------------------------------------------------------------- cost model
def test_the_model_recovers_a_cost_of_the_fitted_family_inside_and_past_the_grid():
    model = cost_model()
    for point in [(1, 1, 16), (3, 4, 100), (8, 9, 256), (6, 7, 200), (8, 9, 512), (16, 2, 1024)]:  # last two: past it
        assert model.step(*point) == pytest.approx(step_seconds(*point))
    assert model.prefill(3, 30) == pytest.approx(0.005 + 1e-4 * 3 * 30)
    assert model.prefill(2, 300) == pytest.approx(0.005 + 1e-4 * 2 * 300)
    assert model.fit_error()["decode_max"] < 1e-9


def test_measured_points_outside_any_formula_are_kept_and_interpolated_between():
    """On a CPU a 2-3 token pass can cost more than a 5-token one; a few-term fit smears that over every b.
    The model gives each measured point back and interpolates linearly between neighbours."""
    model = cost_model()
    model.decode_s[0, 2, :] *= 1.6  # b = 1, n = 3 measured much dearer than the family says
    model.__post_init__()
    assert model.step(1, 3, 64) == pytest.approx(1.6 * step_seconds(1, 3, 64))
    assert model.step(1, 5, 64) == pytest.approx(step_seconds(1, 5, 64))  # its neighbours stay as measured
    assert model.step(2, 3, 64) == pytest.approx(step_seconds(2, 3, 64))
    between = model.step(1, 4, 64)  # halfway from n = 3 to n = 5
    assert between == pytest.approx((1.6 * step_seconds(1, 3, 64) + step_seconds(1, 5, 64)) / 2)
    assert model.step(1, 3, 40) == pytest.approx(1.6 * step_seconds(1, 3, 40))  # linear in c between 16 and 64


def test_profile_round_trips_through_json(tmp_path):
    model = cost_model()
    loaded = load_profile(model.save(tmp_path / "p.json"))
    assert loaded.step(3, 4, 100) == pytest.approx(model.step(3, 4, 100)) and loaded.target == TARGET
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DraftsmithError, match="not a draftsmith cost profile"):
        load_profile(tmp_path / "bad.json")


def test_profile_times_a_real_padded_batch(tiny_llama, tmp_path):
    from draftsmith.serving.command import ProfileConfig, profile_target

    config = ProfileConfig(target="tiny", out=str(tmp_path / "p.json"), batch_sizes=[1, 2, 4], new_tokens=[1, 3],
                           contexts=[8, 24], prompt_lengths=[8, 16], rounds=2, small_batch_linear=False)
    model = profile_target(config, target=tiny_llama)
    assert model.decode_s.shape == (3, 2, 2) and (model.decode_s > 0).all()
    assert [row["batch"] for row in model.batched_check] == [2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert load_profile(tmp_path / "p.json").target == tiny_llama.fingerprint()


# --------------------------------------------------------------------------- trace replay
def test_cycle_at_replays_exactly_and_resumes_inside_a_cycle():
    prompt = traced("p", 11, accepted_per_cycle=3)  # cycles start at 1, 5, 9
    assert prompt.cycle_at(4, 1) == (4, 3, 0.001) and prompt.cycle_at(4, 5) == (4, 3, 0.001)
    assert prompt.cycle_at(4, 6)[:2] == (3, 2)  # switched lengths: the rest of that cycle's accepted run
    assert prompt.cycle_at(0, 6) == (0, 0, 0.0)


# --------------------------------------------------------------------------- policies, known optimal orders
def test_fcfs_serves_in_arrival_order():
    done = run([traced("long", 20), traced("short-a", 3), traced("short-b", 3)], [0.0, 0.001, 0.002], "fcfs")
    assert finish_order(done) == ["long", "short-a", "short-b"]


@pytest.mark.parametrize("name", ["srf-oracle", "srf-predicted"])
def test_shortest_remaining_first_minimises_mean_completion(name):
    # the predictor learns from the other prompts of the same category, so categories carry the lengths
    prompts = [traced("long", 20, category="essay"), traced("long-2", 20, category="essay"), traced("long-3", 20, category="essay"),
               traced("short-a", 3, category="fact"), traced("short-b", 3, category="fact"), traced("short-c", 3, category="fact")]
    arrivals = [0.0, 0.0001, 0.0002, 0.0003, 0.0004, 0.0005]
    done = run(prompts, arrivals, name)
    assert finish_order(done)[:3] == ["short-a", "short-b", "short-c"]  # shortest processing time first is optimal
    fcfs = run(prompts, arrivals, "fcfs")
    assert summarize(done)["e2e_ms"]["mean"] < summarize(fcfs)["e2e_ms"]["mean"]


def test_length_predictor_is_leave_one_out_and_reports_its_error():
    prompts = [traced("a", 10, category="x"), traced("b", 20, category="x"), traced("c", 30, category="x")]
    predictor = policies.LengthPredictor(prompts)
    assert predictor.total(prompts[0], 1) == pytest.approx(25.0)  # mean of b and c, never a itself
    assert predictor.total(prompts[2], 15) == pytest.approx(20.0)  # re-predicted: only the longer ones count
    error = predictor.error()
    assert error["mae_at_admission_tokens"] == pytest.approx((15 + 0 + 15) / 3)


def test_acceptance_aware_preempts_newcomers_then_runs_the_fastest_first():
    # a newcomer preempts a request with more attained service (least attained service)...
    long, late = traced("long", 40, accepted_per_cycle=0), traced("late", 40, accepted_per_cycle=0)
    done = run([long, late], [0.0, 0.05], "las-srt", mode="fixed")
    assert next(r for r in done if r.prompt.name == "long").preemptions >= 1
    assert run([long, late], [0.0, 0.05], "fcfs", mode="fixed")[0].preemptions == 0
    # ...and once acceptance is known, the request that accepts everything (fewest passes left) goes first
    slow, fast = traced("slow", 60, accepted_per_cycle=0), traced("fast", 60, accepted_per_cycle=4)
    done = run([slow, fast], [0.0, 0.0001], "las-srt", mode="fixed")
    assert finish_order(done) == ["fast", "slow"]


def test_adaptive_draft_length_turns_speculation_off_for_large_batches():
    choose = policies.speculation("adaptive", 4, [1, 2, 4], {1: 0.0, 2: 0.0, 4: 0.0})
    view = type("View", (), {"prior_acceptance": 0.9})()
    eager = [Request(i, 0.0, traced(str(i), 100, 4)) for i in range(8)]
    for r in eager:
        r.emitted, r.offered, r.accepted = 10, 40, 36  # α̂ ≈ 0.9
    # 50 ms fixed + 20 ms per drafted row token: at b=1 four drafts pay (4.1 tokens in 130 ms against 1 in 50),
    # at b=8 they do not (33 tokens in 690 ms against 8 in 50)
    axes = [[1, 8], [1, 5], [16, 256]]
    seconds = np.array([[[0.05 + 0.02 * b * (n - 1)] * 2 for n in axes[1]] for b in axes[0]])
    model = CostModel(axes, seconds, [[1, 8], [8, 64]], np.array([[0.01, 0.02], [0.03, 0.05]]), dict(TARGET), {}, [])
    assert choose(eager[:1], model, view) == 4
    assert choose(eager, model, view) == 0
    assert policies.expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_unknown_policy_names_the_valid_ones():
    with pytest.raises(DraftsmithError, match="Did you mean 'fcfs'"):
        policies.policy("fcf")


# --------------------------------------------------------------------------- simulator invariants
@pytest.mark.parametrize("name", list(policies.POLICIES))
@pytest.mark.parametrize("mode", ["off", "fixed", "adaptive"])
def test_conservation_every_request_finishes_once_every_token_counted_once(name, mode):
    prompts = [traced(f"p{i}", 5 + 7 * i, accepted_per_cycle=i % 4, category="ab"[i % 2]) for i in range(6)]
    arrivals = np.cumsum(np.random.default_rng(1).exponential(0.05, size=40))
    requests = workload(prompts, arrivals, seed=3)
    done = experiment.simulate_one(cost_model(), trace_set(prompts), name, mode, requests, max_batch=4)
    assert len({r.id for r in done}) == 40
    for r in done:
        assert r.arrival <= r.first_token <= r.finish and r.remaining == 0
        assert sum(r.token_count) == r.prompt.new_tokens  # every token once, none lost, none twice
    assert summarize(done)["output_tokens"] == sum(r.prompt.new_tokens for r in done)


def test_concurrency_one_replay_matches_a_measurement_made_with_the_same_costs():
    model = cost_model()
    prompts = [traced("a", 30, 2, prompt_tokens=20), traced("b", 12, 0, prompt_tokens=40)]
    for p in prompts:  # what eval would measure if the cost model were exact
        context = p.prompt_tokens + np.concatenate([[1], 1 + np.cumsum(p.cycles[4][:, 2])[:-1]])
        p.measured_ms[4] = 1e3 * (model.prefill(1, p.prompt_tokens) + sum(
            model.step(1, 5, c) + s for c, s in zip(context, p.cycles[4][:, 3])))
        p.plain_ms = 1e3 * (model.prefill(1, p.prompt_tokens) + sum(model.step(1, 1, p.prompt_tokens + k) for k in range(1, p.new_tokens)))
    check = experiment.concurrency_one(model, trace_set(prompts))
    assert abs(check["fixed"]["error_total"]) < 1e-9 and abs(check["off"]["error_total"]) < 1e-9 and check["fixed"]["passed"]
    prompts[0].measured_ms[4] *= 1.5
    assert not experiment.concurrency_one(model, trace_set(prompts))["fixed"]["passed"]


def test_seeded_runs_reproduce_exactly():
    prompts = [traced(f"p{i}", 6 + 5 * i, i % 3, category="ab"[i % 2]) for i in range(5)]
    grid = dict(rates=[2.0, 8.0], policy_names=list(policies.POLICIES), modes=["off", "fixed", "adaptive"], max_batch=4,
                num_requests=30, progress=lambda _: None)
    first = experiment.run_all(cost_model(), [trace_set(prompts)], seed=7, **grid)
    again = experiment.run_all(cost_model(), [trace_set(prompts)], seed=7, **grid)
    other = experiment.run_all(cost_model(), [trace_set(prompts)], seed=8, **grid)
    assert json.dumps(first["runs"]) == json.dumps(again["runs"]) != json.dumps(other["runs"])


# --------------------------------------------------------------------------- the commands, end to end on a tiny target
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny target folder, its traces from `draftsmith eval --save-traces` and its profile from `serve-sim profile`."""
    from tiny import byte_tokenizer, tiny_model

    root = tmp_path_factory.mktemp("serve")
    folder = root / "tiny-target"
    tiny_model("llama").save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in [
        {"prompt": "abc abc abc abc", "category": "code"}, {"prompt": "hello there", "category": "chat"},
        {"prompt": "def f(x): return x x x", "category": "code"}]))
    assert cli.main(["eval", "--target", str(folder), "--drafter", "prompt-lookup", "--prompts", str(prompts),
                     "--num-prompts", "3", "--max-new-tokens", "12", "--draft-length", "3", "--draft-lengths", "1,3",
                     "--save-traces", "--no-adaptive-lookup", "--no-transformers-baseline", "--no-small-batch-linear",
                     "--out", str(root / "eval")]) == 0
    assert cli.main(["serve-sim", "profile", "--target", str(folder), "--out", str(root / "profile.json"),
                     "--batch-sizes", "1", "2", "4", "--new-tokens", "1", "4", "--contexts", "16", "48",
                     "--prompt-lengths", "8", "32", "--rounds", "1", "--no-small-batch-linear"]) == 0
    return root


def test_eval_writes_traces_and_breaks_down_by_category(tiny_run):
    traces = json.loads((tiny_run / "eval" / "traces.json").read_text())
    assert traces["main"] == "3" and traces["draft_lengths"] == [1, 3] and len(traces["prompts"]) == 3
    for row in traces["prompts"]:
        for run in row["runs"].values():  # every output token is the prefill's or a cycle's, once
            assert 1 + sum(cycle[2] for cycle in run["cycles"]) == run["new_tokens"] == row["new_tokens"]
    results = json.loads((tiny_run / "eval" / "results.json").read_text())
    assert set(results["per_category"]) == {"chat", "code"} and results["per_category"]["code"]["prompts"] == 2
    assert "| code | 2 |" in (tiny_run / "eval" / "report.md").read_text()  # the By category table


def test_serve_sim_run_writes_results_and_report(tiny_run, capsys):
    out = tiny_run / "sim"
    assert cli.main(["serve-sim", "run", "--profile", str(tiny_run / "profile.json"), "--traces",
                     str(tiny_run / "eval" / "traces.json"), "--rates", "5", "50", "--num-requests", "20",
                     "--max-batch", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "concurrency 1" in printed and "batched forwards b=2..4" in printed
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 2 * 4 * 3 and set(results["runs"][0]["per_category"]) <= {"chat", "code"}
    page = (out / "report.html").read_text()
    assert "Validation against reality" in page and "2505.17074" in page and page.count("data:image/png") == 5


@pytest.mark.parametrize("change, message", [
    (["--rates", "0"], "must be > 0"),
    (["--rates", "-1"], "must be > 0"),
    (["--policies", "fcfs", "shortest"], "Unknown policy 'shortest'"),
    (["--num-requests", "0"], "empty workload"),
    (["--speculation", "sometimes"], "Unknown speculation mode"),
    (["--max-batch", "16"], "outside the profiled batch sizes"),
    ("other-target", "do not fit profile"),
    ("empty-arrivals", "workload would be empty"),
])
def test_serve_sim_bad_input_is_refused_and_nothing_written(tiny_run, tmp_path, capsys, change, message):
    traces = tiny_run / "eval" / "traces.json"
    if change == "other-target":
        data = json.loads(traces.read_text())
        data["target"]["config_sha256"] = "0" * 64
        traces = tmp_path / "traces.json"
        traces.write_text(json.dumps(data))
        change = []
    elif change == "empty-arrivals":
        (tmp_path / "arrivals.json").write_text("[]")
        change = ["--arrivals", str(tmp_path / "arrivals.json")]
    out = tmp_path / "sim"
    code = cli.main(["serve-sim", "run", "--profile", str(tiny_run / "profile.json"), "--traces", str(traces),
                     "--out", str(out), *change])
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_replayed_arrivals_name_their_prompts(tiny_run, tmp_path):
    name = json.loads((tiny_run / "eval" / "traces.json").read_text())["prompts"][1]["name"]
    (tmp_path / "arrivals.json").write_text(json.dumps([{"time": 0.0, "prompt": name}, {"time": 0.01, "prompt": name}, 0.02]))
    out = tmp_path / "sim"
    assert cli.main(["serve-sim", "run", "--profile", str(tiny_run / "profile.json"), "--traces",
                     str(tiny_run / "eval" / "traces.json"), "--arrivals", str(tmp_path / "arrivals.json"),
                     "--policies", "fcfs", "--speculation", "fixed", "--max-batch", "2", "--out", str(out)]) == 0
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["rate"] == "replay" and run["summary"]["requests"] == 3


def test_fixed_length_must_be_a_traced_one(tiny_run, tmp_path, capsys):
    args = ["serve-sim", "run", "--profile", str(tiny_run / "profile.json"), "--traces", str(tiny_run / "eval" / "traces.json"),
            "--max-batch", "2", "--rates", "20", "--num-requests", "5", "--policies", "fcfs"]
    assert cli.main([*args, "--fixed-length", "2", "--out", str(tmp_path / "no")]) == 2
    assert "traced lengths [1, 3]" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert cli.main([*args, "--fixed-length", "1", "--out", str(tmp_path / "yes")]) == 0
    (traced,) = json.loads((tmp_path / "yes" / "results.json").read_text())["traces"].values()
    assert traced["main_length"] == 1


def test_break_even_finds_the_crossing_and_says_when_speculation_never_pays():
    def runs(ratios):
        rows = []
        for rate, ratio in zip((0.1, 0.2, 0.4), ratios):
            for mode, e2e in (("fixed", ratio), ("off", 1.0)):
                rows.append({"traces": "t", "policy": "fcfs", "speculation": mode, "rate": rate,
                             "summary": {"e2e_ms": {"mean": e2e}}})
        return rows

    crossing = experiment.break_even(runs([0.8, 0.9, 1.1]), "t")
    assert crossing["stops_paying_at_rate"] == pytest.approx(0.3) and not crossing["pays_at_no_rate"]
    never = experiment.break_even(runs([1.2, 1.5, 2.0]), "t")
    assert never["pays_at_no_rate"] and "pays at no simulated rate" in report_paying(never)
    always = experiment.break_even(runs([0.5, 0.6, 0.7]), "t")
    assert always["pays_at_every_rate"] and always["stops_paying_at_rate"] is None


def report_paying(row):
    from draftsmith.serving.report import paying

    return paying(row)


def test_serve_sim_replays_suffix_drafter_and_hybrid_traces_and_names_where_each_pays(tiny_run, tmp_path):
    """Traces of suffix matching, a drafter and the hybrid of both (merged trees of varying size per pass) replay in
    serve-sim beside prompt lookup, and the report names the rate up to which each pays against plain decoding."""
    from draftsmith.drafters import eagle
    from draftsmith.target import load_target

    folder = tiny_run / "tiny-target"
    eagle.create(eagle.Config(variant="eagle3", ttt_steps=2), load_target(str(folder))).save_pretrained(tmp_path / "d")
    traces = [tiny_run / "eval" / "traces.json"]
    for name, drafter in (("suffix", "suffix"), ("drafter", str(tmp_path / "d")), ("hybrid", f"hybrid:{tmp_path / 'd'}")):
        assert cli.main(["eval", "--target", str(folder), "--drafter", drafter, "--prompts", str(tiny_run / "prompts.jsonl"),
                         "--num-prompts", "3", "--max-new-tokens", "12", "--draft-length", "3", "--draft-lengths", "1,3",
                         "--save-traces", "--no-transformers-baseline", "--no-small-batch-linear",
                         "--out", str(tmp_path / name)]) == 0
        traces.append(tmp_path / name / "traces.json")
        data = json.loads(traces[-1].read_text())
        assert data["drafter"]["kind"] == {"drafter": "eagle"}.get(name, name)
        for row in data["prompts"]:
            for run in row["runs"].values():
                assert 1 + sum(cycle[2] for cycle in run["cycles"]) == run["new_tokens"]
    out = tmp_path / "sim"
    assert cli.main(["serve-sim", "run", "--profile", str(tiny_run / "profile.json"), "--traces", *map(str, traces),
                     "--rates", "5", "50", "--num-requests", "12", "--max-batch", "4", "--policies", "fcfs",
                     "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    kinds = sorted(label.split()[0] for label in results["break_even"])
    assert kinds == ["eagle", "hybrid", "prompt_lookup", "suffix"]
    section = (out / "report.md").read_text().split("## Where speculation pays")[1].split("##")[0]
    for label, row in results["break_even"].items():
        assert f"- {label}: {report_paying(row)}" in section and report_paying(row) != "n/a"
