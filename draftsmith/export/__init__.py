"""`draftsmith export`: ship a trained drafter in a folder layout that a serving engine or library loads.

One file per drafter family's formats, beside the shared skeleton every export goes through (`skeleton.py`), the
model card (`card.py`) and the validator of EAGLE-3 layouts with each format's layer-id convention (`check.py`):
- `eagle3.py`: `speculators` (vLLM) and `sglang` folders of an EAGLE-3 drafter; `eagle3_read.py` reads them
  back, `eagle3_card.py` is their card;
- `hf.py`: `hf`, the plain `transformers` folder of a distilled draft LM;
- `mtp.py`: `speculators`, the speculators `mtp` layout of an MTP drafter (one shared module);
- `medusa.py`: `medusa`, vLLM's Medusa layout of Medusa heads;
- `dflash.py`: `dflash`, the DFlash reference layout (`DFlashDraftModel`) of a DFlash drafter, and `speculators`,
  the speculators `dflash` layout (`dspark` for the DSpark variant);
- `native.py`: `draftsmith`, draftsmith's own folder of any kind, with a card;
- `readers.py`: every one of these layouts (and the public checkpoints in them) read back, in memory, as the
  draftsmith drafter of its kind: what `draftsmith eval`, `draftsmith info` and `init_from` read. Each format's
  reader (`from_format`, `from_speculators`, ...) sits beside its writer.

A writer only maps: its module has `FORMATS` and `layout(checkpoint, fmt, options) -> skeleton.Layout` (the
config and tensors, how the folder is validated and read back, what must survive the round trip, the card's
facts). `skeleton.write` fills a staging folder next to the destination with it, validates what it wrote by
reading it back, checks the round trip and writes the card; only then is the folder renamed into place, so a
failed export leaves nothing behind. It returns the card's facts (`.training`, `.results` and `.plots` for W&B and
the CLI).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftsmith.config import add_command
from draftsmith.errors import DraftsmithError
from draftsmith.files import replace_folder

WRITERS = {"eagle": "draftsmith.export.eagle3", "draft_lm": "draftsmith.export.hf", "mtp": "draftsmith.export.mtp",
           "medusa": "draftsmith.export.medusa", "dflash": "draftsmith.export.dflash"}
"""drafter kind (config.json `draftsmith_kind`) -> the module that writes its formats"""
FORMATS = {"speculators": ("eagle", "mtp", "dflash"), "sglang": ("eagle",), "hf": ("draft_lm",), "medusa": ("medusa",),
           "dflash": ("dflash",), "draftsmith": tuple(WRITERS)}
"""export format -> the drafter kinds it is for (speculators has a layout per kind)"""
FORMAT_WRITERS = {"draftsmith": "draftsmith.export.native"}
"""formats written by one module for every kind (the others: the kind's module in WRITERS)"""


def drafters_target(name: str, recorded: dict | None, what: str):
    """Load the target a drafter was trained for (for parts drafter folders never store: its final norm, its
    embedding), refusing one whose tokenizer differs from the fingerprint the drafter recorded."""
    from draftsmith.target import fingerprint_mismatch, load_target

    target = load_target(name)
    why = recorded and fingerprint_mismatch(recorded, target.fingerprint(), model=False)
    if why:
        raise DraftsmithError(f"{what}: '{name}' is not this drafter's target: {why}.")
    return target


@dataclass
class Options:
    """What every writer may use; see `draftsmith export --help`."""

    out: Path
    speculative_tokens: int | None = None
    eval_results: str | Path | None = None
    repo_id: str | None = None
    verifier: str | None = None
    license: str | None = None
    include_embedding: bool = False


def checkpoint_kind(checkpoint: Path) -> str:
    """The drafter kind a checkpoint folder's config.json names; a clear error for anything else."""
    path = checkpoint / "config.json"
    if not path.is_file():
        raise DraftsmithError(f"'{checkpoint}' is not a draftsmith drafter checkpoint: it has no config.json (a `best/` "
                              "or `checkpoint-<step>/drafter/` folder written by `draftsmith train`).")
    kind = json.loads(path.read_text()).get("draftsmith_kind")
    if kind not in WRITERS:
        raise DraftsmithError(f"'{checkpoint}' holds a '{kind}' drafter; `draftsmith export` writes "
                              + ", ".join(f"{k} drafters ({', '.join(f for f, o in FORMATS.items() if k in o)})"
                                          for k in WRITERS) + ".")
    return kind


def export(checkpoint: str | Path, fmt: str, out: str | Path, **options) -> Path:
    """Write, validate and round-trip-check an export in a staging folder, then move it to `out`."""
    return export_with_card(checkpoint, fmt, out, **options)[0]


def export_with_card(checkpoint: str | Path, fmt: str, out: str | Path, *, force: bool = False, **options):
    """`export`, also returning the model card's facts (results, training info) for W&B and the CLI."""
    if fmt not in FORMATS:
        raise DraftsmithError(f"Unknown export format '{fmt}'. Use one of: {', '.join(FORMATS)}.")
    checkpoint = Path(checkpoint).expanduser()
    kind = checkpoint_kind(checkpoint)
    if kind not in FORMATS[fmt]:
        mine = [f for f, kinds in FORMATS.items() if kind in kinds]
        raise DraftsmithError(f"--format {fmt} is for {' and '.join(FORMATS[fmt])} drafters; '{checkpoint}' holds a {kind} drafter, "
                              f"which exports as {' or '.join(mine)}.")
    out = Path(out).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise DraftsmithError(f"'{out}' already exists and is not empty. Choose another --out or pass --force.")
    if out.resolve() == checkpoint.resolve():
        raise DraftsmithError("--out must differ from the checkpoint folder.")
    from draftsmith.export import skeleton

    writer = importlib.import_module(FORMAT_WRITERS.get(fmt) or WRITERS[kind])
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        staging.chmod(0o755)
        facts = skeleton.write(writer.layout(checkpoint, fmt, Options(out=out, **options)), staging)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out, facts


# --------------------------------------------------------------------------- command line
def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `export` subcommand."""
    parser = add_command(
        subparsers, "export",
        summary="Write a trained drafter as a vLLM (speculators), SGLang or plain transformers folder with a model card.",
        description="Convert a drafter checkpoint into the folder layout a serving engine loads, validate it "
        "field by field, check the round trip, write a model card with measured results, and optionally push it "
        "to the Hugging Face Hub. EAGLE-3 drafters export as speculators or sglang; draft LMs as hf; MTP as "
        "speculators (one shared module, Qwen3-family targets); Medusa as medusa; DFlash as dflash or speculators "
        "(DSpark: speculators only); any kind as draftsmith.",
    )
    parser.add_argument("checkpoint", help="drafter checkpoint folder written by `draftsmith train`")
    parser.add_argument("--format", required=True, choices=list(FORMATS),
                        help="speculators (vLLM: EAGLE-3, MTP with one shared module, DFlash or DSpark), sglang (SGLang native EAGLE-3), hf (a draft LM as a plain "
                        "transformers folder: assistant_model, vLLM draft_model), medusa (vLLM's Medusa layout; Medusa-2 adds its "
                        "tuned target), dflash (the DFlash reference's DFlashDraftModel) or draftsmith (draftsmith's own "
                        "folder, any kind)")
    parser.add_argument("--out", required=True, help="folder to create (must not exist, or be empty)")
    parser.add_argument("--speculative-tokens", type=int,
                        help="draft length written into the config and the serving commands (default: the draft "
                        "length of the reported eval run, else 3; DFlash/DSpark: block size - 1)")
    parser.add_argument("--eval-results", help="results.json (or its folder) from `draftsmith eval` for the card; "
                        "default: the newest results.json under the checkpoint folder or in the run's eval/ folder beside it")
    parser.add_argument("--verifier", help="hub id of the target to write into the config and card (default: the "
                        "target the drafter was trained on)")
    parser.add_argument("--license", help="license for the card metadata (default: the target's, when known)")
    parser.add_argument("--include-embedding", action="store_true",
                        help="speculators EAGLE-3: also store the target's input embedding as embed_tokens.weight "
                        "(loads the target). Engines share the target's embedding without it; use this to fine-tune "
                        "the export with the speculators library without the verifier at hand")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="upload the folder to this Hub model repo")
    parser.add_argument("--private", action="store_true", help="create the Hub repo as private")
    parser.add_argument("--revision", help="branch to upload to (created if missing)")
    parser.add_argument("--no-wandb", action="store_true", help="do not log eval results to the training W&B run")


def run(args: argparse.Namespace) -> int:
    """Export, then log to W&B and push to the Hub when asked."""
    from draftsmith.export import card

    if args.speculative_tokens is not None and args.speculative_tokens < 1:
        raise DraftsmithError("--speculative-tokens must be at least 1.")
    out, facts = export_with_card(args.checkpoint, args.format, args.out, speculative_tokens=args.speculative_tokens,
                                  eval_results=args.eval_results, repo_id=args.push_to_hub, verifier=args.verifier,
                                  license=args.license, include_embedding=args.include_embedding, force=args.force)
    print(f"Exported {args.format} folder: {out} (validated; converts back to the checkpoint exactly)")
    if facts.results is None:
        print("No draftsmith eval results of this drafter found: the model card says so and reports no numbers.")
    elif not args.no_wandb:
        why_not = card.log_to_wandb(facts.training, facts.results, [out / name for name in facts.plots])
        print(f"Not logged to W&B: {why_not}." if why_not else "Logged the eval results to the training run on W&B.")
    if args.push_to_hub:
        url = card.push_to_hub(out, args.push_to_hub, private=args.private, revision=args.revision)
        print(f"Pushed to {url}")
    return 0
