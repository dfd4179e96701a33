"""The optimizer a recipe trains with (`train.optimizer`): AdamW over every parameter, or Muon over the drafter's
weight matrices with AdamW over the rest, stepped, scheduled, clipped and checkpointed as one optimizer.

Muon (torch.optim.Muon) orthogonalises each matrix's momentum update by Newton-Schulz iterations. As in its
authors' practice and speculators' trainer, it takes 2-D weights with both sides > 1 except embeddings and
vocabulary heads (whose rows are per-token, not a linear map to orthogonalise); norms, biases, those heads and
embeddings stay with AdamW.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from draftsmith.errors import DraftsmithError

ADAMW_NAMES = ("embed", "lm_head", "markov_w1", "markov_w2")  # 2-D, yet per-token rows: AdamW, not Muon


def takes_muon(name: str, parameter: torch.Tensor) -> bool:
    """Whether Muon updates this trainable parameter (a weight matrix that is no embedding or vocabulary head)."""
    return parameter.ndim == 2 and min(parameter.shape) > 1 and not any(key in name for key in ADAMW_NAMES)


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over `muon_groups` and torch.optim.AdamW over `adamw_groups` as one optimizer: its
    param_groups are both optimizers' own group dicts (Muon's first), so a learning-rate scheduler, zero_grad and
    accelerate see every group, and its state_dict holds both optimizers' states for an exact resume."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], muon_options: dict, adamw_options: dict):
        self.muon = torch.optim.Muon(muon_groups, **muon_options) if muon_groups else None
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw_options) if adamw_groups else None
        if self.muon is None and self.adamw is None:
            raise DraftsmithError("Nothing to optimize: the drafter has no trainable parameters.")
        super().__init__([{"params": []}], {})  # torch's hooks and bookkeeping; the groups are the inner ones
        self._share_groups()

    def _inner(self) -> list[torch.optim.Optimizer]:
        return [optimizer for optimizer in (self.muon, self.adamw) if optimizer is not None]

    def _share_groups(self) -> None:
        self.param_groups = [group for optimizer in self._inner() for group in optimizer.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = closure() if closure is not None else None
        for optimizer in self._inner():
            optimizer.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": None if self.muon is None else self.muon.state_dict(),
                "adamw": None if self.adamw is None else self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        for key, optimizer in (("muon", self.muon), ("adamw", self.adamw)):
            if (state_dict.get(key) is None) != (optimizer is None):
                raise DraftsmithError(f"The checkpoint's optimizer has {'no ' if state_dict.get(key) is None else ''}"
                                      f"{key} half and this run's has {'none' if optimizer is None else 'one'}: "
                                      "resume with the train.optimizer the checkpoint was written with.")
            if optimizer is not None:
                optimizer.load_state_dict(state_dict[key])
        self._share_groups()  # loading replaced the inner group dicts


def build_optimizer(named: list[tuple[str, torch.Tensor]], cfg, lr_scale: Callable[[str], float], fused: bool,
                    sharded_by: str | None = None) -> torch.optim.Optimizer:
    """The optimizer for the trainable `named` parameters under `cfg` (the recipe's train section). Weight decay
    (cfg.weight_decay; Muon's cfg.muon_weight_decay) applies to matrices only; `lr_scale(name)` scales a
    parameter's rate (a kind may give parts their own). `fused`: AdamW in one kernel over all parameters.
    `sharded_by`: the launcher, when it shards the drafter's parameters and optimizer state (DeepSpeed ZeRO, FSDP)."""
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
    if sharded_by:
        raise DraftsmithError(
            f"train.optimizer=muon runs on one process and under DDP (recipes/accelerate/ddp.yaml, cpu-ddp.yaml), "
            f"not yet under {sharded_by}: ZeRO hands the optimizer flat 1-D shards where Muon orthogonalises whole "
            "matrices, and FSDP's optimizer checkpoints expect one torch optimizer, not two. A drafter is one layer "
            "and heads, which DDP holds on every GPU; or use train.optimizer=adamw.")
    muon_lr = cfg.muon_lr or cfg.lr
    muon_options = {"lr": muon_lr, "momentum": cfg.muon_momentum, "adjust_lr_fn": cfg.muon_adjust_lr_fn}
    return MuonWithAdamW(param_groups("muon", muon_lr, cfg.muon_weight_decay),
                         param_groups("adamw", cfg.lr, cfg.weight_decay), muon_options, adamw_options)
