"""A frozen target sharded over the training processes (`target.shard: fsdp`), so that a target bigger than one
device still feeds a drafter.

torch's own FSDP2 (`fully_shard`, inference only) splits every decoder layer, and the root's own parameters
(embedding, final norm, head), into 1/N pieces, one per process of a group; a layer's whole weights exist only
while that layer runs (all-gathered, then freed). It works over gloo (CPU) and NCCL alike. Each process still
feeds its own batches (data parallel, as the drafter's DDP/ZeRO/FSDP expects), so the features a process gets
are those of the whole target on its batch, bit for bit.

Collective rule: every process of a group must run the target the same number of times in the same order. The
trainer keeps it by calling the target once per micro-batch on every process and by holding the root's
parameters gathered around a whole step (`Target.gathered`), so that the drafter's own calls to the target's
embedding and head need no communication. The decoder is one process, one request: validation decodes and the
final report are skipped under sharding (best/ is chosen by the implied τ); run `draftsmith eval` where the
target fits, or measure the export in vLLM/SGLang.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from draftsmith.errors import DraftsmithError

SHARD_MODES = ("none", "fsdp")


def shard_target(target, device: torch.device | str, group_size: int = 0):
    """Shard `target`'s weights in place over the processes of the default process group, in groups of
    `group_size` processes (0 = all of them; each group holds one whole copy, spread over its members), placing
    the pieces on `device`. Returns the target, whose `sharded` is then true."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available() or not dist.is_initialized():
        raise DraftsmithError("target.shard=fsdp needs several processes: start the run with `accelerate launch` "
                              "(or torchrun), e.g. --config_file recipes/accelerate/cpu-ddp.yaml.")
    world = dist.get_world_size()
    size = group_size or world
    if size < 1 or world % size:
        raise DraftsmithError(f"target.shard_group={group_size} must divide the {world} processes of this run.")
    device = torch.device(device)
    if size == world:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    else:  # HSDP: copies across groups, pieces within one (e.g. one group per node)
        mesh = init_device_mesh(device.type, (world // size, size), mesh_dim_names=("replicate", "shard"))
    target.model.requires_grad_(False)
    for layer in target.layers:  # one unit per decoder layer: only the running layer is ever whole
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(target.model, mesh=mesh, reshard_after_forward=True)  # embedding, final norm, head (tied or not)
    target.sharded = True
    return target


@contextmanager
def gathered(target):
    """The root's own parameters (embedding, final norm, head) whole inside the block, on every process of the
    group at once (a collective: call it the same number of times on each); re-entrant, a no-op unsharded."""
    if not getattr(target, "sharded", False) or target._gathered_depth:
        target._gathered_depth += 1
        try:
            yield
        finally:
            target._gathered_depth -= 1
        return
    target._gathered_depth = 1
    target.model.unshard()
    try:
        yield
    finally:
        target._gathered_depth = 0
        target.model.reshard()


def weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of the weights this process holds, bytes of the whole model's weights): a sharded parameter counts
    its local piece only."""
    local = total = 0
    for parameter in model.parameters():
        piece = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        local += piece.numel() * piece.element_size()
        total += parameter.numel() * parameter.element_size()
    return local, total
