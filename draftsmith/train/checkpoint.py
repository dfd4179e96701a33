"""Checkpoints that survive SIGKILL: written to a temporary folder, renamed, then pointed to.

Layout of `output_dir`:
    checkpoint-<step>/   accelerate state (model, optimizer, scheduler, RNG of every process),
                         drafter/ (save_pretrained), trainer_state.json (step, best score, ...)
    latest               text file naming the newest complete checkpoint folder
    best/                the drafter folder with the best acceptance length so far
A crash at any moment leaves either the old or the new checkpoint complete, never half of one:
`latest` is replaced (atomically) only after the folder has been renamed into place.
"""

from __future__ import annotations

import json
import random
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.files import replace_folder, write_atomically

STATE_FILE = "trainer_state.json"
DRAFTER_FOLDER = "drafter"


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint folder `output_dir/latest` points to, or None before the first one."""
    pointer = Path(output_dir) / "latest"
    if not pointer.is_file():
        return None
    folder = Path(output_dir) / pointer.read_text().strip()
    if not (folder / STATE_FILE).is_file():
        raise DraftsmithError(
            f"{pointer} names '{folder.name}', which is missing or incomplete. Point `latest` at another "
            "checkpoint-<step> folder or start in a fresh output_dir."
        )
    return folder


def save_checkpoint(accelerator, output_dir: Path, step: int, trainer_state: dict, export_drafter, keep: int,
                    per_process=None) -> Path:
    """Collective: every process writes its part into a staging folder (`per_process(staging)` too, when given:
    state of its own that accelerate does not save); the main one publishes it."""
    final = output_dir / checkpoint_name(step)
    staging = output_dir / f".{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))  # model, optimizer, scheduler, RNG states of all processes
    if per_process is not None:
        per_process(staging)
    export_drafter(staging / DRAFTER_FOLDER)
    if accelerator.is_main_process:
        (staging / STATE_FILE).write_text(json.dumps(trainer_state, indent=2))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        replace_folder(staging, final)
        write_atomically(output_dir / "latest", final.name + "\n")
        _remove_old(output_dir, keep)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, folder: Path) -> dict:
    """Restore model, optimizer, scheduler and RNG states; return the trainer state."""
    accelerator.load_state(str(folder))
    return json.loads((folder / STATE_FILE).read_text())


def _remove_old(output_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    steps = sorted(int(p.name.split("-")[1]) for p in output_dir.glob("checkpoint-*") if p.name.split("-")[1].isdigit())
    for step in steps[:-keep]:
        shutil.rmtree(output_dir / checkpoint_name(step), ignore_errors=True)


@contextmanager
def preserved_rng():
    """Run a block without disturbing the training RNG streams (validation must not change training)."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
