"""The one path every export takes (DESIGN §4): write → read back → compare → card.

A format's writer only maps: from a checkpoint it builds a `Layout` (config.json, tensors, files copied as they
are), says how the folder is checked as its engine builds it (`validate`), how the folder reads back in draftsmith's
terms and what of the checkpoint must come back exactly (`RoundTrip`), and what the card states. `write` does the
rest, the same way for every format: write the files, re-read them from disk and validate them, convert them back
and compare them with the checkpoint, write the parts that check themselves (Medusa-2's tuned target), write the
card through the shared card code, and refuse a folder that holds anything else. Any failure raises, and
`draftsmith.export.export_with_card` drops the staging folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.card import SharedFacts, finish_card

CONFIG, WEIGHTS, CARD = "config.json", "model.safetensors", "README.md"


@dataclass
class RoundTrip:
    """How an export reads back, and what of the checkpoint must survive it."""

    read_back: Callable[[Path], tuple[dict, dict[str, torch.Tensor]]]
    """the written folder -> (a draftsmith folder's config.json, its tensors in our names), read as the engine reads
    it (hf: the model's config and the logits transformers computes from the folder)"""
    tensors: dict[str, torch.Tensor]
    """what must come back bit for bit: every one of these tensors, and no other"""
    fields: dict[str, object] = field(default_factory=dict)
    """dotted config.json keys (`config.layers`) -> the checkpoint's value, which must read back equal"""


@dataclass
class Layout:
    """One export as its format's writer maps a checkpoint; `write` does everything else."""

    validate: Callable[[Path], None]
    """re-reads the written folder from disk and checks every field its engine relies on (raises)"""
    round_trip: RoundTrip
    facts: SharedFacts
    render: Callable[[SharedFacts], str]  # facts -> README.md
    config: dict | None = None  # config.json
    tensors: dict[str, torch.Tensor] | None = None  # model.safetensors
    copies: dict[str, Path] = field(default_factory=dict)  # name -> a checkpoint file copied byte for byte
    parts: dict[str, Callable[[Path], None]] = field(default_factory=dict)
    """subfolders written after the round trip by code that checks them itself: name -> write(folder)"""


def write(layout: Layout, folder: Path) -> SharedFacts:
    """Write `layout` into the empty `folder`, validate it, check the round trip, add its parts and the card, and
    check that nothing else is there; returns the card's facts."""
    write_files(layout, folder)
    layout.validate(folder)
    check_round_trip(folder, layout.round_trip)
    for name, write_part in layout.parts.items():
        write_part(folder / name)
    facts = finish_card(folder, layout.facts, layout.render)
    check_contents(folder, {*layout.copies, *layout.parts, *([CONFIG] if layout.config is not None else []),
                            *([WEIGHTS] if layout.tensors is not None else [])})
    return facts


def write_files(layout: Layout, folder: Path) -> None:
    """The copies, config.json and model.safetensors (safetensors only, readable by everyone: it is meant to be
    shared)."""
    from safetensors.torch import save_file

    for name, source in layout.copies.items():
        shutil.copyfile(source, folder / name)
    if layout.config is not None:
        (folder / CONFIG).write_text(json.dumps(layout.config, indent=2) + "\n")
    if layout.tensors is not None:
        tensors = {name: t.detach().contiguous().cpu() for name, t in layout.tensors.items()}
        save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
        (folder / WEIGHTS).chmod(0o644)


def read_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, the tensors of model.safetensors) of a written folder, as an engine reads them."""
    from safetensors.torch import load_file

    return json.loads((folder / CONFIG).read_text()), load_file(str(folder / WEIGHTS))


def check_round_trip(folder: Path, round_trip: RoundTrip) -> None:
    """Read `folder` back; every tensor and field `round_trip` names must be the checkpoint's, or this raises."""
    meta, tensors = round_trip.read_back(folder)
    want = round_trip.tensors
    problems = [f"tensor names differ after the round trip: {sorted(set(tensors) ^ set(want))}"] \
        if set(tensors) != set(want) else []
    problems += [f"{name} changed in the round trip" for name in sorted(set(tensors) & set(want))
                 if not torch.equal(tensors[name], want[name])]
    for path, value in round_trip.fields.items():
        back = lookup(meta, path)
        if back != value:
            problems.append(f"{path} reads back as {back!r}, the checkpoint has {value!r}")
    if problems:
        raise DraftsmithError(f"The export in '{folder}' does not convert back to the checkpoint; engines would "
                              "draft with something else:\n" + "\n".join(f"  - {p}" for p in problems))


def lookup(meta: dict, path: str):
    """meta["a"]["b"] for path "a.b"; None where a key is missing."""
    for key in path.split("."):
        meta = meta.get(key) if isinstance(meta, dict) else None
    return meta


def config_fields(key: str, config: dict) -> dict[str, object]:
    """RoundTrip fields for every entry of the config dict `config` held under `key` (a layer config), less what is
    no setting: private and architecture names, the transformers version, and the label maps (JSON turns their keys
    into strings)."""
    skipped = ("architectures", "transformers_version", "id2label", "label2id")
    return {f"{key}.{name}": value for name, value in config.items()
            if not name.startswith("_") and name not in skipped}


def check_contents(folder: Path, written: set[str]) -> None:
    """The folder holds what was written, the card and its plots, and nothing else."""
    problems = [f"{name} is missing" for name in sorted(written) if not (folder / name).exists()]
    problems += [f"{path.name}: unexpected file in the export" for path in sorted(folder.iterdir())
                 if path.name not in written | {CARD} and not (path.suffix == ".png" and path.is_file())]
    if problems:
        raise DraftsmithError(f"The export in '{folder}' is not what was written: {'; '.join(problems)}.")
