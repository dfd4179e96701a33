"""The optimizer a recipe trains with (`train.optimizer`): AdamW over every parameter, or Muon over the drafter's
weight matrices with AdamW over the rest, stepped, scheduled, clipped and checkpointed as one optimizer.

Muon (torch.optim.Muon) orthogonalises each matrix's momentum update by Newton-Schulz iterations. As in its
authors' practice and speculators' trainer, it takes 2-D weights with both sides > 1 except embeddings and
vocabulary heads (whose rows are per-token, not a linear map to orthogonalise); norms, biases, those heads and
embeddings stay with AdamW. Under DeepSpeed ZeRO, whose optimizer sees flat shards, DeepSpeed's own Muon takes
the same split and steps as torch's does (`deepspeed_muon`); under FSDP2, whose shards are DTensors, torch's Muon
steps each whole matrix gathered from them. FSDP1's flat shards are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from draftsmith.errors import DraftsmithError

ADAMW_NAMES = ("embed", "lm_head", "markov_w1", "markov_w2")  # 2-D, yet per-token rows: AdamW, not Muon


def takes_muon(name: str, parameter: torch.Tensor) -> bool:
    """Whether Muon updates this trainable parameter (a weight matrix that is no embedding or vocabulary head)."""
    return parameter.ndim == 2 and min(parameter.shape) > 1 and not any(key in name for key in ADAMW_NAMES)


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over `muon_groups` and torch.optim.AdamW over `adamw_groups` as one optimizer: its
    param_groups are both optimizers' own group dicts (Muon's first) and its state is the one per-parameter dict both
    write into, so a learning-rate scheduler, zero_grad and accelerate see every group, and `state_dict` is torch's
    standard layout (state by parameter index, then the groups), which is what torch.distributed.checkpoint's
    get/set_optimizer_state_dict, and through them Accelerate's FSDP2 checkpoints, read and write. A Muon group is
    told from an AdamW group by its `ns_coefficients`."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], muon_options: dict, adamw_options: dict):
        self.muon = torch.optim.Muon(muon_groups, **muon_options) if muon_groups else None
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw_options) if adamw_groups else None
        if self.muon is None and self.adamw is None:
            raise DraftsmithError("Nothing to optimize: the drafter has no trainable parameters.")
        super().__init__([{"params": []}], {})  # torch's hooks and bookkeeping; the groups are the inner ones
        self.param_groups = [group for optimizer in self._inner() for group in optimizer.param_groups]
        self._share()

    def _inner(self) -> list[torch.optim.Optimizer]:
        return [optimizer for optimizer in (self.muon, self.adamw) if optimizer is not None]

    def _share(self) -> None:
        """Point both inner optimizers at this one's groups (Muon's first) and its one state dict (which holds the
        other's parameters too, so only this optimizer's state_dict is whole: the inner ones' are never saved)."""
        muon_count = len(self.muon.param_groups) if self.muon is not None else 0
        if self.muon is not None:
            self.muon.param_groups, self.muon.state = self.param_groups[:muon_count], self.state
        if self.adamw is not None:
            self.adamw.param_groups, self.adamw.state = self.param_groups[muon_count:], self.state

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = closure() if closure is not None else None
        if self.muon is not None:
            self._muon_step()
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def _muon_step(self) -> None:
        """torch's Muon step. A matrix sharded by FSDP2 (a DTensor holding this process's rows) is stepped whole:
        it, its gradient and its momentum are gathered, torch's Muon steps the whole matrix as on one process
        (Newton-Schulz runs in bfloat16, where products summed over shards would round apart from one process's),
        and each process keeps its rows of the result; the momentum stays sharded between steps."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        sharded = {id(p): p for group in self.muon.param_groups for p in group["params"]
                   if isinstance(p, DTensor) and p.grad is not None}
        if not sharded:
            self.muon.step()
            return
        whole = {}
        for key, p in sharded.items():
            whole[key] = p.full_tensor()
            whole[key].grad = p.grad.full_tensor()
            if "momentum_buffer" in self.state.get(p, {}):
                self.state[whole[key]] = {"momentum_buffer": self.state.pop(p)["momentum_buffer"].full_tensor()}
        kept = [group["params"] for group in self.muon.param_groups]
        try:
            for group in self.muon.param_groups:
                group["params"] = [whole.get(id(p), p) for p in group["params"]]
            self.muon.step()
        finally:
            for group, params in zip(self.muon.param_groups, kept):
                group["params"] = params
        for key, p in sharded.items():
            rows = lambda tensor: distribute_tensor(tensor, p.device_mesh, p.placements, src_data_rank=None)  # noqa: E731
            p.copy_(rows(whole[key]))  # every process stepped the same whole matrix: no need to send it
            self.state[p] = {"momentum_buffer": rows(self.state.pop(whole[key])["momentum_buffer"])}

    def load_state_dict(self, state_dict: dict) -> None:
        if set(state_dict) == {"muon", "adamw"}:  # a checkpoint written before the one layout: each half its own
            state_dict = self._from_halves(state_dict)
        saved_muon = sum("ns_coefficients" in group for group in state_dict["param_groups"])
        for key, optimizer, saved in (("muon", self.muon, saved_muon),
                                      ("adamw", self.adamw, len(state_dict["param_groups"]) - saved_muon)):
            if (saved == 0) != (optimizer is None):
                raise DraftsmithError(f"The checkpoint's optimizer has {'no ' if saved == 0 else ''}"
                                      f"{key} half and this run's has {'none' if optimizer is None else 'one'}: "
                                      "resume with the train.optimizer the checkpoint was written with.")
        super().load_state_dict(state_dict)  # new group dicts and a new state dict: share them again
        self._share()

    def _from_halves(self, halves: dict) -> dict:
        """The one layout of a checkpoint whose halves were saved apart (each indexed its parameters from 0)."""
        state, groups, offset = {}, [], 0
        for key in ("muon", "adamw"):
            half = halves[key]
            if half is None:
                continue
            state.update({index + offset: value for index, value in half["state"].items()})
            groups += [{**group, "params": [index + offset for index in group["params"]]}
                       for group in half["param_groups"]]
            offset += sum(len(group["params"]) for group in half["param_groups"])
        return {"state": state, "param_groups": groups}


def build_optimizer(named: list[tuple[str, torch.Tensor]], cfg, lr_scale: Callable[[str], float], fused: bool,
                    sharded_by: str | None = None) -> torch.optim.Optimizer:
    """The optimizer for the trainable `named` parameters under `cfg` (the recipe's train section). Weight decay
    (cfg.weight_decay; Muon's cfg.muon_weight_decay) applies to matrices only; `lr_scale(name)` scales a
    parameter's rate (a kind may give parts their own). `fused`: AdamW in one kernel over all parameters.
    `sharded_by`: the launcher, when it shards the drafter's parameters and optimizer state ("DeepSpeed ZeRO",
    "FSDP2", "FSDP1"). Under FSDP2 each parameter is a DTensor holding this process's rows: AdamW steps the rows,
    and Muon each whole matrix (`MuonWithAdamW._muon_step`), so the same optimizer serves one process and FSDP2
    alike and moves the weights the same."""
    groups: dict[tuple[str, bool, float], list] = {}  # (optimizer, decays, rate scale) -> parameters
    for decay in (True, False):  # matrices first: the group order of checkpoints written before Muon
        for name, parameter in named:
            if (parameter.ndim >= 2) == decay:
                muon = cfg.optimizer == "muon" and takes_muon(name, parameter)
                groups.setdefault(("muon" if muon else "adamw", decay, lr_scale(name)), []).append(parameter)

    def param_groups(which: str, lr: float, weight_decay: float) -> list[dict]:
        return [{"params": params, "lr": lr * scale, "weight_decay": weight_decay if decay else 0.0}
                for (optimizer, decay, scale), params in groups.items() if optimizer == which]

    adamw_options = {"lr": cfg.lr, "betas": tuple(cfg.betas), "fused": fused or None}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(param_groups("adamw", cfg.lr, cfg.weight_decay), **adamw_options)
    muon_lr = cfg.muon_lr or cfg.lr
    if sharded_by == "DeepSpeed ZeRO":
        return deepspeed_muon(named, groups, cfg, muon_lr)
    if sharded_by not in (None, "FSDP2"):
        raise DraftsmithError(
            f"train.optimizer=muon runs on one process, under DDP, DeepSpeed ZeRO (its own Muon) and FSDP2 "
            f"(recipes/accelerate/fsdp.yaml), not under {sharded_by}, which hands the optimizer flat 1-D shards of "
            "the weights, where Muon has no matrix to orthogonalise: set fsdp_version: 2 in the accelerate config, "
            "or use train.optimizer=adamw.")
    muon_options = {"lr": muon_lr, "momentum": cfg.muon_momentum, "adjust_lr_fn": cfg.muon_adjust_lr_fn}
    return MuonWithAdamW(param_groups("muon", muon_lr, cfg.muon_weight_decay),
                         param_groups("adamw", cfg.lr, cfg.weight_decay), muon_options, adamw_options)


def muon_rate_scale(shape: torch.Size, adjust_lr_fn: str) -> float:
    """How torch.optim.Muon scales its rate for a matrix of `shape` beyond DeepSpeed's Muon, which always scales
    by sqrt(max(1, rows / cols)) (torch's "original"); "match_rms_adamw" scales by 0.2 * sqrt(max(rows, cols))."""
    rows, cols = shape[0], shape[1]
    original = math.sqrt(max(1.0, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols)) / original if adjust_lr_fn == "match_rms_adamw" else 1.0


def deepspeed_muon(named: list[tuple[str, torch.Tensor]], groups: dict, cfg, muon_lr: float) -> torch.optim.Optimizer:
    """Muon under DeepSpeed ZeRO: DeepSpeed's own MuonWithAuxAdam, whose ZeRO stages gather each matrix's whole
    gradient, orthogonalise it and hand the optimizer the update's flat shard. The same split as on one process
    (each parameter tagged `use_muon`), Newton-Schulz with torch's quintic coefficients (`ns_method: standard`),
    torch's AdamW for the rest. DeepSpeed scales each matrix's rate like torch's "original"; for
    "match_rms_adamw" each matrix shape gets a group whose rate carries the rest of torch's factor, and whose
    weight decay is divided by it, so rate × decay stays `muon_lr × muon_weight_decay` as in torch."""
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

    for name, parameter in named:
        parameter.use_muon = takes_muon(name, parameter)
    muon_groups, adamw_groups = [], []
    for (optimizer, decay, scale), params in groups.items():
        weight_decay = (cfg.muon_weight_decay if optimizer == "muon" else cfg.weight_decay) if decay else 0.0
        if optimizer == "adamw":
            adamw_groups.append({"params": params, "lr": cfg.lr * scale, "betas": tuple(cfg.betas), "eps": 1e-8,
                                 "weight_decay": weight_decay, "use_muon": False})
            continue
        by_shape: dict[tuple, list] = {}
        for parameter in params:
            by_shape.setdefault(tuple(parameter.shape), []).append(parameter)
        for shape, same in by_shape.items():
            factor = muon_rate_scale(torch.Size(shape), cfg.muon_adjust_lr_fn)
            muon_groups.append({"params": same, "lr": muon_lr * scale * factor, "momentum": cfg.muon_momentum,
                                "weight_decay": weight_decay / factor, "ns_method": "standard", "use_muon": True})
    if not muon_groups and not adamw_groups:
        raise DraftsmithError("Nothing to optimize: the drafter has no trainable parameters.")
    return MuonWithAuxAdam(muon_groups + adamw_groups, adam_optimizer=torch.optim.AdamW if adamw_groups else None)
