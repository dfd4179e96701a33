"""The EAGLE drafter's training (`draftsmith.drafters.eagle`): training-time test over k steps and its loss.

Step 0 reads fc(features) at every index; step j >= 1 reads the drafter's own step-(j-1) output at the same index
(EAGLE-3), or a mask token and the learned mask hidden (P-EAGLE), at position t + j; a query at step j, index t sees
step 0's keys causally and its own earlier steps' keys at index t only. The loss is sum_j step_weight^j loss_j
against the target's distribution restricted to the draft vocabulary (EAGLE-1: plus feature regression). COD
sampling trains the later steps on nested shares of the indices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import repeat_kv

from draftsmith.drafters import predicting_positions, soft_labels, stored_soft_labels
from draftsmith.drafters.eagle_layers import ttt_attention
from draftsmith.drafters.losses import distribution_loss
from draftsmith.errors import DraftsmithError


class TrainingTimeTest:
    """The training half of `eagle.Drafter` (mixed into it): `forward(batch, target_head)` is the training loss, so
    DDP wraps it. Reads the drafter's config, layers and the pieces it shares with decoding (`fuse`, `mask_inputs`,
    `inputs`, `output`, `logits`, `draft_ids`, `t2d`)."""

    def ttt_forward(self, input_ids, features, attention_mask=None, steps=None, at=None, widths=None
                    ) -> list[torch.Tensor]:
        """Training-time test: the output hidden of every step (step j at index t = position t + j), [B, S, H],
        or [B, A, H] at the indices `at` [B, A] only; with `widths` (one per step, not rising), step j runs at the
        first widths[j] of `at` only ([B, widths[j], H]: COD sampling, `at` in a random order). Step 0's keys and
        values cover every index (any query may attend to them; with more than one layer, the layers below the last
        run step 0 at every index for the keys above them); everything else, the last layer's MLP included, runs
        only where it is asked for.
        Step j reads token x_{t+1+j} and step j-1's output (EAGLE-3), or the mask token and mask hidden (P-EAGLE:
        so no step's input depends on another's output, and at decode time they are rows of one forward)."""
        steps = steps or self.config.ttt_steps
        batch, length = input_ids.shape
        hidden = self.fuse(features)
        if not self.eagle3 and self.training and self.config.feature_noise > 0:
            hidden = hidden + (torch.rand_like(hidden) * 2 - 1) * self.config.feature_noise
        index = torch.arange(length, device=input_ids.device)
        every = index.expand(batch, length)
        at = every if at is None else at

        def seen_from(rows):  # step-0 keys: causal, padding hidden (a query always sees itself: no row is empty)
            sees = index[None, None, :] <= rows[:, :, None]
            if attention_mask is not None:
                sees = sees & (attention_mask[:, None, :].bool() | (index[None, None, :] == rows[:, :, None]))
            return sees[:, None]

        sees, last = seen_from(at), len(self.layers) - 1
        sees_every = seen_from(every) if last else None
        ahead = torch.zeros_like(input_ids)
        keys, values, outputs = [[] for _ in self.layers], [[] for _ in self.layers], []
        groups = self.layers[0].kv_groups
        for j in range(steps):
            ahead.zero_()
            ahead[:, : max(length - 1 - j, 0)] = input_ids[:, 1 + j :]  # x_{t+1+j}; beyond the end: unused
            width = at.shape[1] if widths is None or j == 0 else widths[j]  # a prefix of `at`: later steps fewer
            here = at[:, :width]
            if j == 0:
                ids, positions = ahead, every
            elif self.parallel:
                (ids, hidden), positions = self.mask_inputs(here), here + j
            else:
                ids, positions, hidden = ahead.gather(1, here), here + j, hidden[:, :width]
            embeds, hidden, (cos, sin) = self.inputs(ids, hidden, positions)
            for i, layer in enumerate(self.layers):
                q, k, v, residual = layer.project(embeds, hidden, cos, sin)
                keys[i].append(repeat_kv(k, groups))
                values[i].append(repeat_kv(v, groups))
                if j == 0 and i < last:  # every index: the next layer's step-0 keys come from this output
                    hidden = layer.finish(ttt_attention(q, keys[i], values[i], sees_every), residual)
                    continue
                if j == 0 and at is not every:
                    q = q.gather(2, at[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1]))
                    residual = residual.gather(1, at[..., None].expand(-1, -1, residual.shape[-1]))
                step_keys = [keys[i][0], *(key[:, :, :width] for key in keys[i][1:])]
                step_values = [values[i][0], *(value[:, :, :width] for value in values[i][1:])]
                hidden = layer.finish(ttt_attention(q, step_keys, step_values, sees[:, :, :width]), residual)
            hidden = self.output(hidden)
            outputs.append(hidden)
        return outputs

    def forward(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """Training loss Σ_j step_weight^j loss_j and metrics (loss_j, acc_j: per-step top-1 accuracy).

        Only indices that lead to a learned token run past step 0's keys, and the head, the loss and the
        accuracy run only where the predicted token is learned (most of a conversation is prompt): the same
        loss and gradients as over every index with the others masked out, for a fraction of the work."""
        features = {int(layer): value for layer, value in batch["features"].items()}
        loss_mask = batch["loss_mask"].bool()
        length, steps = loss_mask.shape[1], self.config.ttt_steps
        at, kept = _indices_leading_to(loss_mask, steps)
        widths, counted = None, None
        if self.training and self.config.cod_ratio < 1:
            at, counted, widths = self._cod_sample(at, kept, batch)
        outputs = self.ttt_forward(batch["input_ids"], features, batch.get("attention_mask"), at=at, widths=widths)
        last = features[self.last_layer]
        labelled = predicting_positions(loss_mask)  # positions s whose next token is learned
        stored = {key: value[labelled] for key, value in batch["target_topk"].items()} if "target_topk" in batch else None
        target_ids, target_p = self._training_targets(last[labelled], target_head, stored)
        label_of = torch.full(loss_mask.shape, -1, dtype=torch.long, device=last.device)
        label_of[labelled] = torch.arange(labelled[0].numel(), device=last.device)
        total, metrics = target_p.new_zeros(()), {}
        for j, hidden in enumerate(outputs):
            if length - 2 - j <= 0:  # no index t predicts a token x_{t+2+j} inside the sequence
                break
            here = at[:, : hidden.shape[1]]  # the indices step j ran at, and those it learns from
            real = kept[:, : hidden.shape[1]] if counted is None else counted[j]
            ahead = here + 2 + j
            learned = real & (ahead < length) & loss_mask.gather(1, ahead.clamp(max=length - 1))
            rows, slots = learned.nonzero(as_tuple=True)
            seen = here[rows, slots] + 1 + j  # the target's position t+1+j, whose distribution is learned
            label = label_of[rows, seen]
            logits = self.logits(hidden[rows, slots], target_head).float()
            step_loss = distribution_loss(self.config.loss, torch.log_softmax(logits, -1), target_p[label],
                                          eta=self.config.loss_eta)
            if not self.eagle3:
                regression = F.smooth_l1_loss(hidden[rows, slots].float(), last[rows, seen].float(),
                                              reduction="none").mean(-1)
                step_loss = regression + self.config.token_loss_weight * step_loss
            step_loss = _masked_mean(step_loss, self.t2d[target_ids[label]])  # the target's choice is draftable
            total = total + self.config.step_weight**j * step_loss
            guess = self.draft_ids[logits.argmax(-1)]
            metrics[f"loss_{j}"] = float(step_loss.detach())
            metrics[f"acc_{j}"] = float((guess == target_ids[label]).float().mean()) if label.numel() else 0.0
        metrics["loss"] = float(total.detach())
        return total, metrics

    def _cod_sample(self, at: torch.Tensor, kept: torch.Tensor, batch: dict
                    ) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        """COD sampling: `at` [B, A] put in a random order, a row's real indices (`kept`) first, and for each step j
        which of them it learns from ([B, width_j]: in each row the first ceil(real * share_j) of them, share_j =
        max(cod_ratio^j, cod_ratio_min), so each step's are inside the step before's) and how far into `at` it runs
        (width_j: the most any row learns from). Seeded by the batch's tokens and its place in the training stream
        (a resumed run draws the same)."""
        draw = batch.get("micro_batch")
        seed = int(batch["input_ids"].sum()) + (0 if draw is None else 998_244_353 * (int(draw) + 1))
        noise = torch.rand(at.shape, generator=torch.Generator().manual_seed(seed)).to(at.device)
        order = torch.argsort(noise - kept.to(noise.dtype), dim=1)  # real indices (noise - 1 < 0) first
        real = kept.sum(1, keepdim=True)
        rank = torch.arange(at.shape[1], device=at.device)[None]
        counted, widths = [], []
        for j in range(self.config.ttt_steps):
            share = max(self.config.cod_ratio**j, self.config.cod_ratio_min)
            learns = rank < torch.ceil(real * share)
            widths.append(max(int(learns.sum(1).max()), 1))
            counted.append(learns[:, : widths[-1]])
        return at.gather(1, order), counted, widths

    @torch.no_grad()
    def _training_targets(self, last: torch.Tensor, target_head, stored: dict | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """At last-layer features `last` [n, H]: the target's argmax over its whole vocabulary [n] and its
        distribution restricted to the draft vocabulary (all of it for EAGLE-1) and renormalised [n, N].
        `stored`: the target's top-k logits captured at those positions ({"values", "indices"} [n, k]): the
        first index is the argmax (no pass over the rest of the vocabulary), and with labels=topk the
        distribution comes from them alone."""
        if self.config.labels == "topk":
            if stored is None:
                raise DraftsmithError("eagle: labels=topk trains on the target's top-k logits stored with the features; "
                                      "capture them (recipes: data.topk_logits: K; `draftsmith capture --topk-logits K`).")
            p, argmax = stored_soft_labels(stored["values"], stored["indices"], self.draft_ids)
            return argmax, p
        argmax = None if stored is None else stored["indices"][:, 0].long()
        p, argmax = soft_labels(target_head, last, self.draft_ids, argmax)
        return argmax, p

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)


def _indices_leading_to(loss_mask: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The indices t of each row whose TTT chain predicts a learned token (x_{t+2+j} for some j < steps), in
    order and padded to the longest row: (indices [B, A], which of them are real [B, A])."""
    batch, length = loss_mask.shape
    needed = torch.zeros_like(loss_mask)
    for j in range(min(steps, max(length - 2, 0))):
        needed[:, : length - 2 - j] |= loss_mask[:, 2 + j :]
    counts = needed.sum(1)
    width = max(int(counts.max()), 1) if batch else 1
    order = torch.sort((~needed).to(torch.uint8), dim=1, stable=True).indices[:, :width]
    return order, torch.arange(width, device=order.device)[None, :] < counts[:, None]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
