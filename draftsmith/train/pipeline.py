"""The steps a recipe runs around training: prepare the data first, report on best/ afterwards.

`draftsmith train recipes/smollm2-135m/eagle3.yaml` is the whole pipeline of DESIGN §1 in one
command: built-in corpus -> prepare (once; skipped when data.prepared already holds it) ->
online capture inside training -> train -> the final `draftsmith eval` report on HumanEval.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomically
from draftsmith.train.config import TrainConfig, prepare_config

PREPARED_MARK = "prepare_report.json"  # written last by `prepare`, so its presence means "complete"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def ensure_prepared(config: TrainConfig, target=None, wait_s: float = 3600.0) -> None:
    """Run `prepare` when the recipe has a prepare section and data.prepared is not prepared yet.

    Under `accelerate launch` only rank 0 prepares; the other ranks wait for its report file.
    """
    if config.prepare is None:
        return
    done = Path(config.data.prepared) / PREPARED_MARK
    if done.is_file():
        check_prepared_matches(json.loads(done.read_text()), prepare_config(config), done, target)
        return
    if _rank() != 0:
        deadline = time.monotonic() + wait_s
        while not done.is_file():
            if time.monotonic() > deadline:
                raise DraftsmithError(f"Rank {_rank()} waited {wait_s:.0f} s for rank 0 to write {done}.")
            time.sleep(2.0)
        return
    from draftsmith.data.commands import print_prepare_report
    from draftsmith.data.prepared import prepare

    options = prepare_config(config)
    print(f"preparing {', '.join(options.input)} -> {options.out} (first run only)")
    print_prepare_report(prepare(options, target), options.out)


def check_prepared_matches(report: dict, wanted, where: Path, target=None) -> None:
    """Refuse to reuse prepared data made with other prepare options (chat template included, given `target`) than
    the recipe asks for. Whether it was made for this target is checked where it is loaded (`load_prepared`)."""
    made = {"input": report.get("inputs"), "max_length": report.get("max_length"),
            "last_turn_only": report.get("last_turn_only"), "regenerate": report.get("regenerated"),
            # what was asked (the vocabulary holds fewer tokens when the data has fewer); reports written before
            # the cap name only the size, then the one asked for; None = no vocabulary
            "draft_vocab_size": report.get("draft_vocab_size_requested", report.get("draft_vocab_size")) or 0,
            "max_rows_per_input": report.get("max_rows_per_input") or 0}
    asked = {"input": list(wanted.input), "max_length": wanted.max_length, "last_turn_only": wanted.last_turn_only,
             "regenerate": wanted.regenerate, "draft_vocab_size": wanted.draft_vocab_size or 0,
             "max_rows_per_input": wanted.max_rows_per_input}
    if target is not None and report.get("chat_template_sha256"):  # None: plain-text rows, no template used
        from draftsmith.data.prepared import template_sha256
        from draftsmith.data.templates import resolve_chat_template

        made["chat_template"] = report["chat_template_sha256"][:12]
        asked["chat_template"] = template_sha256(target, resolve_chat_template(wanted.chat_template))[:12]
    differ = [f"prepare.{key}: recipe {asked[key]!r}, data {made[key]!r}" for key in asked if asked[key] != made[key]]
    if differ:
        raise DraftsmithError(
            f"The prepared data in '{where.parent}' was made with other options than this recipe asks for "
            f"({'; '.join(differ)}). Point data.prepared at a new folder, or delete that one to prepare it again."
        )


def write_training_facts(config: TrainConfig, recipe, recipe_path: str | None, wall_time_s: float) -> Path:
    """OUTPUT_DIR/training.json: what the model card says about how the drafter was trained."""
    import torch

    facts: dict = {
        "target": config.target.name,
        "recipe": recipe_path,
        "data": config.data.prepared or config.data.features,
        "steps": recipe.step,
        "global_batch": recipe.layout()["global_batch"],
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"
        + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "")
        + f", {recipe.accelerator.num_processes} process(es)",
        "wall_time": f"{wall_time_s / 60:.1f} min",
        "best_step": recipe.best_step,
        "best_acceptance_length": recipe.best_score,
    }
    report = Path(config.data.prepared or "") / PREPARED_MARK
    if config.data.prepared and report.is_file():
        prepared = json.loads(report.read_text())
        facts.update(examples=prepared.get("rows_kept"), tokens=prepared.get("tokens"))
    best = Path(config.output_dir) / "best.json"
    if best.is_file():
        facts["accuracy_per_step"] = {k: v for k, v in json.loads(best.read_text()).items() if k.startswith("acc_")}
    run = getattr(recipe, "wandb_run", None)
    if run is not None:
        facts["wandb"] = run
    path = Path(config.output_dir) / "training.json"
    write_atomically(path, json.dumps(facts, indent=2, default=str))
    return path


METHOD_SPECS = {"drafter": "{best}", "suffix": "suffix", "hybrid": "hybrid:{best}"}
"""report.methods -> the `draftsmith eval --drafter` value that decodes with it"""


def final_report(config: TrainConfig, target) -> dict | None:
    """Decode the report prompts with best/ (and, as report.methods asks, suffix matching alone and the hybrid of
    both) through the same code as `draftsmith eval`, then each of report.also_prompts into out/<set>/; print the
    summaries. A method the target cannot run (a DraftsmithError) is skipped with its reason and the others still
    report. Returns the first reported method's results on report.prompts."""
    section = config.report
    best = Path(config.output_dir) / "best"
    if section.num_prompts < 1:
        return None
    if not best.is_dir():
        raise DraftsmithError(f"No drafter at {best} to report on; training did not produce best/.")
    out = Path(section.out or Path(config.output_dir) / "eval")
    results = _report_prompts(config, target, best, section.prompts, out)
    for prompts in section.also_prompts:
        _report_prompts(config, target, best, prompts, out / prompt_set_name(prompts))
    return next((found for found in results.values() if "skipped" not in found), None)


def prompt_set_name(prompts: str) -> str:
    """The folder a report of `prompts` goes to: builtin:handwritten -> handwritten, a file -> its stem."""
    return prompts.split(":", 1)[1] if prompts.startswith("builtin:") else Path(prompts).stem


def _report_prompts(config: TrainConfig, target, best: Path, prompts: str, out: Path) -> dict:
    """{method: results, or {"skipped": reason}} of report.methods on `prompts`, written under `out`."""
    from draftsmith.eval.command import EvalConfig, evaluate_and_report
    from draftsmith.eval.report import methods_markdown

    section = config.report
    results = {}
    suffix_length = section.suffix_length if section.tree is None and section.suffix_length else 0
    for method in section.methods:
        eval_config = EvalConfig(
            target=config.target.name, drafter=METHOD_SPECS[method].format(best=best),
            out=str(out / method if len(section.methods) > 1 else out),
            prompts=prompts, num_prompts=section.num_prompts, max_new_tokens=section.max_new_tokens,
            draft_length=suffix_length if suffix_length and method != "drafter" else section.draft_length,
            hybrid_drafter_length=section.draft_length if suffix_length and method == "hybrid" else 0,
            suffix_cache_tokens=section.suffix_cache_tokens if method != "drafter" else 0,
            tree=section.tree,
            confidence_cut=None if method == "suffix" else section.confidence_cut,
            fallback=section.fallback if method == "drafter" else None,
            dtype=config.target.dtype,
            transformers_baseline=section.transformers_baseline,
            chat_template=(config.prepare or {}).get("chat_template"),  # prompts as the drafter saw its data
        )
        eval_config.validate()
        try:
            results[method] = evaluate_and_report(eval_config, target=target)
        except DraftsmithError as err:  # a finished training run is never thrown away for one method
            results[method] = {"skipped": str(err)}
            print(f"report: {method} skipped on this target: {err}", flush=True)
    if len(results) > 1:
        write_atomically(out / "methods.md", methods_markdown(results))
        print(f"methods side by side on {prompts}: {out / 'methods.md'}")
    return results
