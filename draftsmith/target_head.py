"""The target's head: its frozen final norm and lm_head, applied to the output of its last decoder layer
(`Target.head`), and the draft targets a reduced-vocabulary drafter trains on."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class HeadOwner(Protocol):
    """What the head reads of its target (`draftsmith.target.Target` is one): the model, whose output embedding is
    the lm_head, the final norm, and the block in which a sharded target's head is whole."""

    model: nn.Module

    @property
    def final_norm(self) -> nn.Module: ...

    def gathered(self) -> AbstractContextManager: ...


class TargetHead:
    """The target's final norm and lm_head, applied to the output of its last decoder layer.

    Calling it gives logits over the whole vocabulary; `draft_targets` gives what a reduced-vocabulary
    drafter trains on (logits over its rows and the full-vocabulary argmax) without ever holding
    [positions, vocabulary] logits: on a large vocabulary that is most of a training step's memory."""

    CHUNK = 16384  # vocabulary rows per matmul when the whole vocabulary's argmax is needed

    def __init__(self, target: HeadOwner):
        self.target = target

    def __call__(self, last_layer_features: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary, in the target's dtype, whatever dtype the features arrive in."""
        with self.target.gathered():
            head = self.target.model.get_output_embeddings()
            return head(self.target.final_norm(last_layer_features.to(head.weight.dtype)))

    @torch.no_grad()
    def draft_targets(self, last_layer_features: torch.Tensor, ids: torch.Tensor,
                      argmax: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits over vocabulary rows `ids` [..., N], argmax over the whole vocabulary [...] or None when
        `argmax` is false: then only the N rows are computed).

        The argmax runs over contiguous slices of the head's weight, which give the `ids` columns on the way:
        no copy of the vocabulary's rows is gathered, and no row is multiplied twice."""
        with self.target.gathered():
            return self._draft_targets(last_layer_features, ids, argmax)

    def _draft_targets(self, last_layer_features: torch.Tensor, ids: torch.Tensor,
                       argmax: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        head = self.target.model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        # Features come in their storage dtype (bf16 shards, fp8 read back as bf16); some norms (Gemma, OLMo-2)
        # return their input's dtype, so the head would see bf16 against its own fp32 weight.
        hidden = self.target.final_norm(last_layer_features.to(weight.dtype))
        if not argmax:
            return F.linear(hidden, weight[ids], None if bias is None else bias[ids]), None
        logits = best = found = None
        for start in range(0, weight.shape[0], self.CHUNK):
            end = min(start + self.CHUNK, weight.shape[0])
            part = F.linear(hidden, weight[start:end], None if bias is None else bias[start:end])
            if logits is None:
                logits = part.new_empty(*part.shape[:-1], ids.numel())
            inside = (ids >= start) & (ids < end)
            logits[..., inside] = part[..., ids[inside] - start]
            value, index = part.max(-1)
            if best is None:
                best, found = value, index
            else:  # strictly greater: ties keep the lower id, as an argmax over the whole row does
                better = value > best
                best, found = torch.where(better, value, best), torch.where(better, index + start, found)
        return logits, found
