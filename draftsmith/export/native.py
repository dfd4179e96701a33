"""`draftsmith` exports: any trained drafter as draftsmith's own folder, with a model card.

For kinds no engine loads yet (or a target an engine's layout does not cover), this is the folder to share: the
checkpoint's files as `draftsmith train` wrote them (config.json, model.safetensors and what the kind keeps
beside them, such as Medusa's measured tree), which `draftsmith eval --drafter FOLDER` and each kind's
`load_proposer(folder, target)` read. The validator checks that every file is byte-identical to the checkpoint's
and that the tensors load, so decoding it gives exactly the checkpoint's τ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import card
from draftsmith.export.skeleton import Layout, RoundTrip, read_folder
from draftsmith.files import file_sha256

FORMATS = ("draftsmith",)
SKIPPED = ("README.md",)  # a card from an earlier export is replaced by this one's


@dataclass(kw_only=True)
class NativeCard(card.SharedFacts):
    """What the card of a draftsmith-folder export states."""

    kind: str
    files: list[str]
    parameters: int


def validate(folder: Path, checkpoint: Path, files: list[str]) -> None:
    """Every copied file equals the checkpoint's, config.json names the kind, the tensors load."""
    changed = [name for name in files if file_sha256(folder / name) != file_sha256(checkpoint / name)]
    if changed:
        raise DraftsmithError(f"The draftsmith export in '{folder}' differs from the checkpoint in {', '.join(changed)}.")
    if not json.loads((folder / "config.json").read_text()).get("draftsmith_kind"):
        raise DraftsmithError(f"The draftsmith export in '{folder}' has no draftsmith_kind in config.json.")
    load_file(str(folder / "model.safetensors"))


def layout(checkpoint: Path, fmt: str, options) -> Layout:
    """The checkpoint's files, copied as they are; they must read back as the checkpoint's config and tensors."""
    meta = json.loads((checkpoint / "config.json").read_text())
    if not (checkpoint / "model.safetensors").is_file():
        raise DraftsmithError(f"'{checkpoint}' has no model.safetensors: not a complete drafter folder.")
    files = sorted(p.name for p in checkpoint.iterdir() if p.is_file() and p.name not in SKIPPED)
    kind = meta["draftsmith_kind"]
    shared = card.shared_facts(checkpoint, options, kind, f"is a {kind} drafter", meta.get("target_name"))
    tensors = load_file(str(checkpoint / "model.safetensors"))
    facts = NativeCard(**shared, kind=kind, files=files, parameters=sum(t.numel() for t in tensors.values()))
    return Layout(validate=lambda folder: validate(folder, checkpoint, files),
                  round_trip=RoundTrip(read_folder, tensors, fields=dict(meta)), facts=facts, render=render_card,
                  copies={name: checkpoint / name for name in files})


def render_card(facts: NativeCard) -> str:
    """README.md of a draftsmith folder: what it is, how to load it, the training run and measured results."""
    about = [
        f"A `{facts.kind}` drafter trained with draftsmith for `{facts.verifier}`, in draftsmith's own folder format. "
        "The target verifies every drafted token, so the output is exactly the target's own; only the speed changes.",
        "", *card.table([("kind", f"`{facts.kind}`"), ("stored parameters", f"{facts.parameters:,}"),
                         ("files", ", ".join(f"`{name}`" for name in facts.files))]), ""]
    usage = ["## Using it", "", "```bash",
             f"draftsmith eval --target {facts.verifier} --drafter {facts.model_ref} --out eval/", "```", "",
             "In Python: `draftsmith.drafters.kind_module(\"" + facts.kind + "\").load_proposer(folder, target)` gives "
             "the proposer the built-in speculative decoder drafts with.", ""]
    tags = ["speculative-decoding", facts.kind, "draftsmith"]
    return card.compose(facts, tags, f"{facts.kind} drafter", about, usage)
