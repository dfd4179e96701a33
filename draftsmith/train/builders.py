"""Plain builders the training recipe is assembled from: accelerator, loss wrapper, schedule, helpers."""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from draftsmith.errors import DraftsmithError
from draftsmith.target import cpu_bf16_is_faster
from draftsmith.train.config import TrainConfig


class DrafterLoss(nn.Module):
    """The drafter's loss as `forward`, so DDP / DeepSpeed / FSDP hooks see every training call."""

    def __init__(self, drafter: nn.Module, target_head):
        super().__init__()
        self.drafter = drafter
        self.target_head = target_head  # a plain function of the frozen target, not a submodule

    def forward(self, batch: dict):
        return self.drafter.loss(batch, self.target_head)


def warmup_cosine(warmup_steps: int, max_steps: int, min_lr_ratio: float, time_spent=None):
    """LR multiplier: linear warmup to 1, then cosine down to `min_lr_ratio` at `max_steps`. With `time_spent` (a
    function giving the share of a wall-clock budget spent, 0..1) the cosine follows whichever of steps and time is
    further along, so a run that its budget stops before max_steps still ends at the low rate."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        if time_spent is not None:
            progress = min(1.0, max(progress, time_spent()))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def cpu_threads_per_process(cores: int, local_processes: int, requested: int | None) -> int:
    """Torch threads for one of `local_processes` CPU training processes sharing `cores` cores: its share,
    cores // processes (at least 1). A smaller OMP_NUM_THREADS (`requested`) is kept; a larger one is cut
    to the share, since two 2-thread processes on 2 cores were measured ~40x slower per target pass."""
    share = max(1, cores // max(1, local_processes))
    return share if requested is None else max(1, min(requested, share))


def share_cpu_threads(environ=os.environ) -> str | None:
    """Under a multi-process launch without CUDA, set this process's torch threads to its share of the
    cores (see `cpu_threads_per_process`); returns a line saying what was set, None when nothing was."""
    local = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    if local < 2 or torch.cuda.is_available():
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    requested = int(environ["OMP_NUM_THREADS"]) if environ.get("OMP_NUM_THREADS", "").isdigit() else None
    threads = cpu_threads_per_process(cores, local, requested)
    torch.set_num_threads(threads)
    note = f"torch threads per process: {threads} ({local} processes on {cores} cores"
    if requested is not None and requested != threads:
        note += f"; OMP_NUM_THREADS={requested} would oversubscribe them"
    elif requested is not None and threads < max(1, cores // local):  # torchrun writes 1 when it was unset
        note += f"; OMP_NUM_THREADS={requested} kept, the share would be {cores // local}"
    return note + ")"


def build_accelerator(config: TrainConfig):
    """An Accelerator for whatever `accelerate launch` set up; DeepSpeed on CPU talks over gloo."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    cuda = torch.cuda.is_available()
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not cuda:
        raise DraftsmithError(
            "FSDP needs GPUs (on CPU Accelerate would quietly run plain DDP instead). On CPU use "
            "recipes/accelerate/cpu-ddp.yaml, cpu-zero2.yaml or cpu-zero3.yaml."
        )
    handlers = [InitProcessGroupKwargs(backend="gloo")] if deepspeed and not cuda else []
    return Accelerator(
        cpu=not cuda and not deepspeed,  # Accelerate ignores DeepSpeed when cpu=True
        mixed_precision=resolve_precision(config.train.precision, cuda),
        gradient_accumulation_steps=config.train.grad_accum,
        step_scheduler_with_optimizer=False,  # we step it once per optimizer step, whatever the world size
        log_with=list(config.tracking.report_to) or None,
        project_dir=config.output_dir,
        kwargs_handlers=handlers,
    )


def resolve_precision(precision: str, cuda: bool) -> str:
    """Accelerate's mixed_precision for a recipe's `train.precision` ("auto": bf16 where it is native and, on a
    CPU, measured faster than fp32)."""
    if precision == "auto":
        if cuda:
            return "bf16" if torch.cuda.is_bf16_supported() else "no"
        return "bf16" if cpu_bf16_is_faster() else "no"
    return {"fp32": "no"}.get(precision, precision)


def to_device(batch, device):
    """Move every tensor of a (nested) batch to `device`."""
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def broadcast(record: dict) -> dict:
    """The main process's `record` on every process."""
    from accelerate.utils import broadcast_object_list

    holder = [record]
    broadcast_object_list(holder, from_process=0)
    return holder[0]


def flatten(tree: dict, prefix: str = "") -> dict:
    """Nested config -> {"train.lr": 0.0003, ...} with scalars only (what TensorBoard hparams accept)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat
