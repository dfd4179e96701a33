"""Medusa-1 heads (DESIGN §3 "Medusa"): extra decoding heads on the frozen target's last hidden state.

Head i = n ResBlocks (x + SiLU(W x + b), W zero-initialised, so a fresh head starts as its projection) then
Linear(H -> V); it reads the target's last hidden state after the final norm (what the target's lm_head
reads) at index t and predicts x_{t+2+i}. Loss sum_i 0.8^i CE_i against the target's own distribution at
t+1+i (soft labels, as EAGLE-3 trains). Weights use vLLM's Medusa names (`blocks.{h}.layers.{l}`,
`lm_heads.{h}`).

Decoding: `DecodeState.features` hold the target's features at committed positions 0..T-2, and the feature at
T-2 is the one whose lm_head prediction is the last committed token x_{T-1}, so head 0 at T-2 predicts the first
draft token x_T. The heads read one feature and keep no cache: a chain is head i's choice at position i.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftsmith.config import build
from draftsmith.drafters import (
    DecodeState, Draft, DraftShape, Sampling, check_target, load_attached, read_folder, save_folder, target_info,
)
from draftsmith.drafters.tree import dynamic_tree
from draftsmith.errors import DraftsmithError
from draftsmith.sampling import target_probs



@dataclass
class Config:
    """Options of the Medusa-1 heads."""

    num_heads: int = 4
    """heads; head i predicts the token i+2 ahead of the feature it reads"""
    num_layers: int = 1
    """ResBlocks per head"""
    step_weight: float = 0.8
    """loss = sum over heads i of step_weight^i * CE_i"""
    init_from_target: bool = True
    """start each head's projection from the target's lm_head (final-norm input, so the same matrix)"""
    top_k: int = 5
    """k of the per-head top-k accuracy metrics (topk_i)"""

    def validate(self) -> None:
        if self.num_heads < 1:
            raise DraftsmithError(f"drafter.num_heads must be at least 1, got {self.num_heads}.")
        if self.num_layers < 0:
            raise DraftsmithError(f"drafter.num_layers must be >= 0, got {self.num_layers}.")
        if self.top_k < 1:
            raise DraftsmithError(f"drafter.top_k must be at least 1, got {self.top_k}.")


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The residual block."""
        return x + nn.functional.silu(self.linear(x))


class Drafter(nn.Module):
    """Medusa-1 heads on the frozen target; `forward(batch, target_head)` is the training loss."""

    def __init__(self, config: Config, hidden_size: int, vocab_size: int, num_target_layers: int):
        super().__init__()
        self.config, self.sizes = config, {"hidden_size": hidden_size, "vocab_size": vocab_size,
                                           "num_target_layers": num_target_layers}
        self.blocks = nn.ModuleList([nn.Module() for _ in range(config.num_heads)])
        for block in self.blocks:
            block.layers = nn.ModuleList([ResBlock(hidden_size) for _ in range(config.num_layers)])
        self.lm_heads = nn.ModuleList([nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(config.num_heads)])
        self.target_info: dict = {}
        self.target = None  # the frozen target whose final norm the heads read through; never a submodule

    @property
    def last_layer(self) -> int:
        """The target's last decoder layer (output-layer id)."""
        return self.sizes["num_target_layers"] - 1

    @property
    def required_layers(self) -> list[int]:
        """The target's last layer: the heads' input (after its final norm) and the soft labels."""
        return [self.last_layer]

    def attach(self, target) -> Drafter:
        """Read the target's frozen final norm from now on, after checking that the sizes and tokenizer fit."""
        s = self.sizes
        check_target({"hidden_size": s["hidden_size"], "vocab_size": s["vocab_size"],
                      "num_layers": s["num_target_layers"]}, self.target_info.get("target_fingerprint"), target,
                     "These Medusa heads")
        self.target = target
        return self

    def head(self, i: int, last_features: torch.Tensor) -> torch.Tensor:
        """Head i's logits [..., V] from the target's last-layer output (its frozen final norm applied here)."""
        if self.target is None:
            raise DraftsmithError("These Medusa heads are not attached to a target: call drafter.attach(target) first.")
        weight = self.lm_heads[i].weight
        x = self.target.final_norm(last_features.to(self.target.dtype)).to(weight.device, weight.dtype)
        for layer in self.blocks[i].layers:
            x = layer(x)
        return self.lm_heads[i](x).float()

    def forward(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """sum_i w^i CE_i against the target's distribution; loss_i, acc_i (top-1) and topk_i per head."""
        last = batch["features"][self.last_layer]
        loss_mask = batch["loss_mask"].bool()
        total, metrics = last.new_zeros((), dtype=torch.float32), {}
        for i in range(self.config.num_heads):
            counted = loss_mask[:, i + 2 :]  # index t predicts x_{t+2+i}
            rows = counted.nonzero(as_tuple=True)
            if rows[0].numel() == 0:
                continue
            log_q = torch.log_softmax(self.head(i, last[rows]), -1)
            with torch.no_grad():
                p = torch.softmax(target_head(last[rows[0], rows[1] + 1 + i]).float(), -1)
            head_loss = -(p * log_q).sum(-1).mean()
            total = total + self.config.step_weight**i * head_loss
            best = p.argmax(-1, keepdim=True)
            metrics[f"loss_{i}"] = float(head_loss.detach())
            metrics[f"acc_{i}"] = float((log_q.argmax(-1, keepdim=True) == best).float().mean())
            top = log_q.topk(min(self.config.top_k, log_q.shape[-1]), -1).indices
            metrics[f"top{self.config.top_k}_{i}"] = float((top == best).any(-1).float().mean())
        metrics["loss"] = float(total.detach())
        return total, metrics

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)

    # ---- saving
    def save_pretrained(self, folder: str | Path) -> None:
        """config.json (kind, options, sizes) + model.safetensors (the heads only, no target parts)."""
        save_folder(folder, "medusa", {"config": dataclasses.asdict(self.config), **self.sizes}, self)

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Drafter:
        """Load a folder written by `save_pretrained`, attached to `target` when given."""
        meta, tensors, target_record = read_folder(folder, "medusa")
        drafter = cls(build(Config, meta["config"], prefix="drafter."), meta["hidden_size"], meta["vocab_size"],
                      meta["num_target_layers"])
        drafter.load_state_dict(tensors)
        drafter.target_info = target_record
        return drafter if target is None else drafter.attach(target)

    def proposer(self, target, generator: torch.Generator | None = None) -> MedusaProposer:
        """The decode-time view of these heads for `target`."""
        return MedusaProposer(self.attach(target), generator)


# --------------------------------------------------------------------------- building
def create(config: Config, target, draft_vocab=None) -> Drafter:
    """Fresh Medusa heads for `target`, projections copied from its lm_head when `init_from_target`."""
    config = dataclasses.replace(config)
    config.validate()
    if draft_vocab is not None:
        raise DraftsmithError("These Medusa heads predict over the target's whole vocabulary (vLLM's Medusa layout "
                              "has no draft vocabulary); set data.draft_vocab: null for kind medusa.")
    drafter = Drafter(config, target.hidden_size, target.vocab_size, target.num_layers).to(target.device)
    drafter.target_info = target_info(target)
    drafter.attach(target)
    if config.init_from_target:
        with torch.no_grad():
            for head in drafter.lm_heads:
                head.weight.copy_(target.model.get_output_embeddings().weight.float())
    return drafter


def load_proposer(folder: str | Path, target) -> MedusaProposer:
    """A saved Medusa folder as a Proposer for `target`."""
    return load_attached(Drafter, folder, target).proposer(target)


# --------------------------------------------------------------------------- decoding
class MedusaProposer:
    """Chains or trees of head choices at the last feature; no cache (the heads read one feature each cycle)."""

    def __init__(self, drafter: Drafter, generator: torch.Generator | None = None):
        self.drafter, self.generator = drafter.eval(), generator
        self.required_layers = [drafter.last_layer]

    def reset(self) -> None:
        """Nothing to forget: the heads keep no state between cycles."""

    def describe(self) -> dict:
        """Kind, options and parameter count."""
        return {"kind": "medusa", **dataclasses.asdict(self.drafter.config),
                "parameters": sum(p.numel() for p in self.drafter.parameters())}

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain: head i's choice for draft position i, up to min(length, heads) tokens; or a tree."""
        if state.tokens.shape[1] < 2:
            raise DraftsmithError("Medusa heads need two committed tokens (one target feature) to draft.")
        feature = state.features[self.drafter.last_layer][0, -1]  # position T-2: its prediction is x_{T-1}
        if shape.tree is not None:
            return self.tree(feature, *shape.tree)
        tokens, probs = [], []
        for i in range(min(shape.length, self.drafter.config.num_heads)):
            logits = self.drafter.head(i, feature)
            if sampling.greedy:
                tokens.append(logits.argmax(-1).cpu())
                continue
            q = target_probs(logits[None], sampling)[0]
            tokens.append(torch.multinomial(q, 1, generator=self.generator)[0].cpu())
            probs.append(q.cpu())
        drafted = torch.stack(tokens) if tokens else state.tokens[0, :0]
        return Draft(drafted, probs=torch.stack(probs) if probs else None)

    def tree(self, feature: torch.Tensor, depth: int, top_k: int, total_tokens: int) -> Draft:
        """A sparse tree over the heads' top-k choices: node scores are the product of the heads' probabilities
        along the path (EAGLE-2's dynamic tree, `tree.dynamic_tree`); depth d's children come from head d, which
        reads the same feature whatever the parent (Medusa heads do not see the drafted tokens)."""
        depth = min(depth, self.drafter.config.num_heads)
        log_probs = [torch.log_softmax(self.drafter.head(i, feature), -1).cpu() for i in range(depth)]
        depth_of: dict[int, int] = {}

        def grow(node_ids, _tokens, parent_ids):
            depths = [1 if int(p) < 0 else depth_of[int(p)] + 1 for p in parent_ids]
            depth_of.update({int(n): d for n, d in zip(node_ids, depths)})
            return torch.stack([log_probs[d] for d in depths])  # a child of a depth-d node is head d's pick

        tokens, parents, _ = dynamic_tree(log_probs[0], grow, depth, top_k, total_tokens)
        return Draft(tokens, parents)
