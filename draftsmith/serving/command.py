"""`draftsmith serve-sim`: measure the target's batched costs, then simulate serving under load.

    draftsmith serve-sim profile --target smollm2-135m-instruct --out runs/serving/profile.json
    draftsmith serve-sim run --profile runs/serving/profile.json --traces runs/serving/pld/traces.json \\
        --rates 0.05 0.1 0.2 --policies fcfs srf-predicted las-srt --out runs/serving/sim
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from draftsmith import config as configs
from draftsmith.errors import DraftsmithError
from draftsmith.files import read_json


@dataclass
class ProfileConfig:
    """Options of `draftsmith serve-sim profile`."""

    target: str
    """target model: built-in alias (smollm2-135m-instruct), local folder, .gguf file or hub id"""
    out: str
    """the profile to write (JSON)"""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """batch sizes b to time (the simulator's --max-batch may not exceed the largest)"""
    new_tokens: list[int] = field(default_factory=lambda: [1, 2, 3, 5, 9])
    """tokens n each request adds in a decode/verify pass (draft length + 1)"""
    contexts: list[int] = field(default_factory=lambda: [128, 320, 512])
    """cached tokens c per request before a decode/verify pass"""
    prompt_lengths: list[int] = field(default_factory=lambda: [32, 128, 320])
    """prompt lengths of the prefill table"""
    rounds: int = 5
    """rounds over the whole grid, each timing every point once (the median over rounds is kept)"""
    dtype: str = "float32"
    """dtype of the target: use the one the traces were measured with"""
    threads: int = 0
    """torch CPU threads (0 = torch's default): use the eval's --threads"""
    small_batch_linear: bool = True
    """as in draftsmith eval: tune W·xᵀ linear layers for few-row products first; match the eval's setting"""


@dataclass
class RunConfig:
    """Options of `draftsmith serve-sim run`."""

    profile: str
    """cost profile written by `serve-sim profile`"""
    traces: list[str]
    """traces.json files written by `draftsmith eval --save-traces` (one per drafter)"""
    out: str
    """output folder for results.json and report.html"""
    rates: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2])
    """Poisson arrival rates, requests per second"""
    policies: list[str] = field(default_factory=lambda: ["fcfs", "srf-oracle", "srf-predicted", "las-srt"])
    """scheduling policies: fcfs, srf-oracle, srf-predicted, las-srt"""
    speculation: list[str] = field(default_factory=lambda: ["off", "fixed", "adaptive"])
    """draft length per pass: off (plain decoding), fixed (the traced main length), adaptive (0 included)"""
    num_requests: int = 200
    """requests per simulation (prompts drawn from the traces, seeded)"""
    fixed_length: int = 0
    """draft length of the 'fixed' mode, one of the traced lengths (0 = the length the eval ran with --draft-length)"""
    max_batch: int = 8
    """continuous batching: most requests in one pass"""
    seed: int = 0
    """seed of arrivals and prompt mix (same for every policy and mode)"""
    arrivals: str | None = None
    """replay arrivals from a JSON list of times in seconds, or of {"time": s, "prompt": name}, instead of --rates"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `serve-sim` with its `profile` and `run` subcommands."""
    parser = configs.add_command(
        subparsers, "serve-sim",
        summary="Simulate serving under load from a measured cost model and measured acceptance traces.",
        description="profile: time the target's batched forwards on this machine; run: simulate arrivals, "
        "continuous batching, scheduling policies and draft lengths, and write results.json and report.html.")
    actions = parser.add_subparsers(dest="serve_sim_action", metavar="ACTION")
    configs.add_command(actions, "profile", ProfileConfig, summary="Measure the target's cost model (JSON).")
    configs.add_command(actions, "run", RunConfig,
                        summary="Simulate a workload under policies and rates; write the report.")


def run(args: argparse.Namespace) -> int:
    """Dispatch to profile or run."""
    action = getattr(args, "serve_sim_action", None)
    if action == "profile":
        _require(args, ("target", "out"), "profile")
        profile_target(configs.from_flags(ProfileConfig, args))
    elif action == "run":
        _require(args, ("profile", "traces", "out"), "run")
        simulate_and_report(configs.from_flags(RunConfig, args))
    else:
        raise DraftsmithError("draftsmith serve-sim needs an action: profile or run. See draftsmith serve-sim --help.")
    return 0


def _require(args, names, action: str) -> None:
    for name in names:
        if not hasattr(args, name):
            raise DraftsmithError(f"draftsmith serve-sim {action} needs --{name}. See draftsmith serve-sim {action} --help.")


def profile_target(config: ProfileConfig, target=None):
    """Time the grid, fit the model, run the mixed-batch check, write the profile."""
    import torch

    from draftsmith import small_batch
    from draftsmith.serving.costmodel import profile
    from draftsmith.target import load_target

    if config.rounds < 1 or min(config.batch_sizes + config.new_tokens + config.prompt_lengths) < 1 or min(config.contexts) < 1:
        raise DraftsmithError("serve-sim profile: every grid value and --rounds must be at least 1.")
    if config.threads:
        torch.set_num_threads(config.threads)
    target = target or load_target(config.target, dtype=config.dtype)
    if config.small_batch_linear:
        small_batch.tune_and_install(target.model)
    try:
        model = profile(target, config.batch_sizes, config.new_tokens, config.contexts, config.prompt_lengths,
                        config.rounds, progress=lambda line: print(line, flush=True))
    finally:
        small_batch.remove(target.model)
    path = model.save(config.out)
    from draftsmith.serving.experiment import batched_summary

    for row in batched_summary(model)["rows"]:
        print(f"check b={row['batch']}: measured {row['measured_ms']:.0f} ms, model {row['model_ms']:.0f} ms "
              f"({row['error']:+.1%})")
    print(f"profile: {path}")
    return model


def simulate_and_report(config: RunConfig) -> dict:
    """Check every input, simulate the whole grid, and only then write results.json and report.html."""
    from draftsmith.serving import experiment, report
    from draftsmith.serving.costmodel import load_profile
    from draftsmith.serving.traces import load_traces

    cost = load_profile(config.profile)
    trace_sets = [load_traces(path) for path in config.traces]
    for traces in trace_sets:
        if config.fixed_length:
            if config.fixed_length not in traces.lengths:
                raise DraftsmithError(f"--fixed-length {config.fixed_length}: '{traces.path}' traced lengths "
                                      f"{traces.lengths} only (eval --draft-lengths adds more).")
            traces.main_length = config.fixed_length
    replay = _read_arrivals(config.arrivals) if config.arrivals else None
    experiment.check_inputs(cost, trace_sets, [] if replay else config.rates, config.policies, config.speculation,
                            config.max_batch, len(replay[0]) if replay else config.num_requests)
    results = experiment.run_all(cost, trace_sets, config.rates, config.policies, config.speculation, config.max_batch,
                                 config.num_requests, config.seed, replay)
    results.update(config=configs.to_dict(config), profile={"target": cost.target, "machine": cost.machine},
                   traces={t.label: {"path": t.path, "drafter": t.drafter, "main_length": t.main_length,
                                     "lengths": t.lengths, "prompts": len(t.prompts), "environment": t.environment}
                           for t in trace_sets})
    paths = report.write(results, config.out)
    report.print_summary(results)
    print(f"report: {paths['html']} (also {paths['md']}, {paths['json']})")
    return results


def _read_arrivals(path: str) -> tuple[list[float], list]:
    """Replayed arrivals: a JSON list of seconds, or of {"time": seconds, "prompt": traced prompt name}."""
    rows = read_json(path, f"Arrivals file '{path}' does not exist.")
    if not isinstance(rows, list) or not rows:
        raise DraftsmithError(f"Arrivals file '{path}' must hold a non-empty JSON list: the workload would be empty.")
    times = [row["time"] if isinstance(row, dict) else row for row in rows]
    if not all(isinstance(t, (int, float)) and t >= 0 for t in times):
        raise DraftsmithError(f"Arrivals file '{path}': every time must be a number of seconds >= 0.")
    return [float(t) for t in times], [row.get("prompt") if isinstance(row, dict) else None for row in rows]
