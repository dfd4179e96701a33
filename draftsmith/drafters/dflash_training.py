"""The DFlash drafter's training (`draftsmith.drafters.dflash`): blocks at sampled anchors and their loss.

Anchors a are drawn inside loss-masked spans (seeded, so a resumed run draws the same); the block at a is
[x_a, MASK x (B-1)], seeing the context strictly before a and itself, all blocks of a sequence in one forward under
one of three attentions (`Config.attention`). Block position k learns the target's distribution at a+k-1 with weight
w_k (fixed decay, or D-PACE's from the drafter's own confidence); DSpark adds its Markov bias and confidence BCE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.drafters import soft_labels
from draftsmith.drafters.dflash_layers import BlockLayout, block_attention_mask, flex_block_mask
from draftsmith.drafters.losses import distribution_loss
from draftsmith.errors import DraftsmithError

MAX_ANCHORS = 512
"""blocks per sequence at most with `anchors_per_sequence: 0` (the speculators trainer's max_anchors)"""


class BlockTraining:
    """The training half of `dflash.Drafter` (mixed into it): `forward(batch, target_head)` is the training loss, so
    DDP wraps it. Reads the drafter's config, mask id, sizes and the pieces it shares with decoding (`context_kv`,
    `blocks`, `logits`, `markov`, `rows`, `draft_ids`)."""

    def block_hidden(self, input_ids, features, anchors: torch.Tensor) -> torch.Tensor:
        """Hiddens [b, N, B, H] of the blocks at `anchors` [b, N], each seeing the context before its anchor."""
        (b, length), size = input_ids.shape, self.config.block_size
        block = torch.full((b, anchors.shape[1], size), self.mask_token_id, dtype=torch.long, device=input_ids.device)
        block[..., 0] = input_ids.gather(1, anchors)
        positions = (anchors[..., None] + torch.arange(size, device=anchors.device)).flatten(1)
        rule = self.attention_rule(anchors.device)
        mask = (BlockLayout(anchors, length, size) if rule == "blockwise" else
                (flex_block_mask if rule == "flex" else block_attention_mask)(anchors, length, size))
        hidden = self.blocks(block.flatten(1), positions, self.context_kv(features, 0, length), mask)
        return hidden.view(b, anchors.shape[1], size, -1)

    def attention_rule(self, device: torch.device) -> str:
        """How training attention runs here: flex, sdpa or blockwise (see `Config.attention`)."""
        if self.config.attention == "auto":
            return "flex" if device.type == "cuda" else "blockwise"
        if self.config.attention == "flex" and device.type == "cpu" and torch.is_grad_enabled():
            raise DraftsmithError("drafter.attention=flex: torch has no flex_attention backward on a CPU, so it cannot "
                                  "train here; use auto, blockwise or sdpa.")
        return self.config.attention
    def sample_anchors(self, input_ids, loss_mask, sample_ids=None, draw: int | None = None,
                       every: bool = False) -> torch.Tensor:
        """[b, N] anchors a >= 1 whose first label x_{a+1} is loss-masked, drawn without replacement; -1 = none.
        Seeded by anchor_seed, the batch's sample ids (its tokens when there are none) and `draw` (the micro-batch's
        index in the training stream, for fresh anchors; None: the same anchors whenever these samples come).
        `every` (or anchors_per_sequence 0): every allowed anchor, up to MAX_ANCHORS per sequence."""
        key = sample_ids if sample_ids is not None else input_ids
        seed = self.config.anchor_seed * 1_000_003 + int(key.sum()) + (0 if draw is None else 998_244_353 * (draw + 1))
        generator = torch.Generator().manual_seed(seed)
        allowed = torch.zeros_like(loss_mask, dtype=torch.bool, device="cpu")
        allowed[:, 1:-1] = loss_mask[:, 2:].bool().cpu()
        count = 0 if every else self.config.anchors_per_sequence
        count = count or min(MAX_ANCHORS, max(int(allowed.sum(1).max()), 1))
        anchors = torch.full((loss_mask.shape[0], count), -1, dtype=torch.long)
        for row in range(loss_mask.shape[0]):
            where = allowed[row].nonzero().flatten()
            chosen = where[torch.randperm(where.numel(), generator=generator)[: anchors.shape[1]]]
            anchors[row, : chosen.numel()] = chosen.sort().values
        return anchors.to(loss_mask.device)

    def forward(self, batch: dict, target_head, anchors: torch.Tensor | None = None):
        """sum_k mean over blocks of w_k loss_k against the target's distribution at a+k-1 (w_k fixed, or D-PACE's
        per block); loss_j / acc_j for block position k = j+1. In eval mode (validation) every allowed block counts:
        a few drawn blocks per sequence measure each position's accuracy too noisily to rank positions or runs."""
        ids, loss_mask = batch["input_ids"], batch["loss_mask"].bool()
        if anchors is None:
            draw = batch.get("micro_batch") if self.config.fresh_anchors else None
            anchors = self.sample_anchors(ids, loss_mask, batch.get("sample_ids"), draw, every=not self.training)
        hidden = self.block_hidden(ids, batch["features"], anchors.clamp(min=0))
        labels = self._labels(batch, target_head, anchors)
        total, metrics, pieces = hidden.new_zeros((), dtype=torch.float32), {}, []
        for k, weight in enumerate(self.config.position_weights(), start=1):
            label_at, counted = self.counted(anchors, loss_mask, k)
            rows = counted.nonzero(as_tuple=True)
            if rows[0].numel() == 0:
                continue
            at = hidden[rows[0], rows[1], k]
            logits = self.logits(at)
            if self.dspark:  # the block token before k: the anchor, then the data's tokens (teacher forcing)
                bias, confidence = self.markov(at, ids[rows[0], label_at[rows] - 1])
                logits = logits + bias
            log_q = torch.log_softmax(logits, -1)
            p, best = labels(rows[0], label_at[rows] - 1)
            element = distribution_loss(self.config.loss, log_q, p, eta=self.config.loss_eta)
            position_loss = element.mean()
            pieces.append((k, rows, element, weight, -(p * log_q.detach()).sum(-1)))
            matched = (self.rows.to_target(log_q.argmax(-1)) == best).float()
            metrics[f"loss_{k - 1}"] = float(position_loss.detach())
            metrics[f"acc_{k - 1}"] = float(matched.mean())
            if self.dspark:
                bce = F.binary_cross_entropy_with_logits(confidence, matched)
                total = total + self.config.confidence_weight * bce
                metrics[f"confidence_loss_{k - 1}"] = float(bce.detach())
                metrics[f"confidence_{k - 1}"] = float(torch.sigmoid(confidence.detach()).mean())
        for (k, rows, element, weight, _), weights in zip(pieces, self._dpace_weights(pieces, anchors.shape)):
            total = total + (element * (weight if weights is None else weights)).mean()
        metrics["loss"] = float(total.detach())
        return total, metrics

    @staticmethod
    def counted(anchors: torch.Tensor, loss_mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a + k, whether block position k of the block at a counts) for anchors [b, N] (-1: unused) and a boolean
        loss mask [b, S]: it counts when the block is used and the token it predicts, x_{a+k}, is learned."""
        length = loss_mask.shape[1]
        at = anchors.clamp(min=0) + k
        return at, (anchors >= 0) & (at < length) & loss_mask.gather(1, at.clamp(max=length - 1))

    @torch.no_grad()
    def _labels(self, batch: dict, target_head, anchors: torch.Tensor):
        """A lookup (rows, positions) -> (the target's distribution at those positions, over the head's rows, and its
        argmax): computed once per position that some block learns from, since the blocks of nearby anchors share
        most of them (the distribution is renormalised over a draft vocabulary's rows)."""
        ids, loss_mask = batch["input_ids"], batch["loss_mask"].bool()
        needed = torch.zeros_like(loss_mask)
        for k in range(1, self.config.block_size):
            at, learned = self.counted(anchors, loss_mask, k)
            rows = learned.nonzero(as_tuple=True)
            needed[rows[0], at[rows] - 1] = True
        where = needed.nonzero(as_tuple=True)
        slot = torch.full(ids.shape, -1, dtype=torch.long, device=ids.device)
        slot[where] = torch.arange(where[0].numel(), device=ids.device)
        last = batch["features"][self.sizes["num_target_layers"] - 1]
        p, best = soft_labels(target_head, last[where], self.draft_ids)
        return lambda rows, positions: (p[slot[rows, positions]], best[slot[rows, positions]])

    @torch.no_grad()
    def _dpace_weights(self, pieces: list, shape: torch.Size) -> list[torch.Tensor | None]:
        """Per piece (block position k, its blocks), D-PACE's weight of each block there; None with fixed weights."""
        if self.config.position_weighting != "dpace":
            return [None] * len(pieces)
        alpha = self.config.dpace_alpha
        smooth = torch.ones(*shape, self.config.block_size - 1)  # uncounted positions multiply by 1
        counted = torch.zeros_like(smooth)
        for k, rows, _, _, cross_entropy in pieces:
            smooth[rows[0].cpu(), rows[1].cpu(), k - 1] = (1 - alpha) * torch.exp(-cross_entropy.float().cpu()) + alpha
            counted[rows[0].cpu(), rows[1].cpu(), k - 1] = 1.0
        reach = torch.cumprod(smooth, -1) * counted  # the smoothed chance an accepted run gets through position j
        weights = reach.flip(-1).cumsum(-1).flip(-1)  # what all counted positions from k on are worth
        return [weights[rows[0].cpu(), rows[1].cpu(), k - 1].to(element.device) for k, rows, element, _, _ in pieces]

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)
