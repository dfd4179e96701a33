"""Medusa heads (DESIGN §3 "Medusa"): extra decoding heads on the target's last hidden state.

Head i = n ResBlocks (x + SiLU(W x + b), W zero-initialised, so a fresh head starts as its projection) then
Linear(H -> V), or Linear(H -> N) over a draft vocabulary of N tokens (`token_map`: the target id of each row,
as vLLM's Medusa loads it; tokens outside it are never drafted); it reads the target's last hidden state after the final norm (what the target's lm_head
reads) at index t and predicts x_{t+2+i}. Loss sum_i 0.8^i CE_i against the target's own distribution at
t+1+i (soft labels, as EAGLE-3 trains). Weights use vLLM's Medusa names (`blocks.{h}.layers.{l}`,
`lm_heads.{h}`).

Medusa-1 (`lora_rank: 0`): the target stays frozen. Medusa-2 (`lora_rank > 0`): a copy of the target gets LoRA
adapters (peft) and trains jointly with the heads; its own next-token distribution is pulled towards the frozen
target's (a distillation term, `distill_weight`), and the heads learn at `head_lr_scale` times the rate. At
decode time that tuned copy, adapters merged, is the verifier (`proposer.verifier`): the output is exactly the
tuned target's, and the eval report says so and measures how far it drifted from the original.

Trees: validation hands the heads' held-out rank accuracies to `use_held_out`; from them a static tree (Medusa's
sparse tree) is grown best-first by expected acceptance under `tree_nodes` and written to `medusa_tree.json`;
the proposer drafts it when asked for a tree (EAGLE-2's dynamic tree until a measurement exists).

Decoding: `medusa_proposer.MedusaProposer`.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftsmith.config import build
from draftsmith.drafters import (
    ReadsTarget, load_attached, predicting_positions, read_folder, save_folder, soft_labels, target_info,
)
from draftsmith.drafters.base import DraftRows
from draftsmith.drafters.losses import LossOptions, distribution_loss
from draftsmith.drafters.medusa_proposer import MedusaProposer
from draftsmith.errors import DraftsmithError
from draftsmith.target import Target



@dataclass
class Config(LossOptions):
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
    """k of the per-head top-k accuracy metrics (topk_i, hit_i_r) and of the static tree's ranks"""
    tree_nodes: int = 64
    """node budget of the static tree grown from the held-out rank accuracies (at least num_heads)"""
    lora_rank: int = 0
    """0 = Medusa-1 (target frozen); r > 0 = Medusa-2: LoRA adapters of rank r on a copy of the target, trained jointly"""
    lora_alpha: float | None = None
    """Medusa-2: LoRA scaling alpha (default 2 * lora_rank)"""
    lora_target_modules: str | list[str] = "all-linear"
    """Medusa-2: the target's modules that get adapters (peft's target_modules; 'all-linear' = every linear layer
    but the lm_head)"""
    head_lr_scale: float = 4.0
    """Medusa-2: the heads' learning rate is train.lr times this (the adapters use train.lr)"""
    distill_weight: float = 1.0
    """Medusa-2: weight of the tuned target's cross-entropy towards the frozen target's next-token distribution"""
    confidence_cut: bool = False
    """decoding: cut each chain where the heads' confidences (their top probability) stop paying for the verify
    cost (the target's t(n) curve, measured when the drafter is loaded); false: always min(length, heads) tokens"""

    def validate(self) -> None:
        self.validate_loss()
        if self.num_heads < 1:
            raise DraftsmithError(f"drafter.num_heads must be at least 1, got {self.num_heads}.")
        if self.tree_nodes < self.num_heads:
            raise DraftsmithError(f"drafter.tree_nodes={self.tree_nodes} is smaller than drafter.num_heads="
                                  f"{self.num_heads}: the static tree could not hold one chain through every head.")
        if self.lora_rank < 0 or self.head_lr_scale <= 0 or self.distill_weight < 0:
            raise DraftsmithError("Need drafter.lora_rank >= 0, drafter.head_lr_scale > 0 and "
                                  "drafter.distill_weight >= 0.")
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


class Drafter(ReadsTarget, nn.Module):
    """Medusa heads (plus, for Medusa-2, the LoRA-tuned target copy); `forward(batch, target_head)` is the loss."""

    named = "These Medusa heads"

    def __init__(self, config: Config, hidden_size: int, vocab_size: int, num_target_layers: int, base_model=None,
                 draft_vocab_size: int | None = None):
        super().__init__()
        self.config, self.sizes = config, {"hidden_size": hidden_size, "vocab_size": vocab_size,
                                           "num_target_layers": num_target_layers, "draft_vocab_size": draft_vocab_size}
        rows = draft_vocab_size or vocab_size
        self.blocks = nn.ModuleList([nn.Module() for _ in range(config.num_heads)])
        for block in self.blocks:
            block.layers = nn.ModuleList([ResBlock(hidden_size) for _ in range(config.num_layers)])
        self.lm_heads = nn.ModuleList([nn.Linear(hidden_size, rows, bias=False) for _ in range(config.num_heads)])
        if draft_vocab_size:  # target id of each head row (vLLM's Medusa `token_map`)
            self.register_buffer("token_map", torch.arange(draft_vocab_size))
        else:
            self.token_map = None
        # held-out P(head i's rank-r choice is the target's token), set by `use_held_out`; zeros = not measured
        self.register_buffer("rank_accuracy", torch.zeros(config.num_heads, config.top_k))
        self.tuned = tuned_copy(base_model, config) if config.lora_rank else None  # Medusa-2's trained target
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

    def trained_for(self) -> dict:
        """The target's sizes these heads were made for (they read the target's frozen final norm)."""
        s = self.sizes
        return {"hidden_size": s["hidden_size"], "vocab_size": s["vocab_size"], "num_layers": s["num_target_layers"]}

    @property
    def rows(self) -> DraftRows:
        """The target token each head row drafts (`token_map` over a draft vocabulary)."""
        return DraftRows(self.token_map, self.sizes["vocab_size"])

    def head(self, i: int, last_features: torch.Tensor) -> torch.Tensor:
        """Head i's logits over the target's vocabulary [..., V] (-inf outside a draft vocabulary) from the target's
        last-layer output (its frozen final norm applied here)."""
        return self.rows.logits_to_target(self.head_rows(i, last_features))

    def head_rows(self, i: int, last_features: torch.Tensor) -> torch.Tensor:
        """Head i's logits over its own rows [..., N] (the draft vocabulary, or the whole one)."""
        if self.target is None:
            raise DraftsmithError("These Medusa heads are not attached to a target: call drafter.attach(target) first.")
        return self.head_on_normed(i, self.target.final_norm(last_features.to(self.target.dtype)))

    def head_on_normed(self, i: int, normed: torch.Tensor) -> torch.Tensor:
        """Head i's row logits from a hidden state already through the final norm (what the lm_head reads)."""
        weight = self.lm_heads[i].weight
        x = normed.to(weight.device, weight.dtype)
        for layer in self.blocks[i].layers:
            x = layer(x)
        return self.lm_heads[i](x).float()

    def forward(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """sum_i w^i CE_i against the frozen target's distribution (+ Medusa-2's distillation term); loss_i,
        acc_i (top-1), topk_i and hit_i_r (rank-r choice right) per head."""
        last = batch["features"][self.last_layer]
        loss_mask = batch["loss_mask"].bool()
        total, metrics = last.new_zeros((), dtype=torch.float32), {}
        normed = None
        if self.tuned is not None:  # Medusa-2: the heads read the tuned target's states, gradients reach the adapters
            normed, tuned_logits = self.tuned_states(batch)
            total = total + self.config.distill_weight * self.distill_loss(tuned_logits, last, loss_mask, target_head,
                                                                           metrics)
        k = self.config.top_k
        # Every head's label at t is the target's distribution at t+1+i, a position whose next token is learned:
        # compute those once for all heads, then look each head's rows up.
        labelled = predicting_positions(loss_mask)
        all_p, all_best = soft_labels(target_head, last[labelled], self.token_map)
        row_of = torch.full(loss_mask.shape, -1, dtype=torch.long, device=loss_mask.device)
        row_of[labelled] = torch.arange(labelled[0].numel(), device=loss_mask.device)
        for i in range(self.config.num_heads):
            counted = loss_mask[:, i + 2 :]  # index t predicts x_{t+2+i}
            rows = counted.nonzero(as_tuple=True)
            if rows[0].numel() == 0:
                continue
            logits = self.head_rows(i, last[rows]) if normed is None else self.head_on_normed(i, normed[rows])
            log_q = torch.log_softmax(logits, -1)
            label_rows = row_of[rows[0], rows[1] + 1 + i]
            p, best = all_p[label_rows], all_best[label_rows]
            head_loss = distribution_loss(self.config.loss, log_q, p, eta=self.config.loss_eta).mean()
            total = total + self.config.step_weight**i * head_loss
            ranked = self.rows.to_target(log_q.topk(min(k, log_q.shape[-1]), -1).indices)
            hits = (ranked == best[:, None]).float().mean(0)  # [k] rank-r hit rates
            metrics[f"loss_{i}"] = float(head_loss.detach())
            metrics[f"acc_{i}"] = float(hits[0])
            metrics[f"top{k}_{i}"] = float(hits.sum())
            metrics.update({f"hit_{i}_{r}": float(hit) for r, hit in enumerate(hits)})
        metrics["loss"] = float(total.detach())
        return total, metrics

    def tuned_states(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Medusa-2: the tuned target's final-normed last hidden states and logits over the batch."""
        out = self.tuned(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1], out.logits

    def distill_loss(self, tuned_logits, last, loss_mask, target_head, metrics: dict) -> torch.Tensor:
        """Cross-entropy of the tuned target's next-token distribution towards the frozen target's, where a next
        token is learned; `distill` and `agree` (tuned argmax = frozen argmax) go into the metrics."""
        rows = predicting_positions(loss_mask)
        log_q = torch.log_softmax(tuned_logits[rows].float(), -1)
        with torch.no_grad():
            p = torch.softmax(target_head(last[rows]).float(), -1)
        loss = -(p * log_q).sum(-1).mean()
        metrics["distill"] = float(loss.detach())
        metrics["agree"] = float((log_q.argmax(-1) == p.argmax(-1)).float().mean())
        return loss

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)

    def lr_scale(self, name: str) -> float:
        """Learning-rate multiplier of parameter `name`: Medusa-2's heads learn head_lr_scale times faster."""
        return 1.0 if self.tuned is None or name.startswith("tuned.") else self.config.head_lr_scale

    def use_held_out(self, metrics: dict) -> None:
        """Keep the held-out rank accuracies (hit_i_r) that the static tree is grown from."""
        with torch.no_grad():
            for i in range(self.config.num_heads):
                for r in range(self.config.top_k):
                    if f"hit_{i}_{r}" in metrics:
                        self.rank_accuracy[i, r] = float(metrics[f"hit_{i}_{r}"])

    def static_tree(self) -> list[tuple[int, ...]] | None:
        """The static tree (paths of ranks, parents first) grown from the measured accuracies; None before any."""
        if not bool(self.rank_accuracy.any()):
            return None
        return static_tree(self.rank_accuracy.cpu(), self.config.tree_nodes)

    # ---- saving
    def save_pretrained(self, folder: str | Path) -> None:
        """config.json (kind, options, sizes) + model.safetensors (the heads, the measured rank accuracies and,
        for Medusa-2, the LoRA adapters only: no target weights) + medusa_tree.json once a tree is measured."""
        kept = {name for name in self.state_dict() if not name.startswith("tuned.") or "lora_" in name}
        save_folder(folder, "medusa", {"config": dataclasses.asdict(self.config), **self.sizes}, self, kept)
        tree = self.static_tree()
        if tree is not None:
            accuracy = self.rank_accuracy.cpu()
            expected = [float(torch.tensor([accuracy[d, r] for d, r in enumerate(path)]).prod()) for path in tree]
            (Path(folder) / TREE_FILE).write_text(json.dumps(
                {"paths": [list(path) for path in tree], "expected_acceptance_length": 1 + sum(expected),
                 "rank_accuracy": accuracy.tolist()}, indent=1))

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Drafter:
        """Load a folder written by `save_pretrained`, attached to `target` when given (Medusa-2 needs it: its
        adapters sit on a copy of the target)."""
        meta, tensors, target_record = read_folder(folder, "medusa")
        config = build(Config, meta["config"], prefix="drafter.")
        if config.lora_rank and target is None:
            raise DraftsmithError(f"'{folder}' holds Medusa-2 heads: loading them needs their target (the LoRA "
                                  "adapters sit on a copy of it).")
        drafter = cls(config, meta["hidden_size"], meta["vocab_size"], meta["num_target_layers"],
                      target.model if config.lora_rank else None, meta.get("draft_vocab_size"))
        tensors.setdefault("rank_accuracy", drafter.rank_accuracy)  # folders written before the static tree
        missing, unexpected = drafter.load_state_dict(tensors, strict=False)
        missing = [name for name in missing if not name.startswith("tuned.") or "lora_" in name]
        if missing or unexpected:
            raise DraftsmithError(f"'{folder}' does not fit its config.json: missing {missing[:3]}, unexpected "
                                  f"{unexpected[:3]}.")
        drafter.target_info = target_record
        return drafter if target is None else drafter.attach(target)

    def proposer(self, target, generator: torch.Generator | None = None) -> MedusaProposer:
        """The decode-time view of these heads for `target`; Medusa-2 heads are attached to, and verified by, the
        tuned target with its adapters merged (`proposer.verifier`)."""
        if self.tuned is None:
            return MedusaProposer(self.attach(target), generator)
        merged = merge_tuned(self.tuned).to(target.device)
        verifier = Target(merged, target.tokenizer, name=f"{target.name} (Medusa-2 tuned)")
        proposer = MedusaProposer(self.attach(verifier), generator)
        proposer.verifier = verifier
        return proposer


TREE_FILE = "medusa_tree.json"


def static_tree(rank_accuracy: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
    """Medusa's sparse tree: nodes are rank paths (r_1..r_d), node (r_1..r_d) drafts head d-1's rank-r_d choice
    under its parent. A node's expected acceptance is prod_j a[j, r_j] (heads taken as independent); the tree with
    the most expected accepted tokens under `budget` nodes is the `budget` best nodes, grown best-first (a child
    never beats its parent, so the best nodes form a tree). Returned in that order: parents before children, and
    any prefix is itself the best tree of its size."""
    heads, ranks = rank_accuracy.shape
    frontier = [(-float(rank_accuracy[0, r]), (r,)) for r in range(ranks)]
    heapq.heapify(frontier)
    tree = []
    while frontier and len(tree) < budget:
        score, path = heapq.heappop(frontier)
        tree.append(path)
        if len(path) < heads:
            for r in range(ranks):
                heapq.heappush(frontier, (score * float(rank_accuracy[len(path), r]), path + (r,)))
    return tree


def tuned_copy(base_model, config: Config):
    """Medusa-2's trained target: a copy of `base_model` with LoRA adapters (peft); its own weights stay frozen."""
    if base_model is None:
        raise DraftsmithError("Medusa-2 (drafter.lora_rank > 0) needs the target model to copy and adapt.")
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha or 2 * config.lora_rank, lora_dropout=0.0,
                      target_modules=config.lora_target_modules, bias="none")
    try:
        return get_peft_model(copy.deepcopy(base_model), lora)
    except (ValueError, TypeError) as err:
        raise DraftsmithError(f"peft cannot add LoRA adapters to this target with drafter.lora_target_modules="
                              f"{config.lora_target_modules!r}: {err}") from None


def merge_tuned(tuned) -> nn.Module:
    """A plain transformers model: a copy of the tuned target with its adapters merged into the weights."""
    return copy.deepcopy(tuned).merge_and_unload().eval()


# --------------------------------------------------------------------------- building
def create(config: Config, target, draft_vocab=None) -> Drafter:
    """Fresh Medusa heads for `target`, projections copied from its lm_head when `init_from_target`; Medusa-2 also
    gets its adapter-wrapped copy of the target (peft starts the adapters at zero: the copy equals the target)."""
    config = dataclasses.replace(config)
    config.validate()
    token_map = None if draft_vocab is None else draft_vocab.target_ids().long()
    drafter = Drafter(config, target.hidden_size, target.vocab_size, target.num_layers,
                      target.model if config.lora_rank else None,
                      None if token_map is None else token_map.numel()).to(target.device)
    drafter.target_info = target_info(target)
    drafter.attach(target)
    with torch.no_grad():
        if token_map is not None:
            drafter.token_map.copy_(token_map)
        if config.init_from_target:
            weight = target.model.get_output_embeddings().weight.float()
            for head in drafter.lm_heads:
                head.weight.copy_(weight if token_map is None else weight[token_map.to(weight.device)])
    return drafter


def load_proposer(folder: str | Path, target) -> MedusaProposer:
    """A saved Medusa folder as a Proposer for `target` (Medusa-2: verified by the tuned target)."""
    drafter = load_attached(Drafter, folder, target)
    proposer = drafter.proposer(target)
    drafter.tuned = None  # decoding needs only the merged verifier, not the adapter-wrapped copy
    return proposer
