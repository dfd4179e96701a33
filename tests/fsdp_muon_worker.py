"""One process of tests/test_optimizers.py's FSDP2 check, started twice by `torch.distributed.run` over gloo:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/fsdp_muon_worker.py OUT_DIR

A small model with the drafter's kinds of parameters (an embedding and a vocabulary head for AdamW, weight matrices
for Muon, one with a row count that two processes split unevenly, a norm and biases) is sharded with torch's
fully_shard, as Accelerate's FSDP2 does, and trained three steps by the recipe's optimizer (`build_optimizer` with
sharded_by="FSDP2"), each process on its own batch. Rank 0 writes OUT_DIR/result.json with
- how far the sharded weights are from one process's training on both batches (their mean loss, which is what
  FSDP's averaged gradients follow), and how far a Muon that orthogonalised each process's rows apart would have
  moved them (a negative control: the check must be able to tell the two apart);
- for each of Accelerate's FSDP2 checkpoint layouts (FULL_STATE_DICT, the recipe's, and SHARDED_STATE_DICT): whether
  step 3 after saving at step 2 and restoring into a fresh model and optimizer equals step 3 without the stop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.train.optimizers import build_optimizer  # noqa: E402

VOCAB, WIDTH, HIDDEN, UNEVEN = 11, 8, 12, 7  # UNEVEN rows: 4 on rank 0, 3 on rank 1
OPTIONS = SimpleNamespace(optimizer="muon", lr=1e-2, betas=[0.9, 0.95], weight_decay=0.1, muon_lr=2e-2,
                          muon_momentum=0.95, muon_weight_decay=0.1, muon_adjust_lr_fn="match_rms_adamw")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.up = torch.nn.Linear(WIDTH, HIDDEN)
        self.mid = torch.nn.Linear(HIDDEN, UNEVEN, bias=False)
        self.norm = torch.nn.LayerNorm(UNEVEN)
        self.lm_head = torch.nn.Linear(UNEVEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(self.mid(torch.nn.functional.gelu(self.up(self.embed(ids)))))
        logits = self.lm_head(hidden)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def fresh(weights: dict[str, torch.Tensor] | None = None) -> Small:
    torch.manual_seed(0)
    model = Small()
    if weights is not None:
        model.load_state_dict(weights)
    return model


def shard(model: Small) -> Small:
    from torch.distributed.fsdp import fully_shard

    for part in (model.up, model.mid, model.lm_head):
        fully_shard(part)
    return fully_shard(model)


def optimizer_of(model: Small, sharded: bool):
    return build_optimizer(list(model.named_parameters()), OPTIONS, lambda name: 1.0, fused=False, sharded_by="FSDP2" if sharded else None)


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(100 * step + rank))


def loss_over(ranks: list[int], step: int):
    """The loss of a model on these processes' batches of `step`, averaged (as FSDP averages their gradients)."""
    return lambda model: sum(model(batch(rank, step)) for rank in ranks) / len(ranks)


def train_step(model, optimizer, losses) -> None:
    optimizer.zero_grad()
    losses(model).backward()
    optimizer.step()


def whole(model: Small) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def largest_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in a)


def shard_local_muon_step(start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One step of one process's training where Muon orthogonalises each process's rows of `mid.weight` apart
    (as an optimizer that saw only its shard would), the rest as the recipe's optimizer does."""
    model = fresh(start)
    loss_over([0, 1], 1)(model).backward()
    grad = model.mid.weight.grad.clone()
    reference = optimizer_of(model, sharded=False)
    reference.step()
    moved = whole(model)
    blocks = [start["mid.weight"][:4].clone(), start["mid.weight"][4:].clone()]
    for block, rows in zip(blocks, (grad[:4], grad[4:])):
        block.grad = rows
    torch.optim.Muon(blocks, lr=OPTIONS.muon_lr, momentum=OPTIONS.muon_momentum, weight_decay=OPTIONS.muon_weight_decay,
                     adjust_lr_fn=OPTIONS.muon_adjust_lr_fn).step()
    moved["mid.weight"] = torch.cat(blocks).detach()
    return moved


def checkpoint_round_trip(layout: str, at_step_2: dict[str, torch.Tensor], model, optimizer, out: Path,
                          rank: int) -> dict[str, torch.Tensor]:
    """Save the sharded optimizer through Accelerate's FSDP2 checkpoint functions, restore it into a fresh sharded
    model and optimizer (the model from the step-2 weights), and take step 3 there."""
    from accelerate import PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import load_fsdp_optimizer, save_fsdp_optimizer

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=layout)
    accelerator = PartialState(cpu=True)  # Accelerate's view of this process group: its rank, its barrier, its logs
    assert accelerator.process_index == rank and accelerator.num_processes == 2
    folder = out / layout
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, str(folder))
    dist.barrier()
    restored_model = shard(fresh(at_step_2))
    restored = optimizer_of(restored_model, sharded=True)
    load_fsdp_optimizer(plugin, accelerator, restored, restored_model, str(folder))
    train_step(restored_model, restored, loss_over([rank], 3))
    return whole(restored_model)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    start = whole(fresh())
    single = fresh()
    single_optimizer = optimizer_of(single, sharded=False)
    sharded = shard(fresh())
    optimizer = optimizer_of(sharded, sharded=True)
    gaps, after_first = [], None
    for step in (1, 2):
        train_step(sharded, optimizer, loss_over([rank], step))
        train_step(single, single_optimizer, loss_over([0, 1], step))
        gaps.append(largest_gap(whole(sharded), whole(single)))
        after_first = after_first or whole(sharded)
    at_step_2 = whole(sharded)
    resumed = {layout: checkpoint_round_trip(layout, at_step_2, sharded, optimizer, out, rank)
               for layout in ("FULL_STATE_DICT", "SHARDED_STATE_DICT")}
    train_step(sharded, optimizer, loss_over([rank], 3))
    train_step(single, single_optimizer, loss_over([0, 1], 3))
    gaps.append(largest_gap(whole(sharded), whole(single)))
    straight = whole(sharded)
    if rank == 0:
        result = {
            "world_size": dist.get_world_size(),
            "dtensor_parameters": sorted(name for name, p in sharded.named_parameters() if hasattr(p, "full_tensor")),
            "local_rows_mid": sharded.mid.weight.to_local().shape[0],
            "gap_to_one_process_per_step": gaps,
            "shard_local_gap_after_step_1": largest_gap(after_first, shard_local_muon_step(start)),
            "moved_after_step_1": largest_gap(after_first, start),
            "resume_equal": {layout: all(torch.equal(weights[name], straight[name]) for name in straight)
                             for layout, weights in resumed.items()},
            "muon_groups": sum("ns_coefficients" in group for group in optimizer.param_groups),
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
