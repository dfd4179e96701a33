"""What ships next to an exported drafter: the model card, the W&B link-up, and the Hub upload.

The card only states numbers that a real `draftsmith eval` results.json holds; when there is
none it says so. Training facts come from `training.json`, which `draftsmith train` leaves in
the run folder (looked for in the checkpoint folder and the two folders above it); missing facts
are written as "not recorded".
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from draftsmith.errors import DraftsmithError

UNKNOWN = "not recorded"
HUB_IDS = {"smollm2-135m-instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")}
"""built-in target aliases -> the hub model they were made from, and its license (engines need a hub id)"""


def is_hub_id(name: str) -> bool:
    """`org/model` that is not a local path: what a model card may name as base_model."""
    return name.count("/") == 1 and not Path(name).expanduser().exists() and not name.startswith((".", "/", "~"))


def verifier_name(target_name: str) -> str:
    """The hub id engines should load as the target of a drafter trained against `target_name`."""
    return HUB_IDS[target_name][0] if target_name in HUB_IDS else target_name


# --------------------------------------------------------------------------- finding the facts
def find_eval_results(checkpoint: Path, explicit: str | Path | None = None) -> Path | None:
    """The results.json to report: `explicit` (file or folder), else the newest one under the checkpoint
    or in the run's `eval/` folder beside it (where `draftsmith train`'s final report writes)."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise DraftsmithError(f"--eval-results: '{path}' does not exist. Pass a results.json written by "
                                  "`draftsmith eval --out DIR`, or the DIR itself.")
        return path
    found = [p for pattern in ("results.json", "*/results.json", "*/*/results.json") for p in checkpoint.glob(pattern)]
    found += list(checkpoint.parent.glob("eval/results.json"))
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def eval_results_for(checkpoint: Path, explicit, matches, description: str) -> tuple[Path | None, dict | None]:
    """(path, results) of the eval run to report for this drafter, or (None, None). `matches(results)` says
    whether a results.json describes this drafter; `description` names it in the error.

    Results of another drafter are an error when passed explicitly and skipped when found by search.
    """
    path = find_eval_results(checkpoint, explicit)
    if path is None:
        return None, None
    try:
        results = json.loads(path.read_text())
    except ValueError as err:
        raise DraftsmithError(f"'{path}' is not valid JSON ({err}); re-run `draftsmith eval`.") from None
    if results.get("acceptance_length") is None or not matches(results):
        if explicit is not None:
            raise DraftsmithError(
                f"'{path}' does not hold results of this drafter (its drafter: {results.get('drafter')}; this one "
                f"{description}).")
        return None, None
    return path, results


def find_training_info(checkpoint: Path) -> dict:
    """training.json of the run that produced the checkpoint: in it, or in the run folder above it
    (`run/best/`, `run/checkpoint-N/drafter/`)."""
    for folder in (checkpoint, checkpoint.parent, checkpoint.parent.parent):
        path = folder / "training.json"
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def acceptance_plots(results_path: Path | None, results: dict | None, folder: Path) -> list[Path]:
    """The acceptance plot for the card: PNGs saved next to results.json, else drawn from its numbers."""
    if results_path is None or not results:
        return []
    saved = sorted(results_path.parent.glob("*accept*.png"))
    if saved:
        return saved
    per_position = results.get("acceptance_per_position") or []
    if not per_position:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5.5, 3.4))
    axis.plot(range(1, len(per_position) + 1), per_position, marker="o")
    axis.set(ylim=(0, 1.05), xlabel="draft position i", ylabel="acceptance α_i",
             title=f"Per-position acceptance (τ = {results.get('acceptance_length', float('nan')):.2f})")
    figure.tight_layout()
    path = folder / "acceptance.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return [path]


# --------------------------------------------------------------------------- rendering (shared sections)
def value_text(value) -> str:
    """A fact as card text ("not recorded" when missing)."""
    if value is None or value == "":
        return UNKNOWN
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {value_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return f"{len(value)} prompts" if value and isinstance(value[0], (str, dict)) else ", ".join(map(value_text, value))
    return str(value)


def table(rows: list[tuple[str, object]], header: tuple[str, str] | None = None) -> list[str]:
    """The lines of a two-column Markdown table (without a header: a list of facts)."""
    top = f"| {header[0]} | {header[1]} |" if header else "| | |"
    return [top, "|---|---|"] + [f"| {name} | {value} |" for name, value in rows]


def front_matter(tags: list[str], verifier: str, verifier_is_hub_id: bool, license: str | None) -> str:
    """The Hub metadata block (each tag once; base_model only for a real hub id)."""
    meta: dict = {"library_name": "draftsmith", "tags": list(dict.fromkeys(tags))}
    if verifier_is_hub_id:
        meta["base_model"] = verifier
    if license:
        meta["license"] = license
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def training_section(training: dict) -> str:
    rows = [("recipe", training.get("recipe")), ("training data", training.get("data")),
            ("examples", training.get("examples")), ("tokens", training.get("tokens")),
            ("steps", training.get("steps")), ("epochs", training.get("epochs")),
            ("hardware", training.get("hardware")), ("wall time", training.get("wall_time")),
            ("final training accuracy per step", training.get("accuracy_per_step"))]
    lines = ["## How it was trained", ""]
    if not training:
        lines.append("No training.json was found next to the checkpoint, so the recipe, data size, steps and "
                     "hardware are unknown.")
        return "\n".join(lines) + "\n"
    lines += table([(name, value_text(value)) for name, value in rows])
    run = training.get("wandb") or {}
    if run.get("url"):
        lines += ["", f"Training run on Weights & Biases: {run['url']}"]
    elif run.get("id"):  # an offline run has no url until it is synced
        where = Path(run["dir"]).parent if run.get("dir") else None
        lines += ["", f"Training run on Weights & Biases: project `{run.get('project')}`, run id `{run['id']}`"
                  + (f" (logged offline; `wandb sync {where}` uploads it)." if where else ".")]
    return "\n".join(lines) + "\n"


def results_rows(results: dict) -> list[tuple[str, object]]:
    """The card's results table from a `draftsmith eval` results.json (missing entries -> not recorded)."""
    config, env = results.get("config") or {}, results.get("environment") or {}
    per_position = results.get("acceptance_per_position") or []
    lossless = results.get("lossless") or {}
    prompts = config.get("prompts")
    if prompts is not None:  # a prompt file is named by its file name only: local paths mean nothing on the Hub
        prompts = f"{Path(str(prompts)).name}, {len(results.get('per_prompt') or []) or config.get('num_prompts')} " \
                  f"prompts, up to {config.get('max_new_tokens')} new tokens"
    shape = f"tree {config['tree']} (depth, top-k, total)" if config.get("tree") else \
        (f"chain of {config['draft_length']}" if config.get("draft_length") else None)
    machine = ", ".join(f"{k} {env[k]}" for k in ("platform", "device", "cpu_count", "torch_threads", "dtype", "torch")
                        if env.get(k) is not None) or None
    return [
        ("acceptance length τ (tokens per verify pass, bonus token included)", results.get("acceptance_length")),
        ("per-position acceptance α_1, α_2, …", ", ".join(f"{a:.3f}" for a in per_position) or None),
        ("speedup vs plain decoding (same loop, same process)", results.get("speedup")),
        ("speedup vs transformers generate()", results.get("speedup_vs_transformers")),
        ("greedy outputs identical to plain decoding",
         f"{lossless['identical']}/{lossless['checked']}" if lossless.get("checked") else None),
        ("prompts", prompts),
        ("temperature", None if config.get("temperature") is None else str(config["temperature"])),
        ("draft shape", shape),
        ("target as evaluated", Path(str((results.get("target") or {}).get("name") or "")).name or None),
        ("machine", machine),
    ] + tuned_target_rows(results.get("tuned_target"))


def tuned_target_rows(tuned: dict | None) -> list[tuple[str, object]]:
    """Medusa-2: who verified, and how far the tuned target's own output drifted from the original target's."""
    if not tuned:
        return []
    return [("verified by", "the tuned target (Medusa-2 adapters merged), not the original target"),
            ("drift: tuned target's greedy output identical to the original's",
             f"{tuned['identical_to_original']}/{tuned['checked']} prompts, mean token agreement "
             f"{tuned['token_agreement']:.3f}")]


def results_section(results: dict | None, source: str | None, plots: list[str]) -> str:
    lines = ["## Measured results", ""]
    if not results:
        lines.append("No `draftsmith eval` results were found for this drafter, so this card reports no "
                     "acceptance or speed numbers. Measure them with `draftsmith eval --drafter DIR --out EVAL_DIR` "
                     "and export again with `--eval-results EVAL_DIR`.")
        return "\n".join(lines) + "\n"
    lines += table([(name, value_text(value)) for name, value in results_rows(results)], header=("metric", "value"))
    source = "/".join(Path(source or "results.json").parts[-2:])
    lines += ["", f"Every number above is copied from `{source}`, written by `draftsmith eval` with the settings "
                  "listed; none is estimated."]
    for plot in plots:
        lines += ["", f"![{Path(plot).stem.replace('_', ' ')}]({plot})"]
    return "\n".join(lines) + "\n"


def _trained_against_gguf(training: dict) -> str | None:
    """The GGUF file the drafter was trained against, when training.json names one (the built-in
    targets are GGUF files from pip packages), else None."""
    from draftsmith.target import BUILTIN_TARGETS

    name = str(training.get("target") or "")
    if name in BUILTIN_TARGETS:
        package, filename, install = BUILTIN_TARGETS[name]
        return f"`{filename}` (the `{name}` target, from `{install}`)"
    return f"`{Path(name).name}`" if name.endswith(".gguf") else None  # load_target's own rule for GGUF files


def verifier_section(training: dict, verifier: str) -> str:
    """Which weights the drafter was trained against, when they are not the verifier's own."""
    gguf = _trained_against_gguf(training)
    if gguf is None:
        return ""
    return "\n".join([
        "## Verifier weights", "",
        f"This drafter was trained against the dequantized GGUF weights {gguf}, not the full-precision "
        f"`{verifier}` named as the verifier above. Speculative output is still exactly the verifier's own, "
        "but the acceptance measured here comes from the GGUF weights: a full-precision verifier may accept "
        "slightly differently. To name other verifier weights in config.json and this card, export with "
        "`draftsmith export CHECKPOINT --verifier HUB_ID_OR_FOLDER`.", ""])


def compose(facts: SharedFacts, tags: list[str], drafter: str, about: list[str], usage: list[str],
            verifier_is_hub_id: bool | None = None) -> str:
    """A card's README.md, laid out as every export's is: Hub metadata, the title (`drafter` for the verifier), what
    the drafter is (`about`), how it was trained, the measured results, which weights it was trained against, how to
    use it (`usage`)."""
    hub_id = is_hub_id(facts.verifier) if verifier_is_hub_id is None else verifier_is_hub_id
    title = [f"# {drafter} for {facts.verifier}", ""]
    return "\n".join([front_matter(tags, facts.verifier, hub_id, facts.license), "\n".join(title + about),
                      training_section(facts.training),
                      results_section(facts.results, facts.results_source, facts.plots),
                      verifier_section(facts.training, facts.verifier), "\n".join(usage)])


@dataclass(kw_only=True)
class SharedFacts:
    """What every export's card states besides its family's own facts (which subclasses add)."""

    model_ref: str  # what users pass to the engine: the hub repo id or the local folder
    verifier: str
    license: str | None = None
    training: dict = field(default_factory=dict)
    results: dict | None = None
    results_source: str | None = None
    plots: list[str] = field(default_factory=list)  # file names inside the export folder


def shared_facts(checkpoint: Path, options, kind: str, description: str, target_name: str | None,
                 variant: str | None = None, drafter: dict | None = None) -> dict:
    """The card facts every export gathers the same way: model_ref, verifier, license, training, results and
    results_source; `kind` (and `variant`, where results name one, and every field of `drafter`) picks this
    drafter's `draftsmith eval` results."""
    training = find_training_info(checkpoint)
    target = options.verifier or training.get("target") or target_name
    if not target:
        raise DraftsmithError(f"'{checkpoint}' does not say which target it drafts for; pass --verifier HUB_ID.")

    def matches(results: dict) -> bool:
        described = results.get("drafter") or {}
        return described.get("kind") == kind and (variant is None or described.get("variant", variant) == variant) \
            and all(described.get(key) == value for key, value in (drafter or {}).items())

    path, results = eval_results_for(checkpoint, options.eval_results, matches, description)
    verifier = verifier_name(target)
    return {"model_ref": options.repo_id or str(options.out), "verifier": verifier,
            "license": options.license or dict(HUB_IDS.values()).get(verifier), "training": training,
            "results": results, "results_source": str(path) if path else None}


def finish_card(staging: Path, facts: SharedFacts, render):
    """Draw or copy the acceptance plots, write README.md = render(facts), return the facts."""
    plots = acceptance_plots(Path(facts.results_source) if facts.results_source else None, facts.results, staging)
    facts.plots = [plot.name for plot in plots]
    write_card(staging, render(facts), plots)
    return facts


def write_card(folder: Path, text: str, plots: list[Path]) -> list[str]:
    """Copy the plots into the export folder (if not drawn there) and write README.md; returns the plot names
    (which `text` should reference)."""
    for plot in plots:
        if plot.parent != folder:
            shutil.copyfile(plot, folder / plot.name)
    (folder / "README.md").write_text(text)
    return [plot.name for plot in plots]


# --------------------------------------------------------------------------- W&B
def log_to_wandb(training: dict, results: dict | None, plots: list[Path]) -> str | None:
    """Log the eval table and plots to the training run's W&B run; return why not, or None on success."""
    run_info = training.get("wandb") or {}
    if not run_info.get("id") or not results:
        return "the training run did not use W&B" if not run_info.get("id") else "there are no eval results"
    try:
        import wandb
    except ImportError:
        return "wandb is not installed"
    try:
        run = wandb.init(id=run_info["id"], project=run_info.get("project"), entity=run_info.get("entity"),
                         resume="allow", job_type="export")
        table = wandb.Table(columns=["metric", "value"],
                            data=[[key, json.dumps(value)] for key, value in results.items()])
        run.log({"eval/results": table, **{f"eval/{p.stem}": wandb.Image(str(p)) for p in plots}})
        run.finish()
    except Exception as err:  # W&B is a convenience; the export itself already succeeded
        return f"W&B logging failed ({type(err).__name__}: {err})"
    return None


# --------------------------------------------------------------------------- Hub
def push_to_hub(folder: Path, repo_id: str, private: bool = False, revision: str | None = None, api=None) -> str:
    """Create the repo if needed and upload the folder; the token comes from huggingface_hub's usual places."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = api or HfApi(library_name="draftsmith")
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model", revision=revision,
                          commit_message="Upload EAGLE-3 drafter exported by draftsmith")
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        hint = (" Log in with `hf auth login` or set HF_TOKEN to a token with write access."
                if status in (401, 403) else "")
        raise DraftsmithError(f"Uploading to '{repo_id}' failed (HTTP {status}).{hint} The export is kept at "
                              f"'{folder}'.") from None
    except Exception as err:  # network down, DNS, proxy: never echo anything that could hold a token
        raise DraftsmithError(f"Could not reach the Hugging Face Hub to upload '{repo_id}' ({type(err).__name__}). "
                              f"The export is kept at '{folder}'; push it later with `hf upload {repo_id} {folder}` or "
                              "re-run the export with --force.") from None
    return str(url)
