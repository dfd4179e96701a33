"""`draftsmith eval --engine vllm`: the eval's prompts decoded by vLLM beside our decoder.

vLLM (its CPU build, `make engine`: `.venv-engine`) runs as a subprocess, `engine_worker.py`, one per decoding
method, and the two sides exchange JSON files: draftsmith's venv never imports vLLM. The engine gets the prompts as
the token ids our decoder read, the same sampling options, stop tokens and draft length, and decodes one request at a
time: plainly, with the drafter (exported first into the layout vLLM loads when it is a draftsmith folder), and with
vLLM's own n-gram and suffix methods. The report (engine.json, engine.md) puts side by side, per method: outputs
identical to the engine's plain ones, τ and per-position acceptance from the engine's counters (as counts, beside
ours), tokens/s, TTFT and TPOT. A format vLLM does not serve is listed with the reason: vLLM's own error and the vLLM
file that raised it, or why draftsmith has no vLLM layout for it.

Definitions, engine side: drafts d, accepted at draft position i a_i (vLLM counts a_i when positions 1..i were all
accepted). Per-position acceptance α_i = a_i / a_{i-1} (a_0 = d): among drafts that reached position i, the share
that accepted it, ours exactly (`metrics.acceptance`). τ = 1 + Σ a_i / d, vLLM's mean acceptance length: tokens per
verify pass, as ours when every pass drafts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from draftsmith.engine_process import (engine_environment, engine_python, run_json_worker,  # noqa: F401
                                       target_folder)
from draftsmith.errors import DraftsmithError

ENGINES = ("vllm",)
METHODS = ("plain", "drafter", "ngram", "suffix")
WORKER = Path(__file__).with_name("engine_worker.py")
CUTTING = ("eagle", "mtp", "medusa", "dflash")
"""drafter kinds whose chains may be cut by their confidence (DFlash by its top probabilities, DSpark by its head)"""


# --------------------------------------------------------------------------- our side: chains as vLLM drafts them
def fixed_chains(config):
    """The eval config with chains drafted at the full --draft-length, as vLLM drafts them (no fallback, no
    confidence cut, no adaptive prompt lookup): per-position acceptance is then comparable; refuses what is not."""
    from draftsmith.eval.runner import drafter_kind

    if config.engine not in ENGINES:
        raise DraftsmithError(f"--engine {config.engine}: the engines are {', '.join(ENGINES)}.")
    if config.tree is not None:
        raise DraftsmithError("--engine: vLLM's CPU build drafts chains; compare --draft-length chains, not --tree.")
    if config.fallback or config.confidence_cut:
        raise DraftsmithError("--engine: vLLM drafts every chain at num_speculative_tokens; the comparison needs "
                              "full chains (leave --fallback and --confidence-cut unset or false).")
    unknown = set(methods(config)) - set(METHODS)
    if unknown:
        raise DraftsmithError(f"--engine-methods: unknown {', '.join(sorted(unknown))}; choose from {', '.join(METHODS)}.")
    kind = drafter_kind(config.drafter)
    cut = kind in CUTTING
    return dataclasses.replace(config, fallback=False, adaptive_lookup=False,
                               confidence_cut=False if cut else config.confidence_cut)


def methods(config) -> list[str]:
    """The engine methods asked for, plain first (every identity is checked against it)."""
    asked = [m.strip() for m in config.engine_methods.split(",") if m.strip()]
    return ["plain", *[m for m in asked if m != "plain"]]


# --------------------------------------------------------------------------- the drafter in the layout vLLM loads
VLLM_METHODS = {"speculators-eagle3": "eagle3", "speculators-peagle": "eagle3", "speculators-dflash": "dflash",
                "dflash-reference": "dflash", "speculators-dspark": "dspark", "speculators-mtp": "mtp",
                "vllm-medusa": "medusa", "hf": "draft_model"}
"""draftsmith's name of a folder layout -> vLLM's speculative method for it"""
EXPORT_FORMATS = {"eagle3": "speculators", "peagle": "speculators", "dflash": "speculators", "dspark": "speculators",
                  "medusa1": "medusa", "medusa2": "medusa", "mtp": "speculators", "draft_lm": "hf"}
"""draftsmith drafter variant -> the export format vLLM loads it from"""


def served_drafter(spec: str, workdir: Path, draft_length: int) -> tuple[dict | None, str]:
    """(vLLM's speculative_config for the drafter, what was served) or (None, why vLLM cannot be given it). A
    draftsmith folder is exported first into the format vLLM loads."""
    from draftsmith.eval.runner import drafter_kind
    from draftsmith.export import readers
    from draftsmith.hub import drafter_folder

    kind = drafter_kind(spec)
    if kind in ("prompt-lookup", "suffix", "hybrid"):
        return None, f"{kind}: draftsmith's own drafting; vLLM's ngram and suffix methods are its counterparts"
    if kind == "hf" and not Path(spec[3:]).expanduser().is_dir():  # a hub id: vLLM resolves it itself
        return {"method": "draft_model", "model": spec[3:], "num_speculative_tokens": draft_length}, spec
    folder = Path(spec[3:]).expanduser() if kind == "hf" else drafter_folder(spec)
    expected = readers.expectations(folder)
    what = f"{folder}"
    if expected.layout == "draftsmith":
        variant = "draft_lm" if expected.kind == "draft_lm" else expected.variant or expected.kind
        fmt = EXPORT_FORMATS.get(variant)
        if fmt is None:
            return None, f"{variant}: draftsmith has no export that vLLM loads (EAGLE-1's is draftsmith's own folder)"
        from draftsmith.export import export

        try:
            folder = export(folder, fmt, workdir / f"export-{fmt}", force=True, speculative_tokens=draft_length)
        except DraftsmithError as err:
            return None, f"{variant}: `draftsmith export --format {fmt}` refuses it: {err}"
        expected, what = readers.expectations(folder), f"{folder} (exported from {spec} as --format {fmt})"
    method = VLLM_METHODS.get(expected.layout)
    if method is None:
        return None, f"{expected.layout}: not a layout vLLM loads (export it as speculators)"
    config = {"method": method, "model": str(Path(folder).absolute()), "num_speculative_tokens": draft_length}
    if expected.layout == "speculators-peagle":
        config["parallel_drafting"] = True
    if method == "medusa":  # vLLM builds as many heads as tokens it drafts
        heads = json.loads((Path(folder) / "config.json").read_text())["num_heads"]
        config["num_speculative_tokens"] = min(draft_length, heads)
    return config, what


def tuned_target(config: dict | None) -> str | None:
    """Medusa-2: the tuned target its export ships in target/, which verifies (and decodes plainly) in its place."""
    folder = Path(config["model"]) / "target" if config and config["method"] == "medusa" else None
    return str(folder) if folder is not None and (folder / "config.json").is_file() else None


# --------------------------------------------------------------------------- running the worker
def run_worker(python: Path, request: dict, workdir: Path, name: str) -> dict:
    """One method in the engine venv: the request file in, the result file out, its log beside them."""
    result = run_json_worker(python, WORKER, request, workdir, name)
    return result if result.get("ok", True) else {"refused_by": None, **result}


def engine_configs(config, drafter_config: dict | None) -> dict[str, dict | None]:
    """Method name -> vLLM's speculative_config (None: plain) for the methods asked for."""
    k = config.draft_length
    known = {"plain": None, "drafter": drafter_config,
             "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": config.ngram,
                       "prompt_lookup_min": config.min_ngram},
             "suffix": {"method": "suffix", "num_speculative_tokens": k}}
    return {name: known[name] for name in methods(config) if name != "drafter" or drafter_config is not None}


def compare_in_engine(config, target, prompts, runs: dict) -> dict:
    """Decode `prompts` in vLLM with every method asked for, write engine.json and engine.md into config.out beside
    our report, print the table; returns the report's dict. `runs`: our Generations by method (`runner.compare`)."""
    from draftsmith.eval.decoder import eos_ids

    python = engine_python()
    workdir = Path(config.out) / "engine"
    workdir.mkdir(parents=True, exist_ok=True)
    drafter_config, served = (None, "not asked (--engine-methods)")
    if "drafter" in methods(config):
        drafter_config, served = served_drafter(config.drafter, workdir, config.draft_length)
    engine_target = tuned_target(drafter_config) or target_folder(config.target)
    longest = max(len(p.token_ids) for p in prompts)
    request = {"target": engine_target, "dtype": config.dtype, "seed": config.seed, "enforce_eager": config.engine_eager,
               "max_model_len": longest + config.max_new_tokens + 2 * config.draft_length + 16,
               "prompts": [{"name": p.name, "token_ids": list(p.token_ids)} for p in prompts],
               "sampling": {"temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k,
                            "max_tokens": config.max_new_tokens, "stop_token_ids": sorted(eos_ids(target))}}
    results = {}
    for name, speculative in engine_configs(config, drafter_config).items():
        print(f"engine: vLLM {name} {json.dumps(speculative) if speculative else ''}", flush=True)
        results[name] = {"speculative_config": speculative,
                         **run_worker(python, {**request, "speculative_config": speculative}, workdir, name)}
    from draftsmith.eval.engine_report import summarize, write_engine_report

    report = summarize(config, prompts, runs, results, served, drafter_config, engine_target)
    paths = write_engine_report(report, Path(config.out))
    print(f"engine report: {paths['md']} (also {paths['json']})")
    return report
