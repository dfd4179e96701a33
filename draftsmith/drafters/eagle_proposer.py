"""The decode-time view of an EAGLE drafter (`draftsmith.drafters.eagle`): what the decoder calls to draft a chain
or an EAGLE-2 dynamic tree; for P-EAGLE, every draft position as a row of the one forward that also catches up.

The proposer keeps the drafter's keys/values for committed positions only (index t made from feature f_t and
token x_{t+1}); each call crops them to what still matches `state.tokens`, runs the positions committed since,
and drafts from there, so entries made from draft hiddens are always recomputed from the target's real features.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.drafters.base import (
    OPEN_CHAIN_REACH, CachedProposer, CutsDrafts, DraftRows, cache_length, chain, crop, draw, feature_tokens,
)
from draftsmith.drafters.tree import TreeSlots, dynamic_tree, per_position_tree


class StepDrafter(Protocol):
    """What the proposer reads of an EAGLE drafter (`draftsmith.drafters.eagle.Drafter`, which builds its proposer:
    named here by this shape, so the two files do not import each other)."""

    config: Any  # the kind's Config (a dataclass): layers, ttt_steps
    d2t: torch.Tensor  # draft row i drafts target id i + d2t[i]

    @property
    def rows(self) -> DraftRows: ...

    def eval(self) -> StepDrafter: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def fuse(self, features: dict[int, torch.Tensor]) -> torch.Tensor: ...

    def mask_inputs(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def step(self, ids, hidden, positions, past=None, mask=None, causal: bool = False): ...

    def logits(self, hidden: torch.Tensor, target_head) -> torch.Tensor: ...


class EagleProposer(CutsDrafts, CachedProposer):
    """Drafts chains or EAGLE-2 trees; keeps the drafter's keys/values for committed positions.

    With `confidence_cut` (off unless asked), a chain stops before the first step whose top draft probability no
    longer pays for its verify cost (`draftsmith.cost.StoppingRule`); that probability comes from the tokens
    drafted before the step, never from the step's own token, so sampling stays lossless."""

    longest_draft = OPEN_CHAIN_REACH

    def __init__(self, drafter: StepDrafter, target, generator: torch.Generator | None = None):
        self.drafter, self.target, self.generator = drafter.eval(), target, generator
        self.required_layers = list(drafter.config.layers)
        self.reset()

    def reset(self) -> None:
        """Forget the previous request."""
        self.past = None  # per layer (keys, values) [1, kv_heads, R, d]: index t made from f_t and x_{t+1}
        self.forget_cache()  # `cached`: the tokens x_0..x_R those entries came from
        self.mask_row = None  # P-EAGLE: (mask token id [1, 1], fused mask hidden [1, 1, H]), made once per request
        self.rows = self.drafter.rows  # the target id each draft-vocabulary entry drafts

    def describe(self) -> dict:
        trained = sum(p.numel() for p in self.drafter.parameters() if p.requires_grad)
        return {"kind": "eagle", **dataclasses.asdict(self.drafter.config),
                "draft_vocab_size": int(self.drafter.d2t.numel()), "parameters": trained, **self.describe_cut()}

    def networks(self) -> list[nn.Module]:
        return [self.drafter]

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.head(hidden.to(self.target.dtype))

    @torch.no_grad()
    def _catch_up(self, state: DecodeState, ahead: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Crop the cache to what still matches `state`, run the new committed positions; only committed
        positions are cached, so entries made from draft hiddens are always recomputed from real features.
        `ahead` (P-EAGLE): also run that many mask rows after them, in the same forward (each sees every
        committed position and the mask rows before it; their keys are not cached).
        Returns (output hidden [1, 1 + ahead, H], their logits [1 + ahead, N], position of the last index)."""
        tokens = feature_tokens(state, "The EAGLE drafter")
        length = tokens.numel()
        keep = self.reusable(tokens, 0 if self.past is None else cache_length(self.past), lookahead=1, limit=length - 2)
        device = self.drafter.d2t.device
        features = {layer: state.features[layer][:, keep : length - 1].to(device) for layer in self.required_layers}
        ids = tokens[keep + 1 :][None].to(device)
        positions = torch.arange(keep, length - 1, device=device)[None]
        hidden = self.drafter.fuse(features)
        if ahead:  # mask rows at the next positions: causal order is exactly what each may see
            if self.mask_row is None:  # the same inputs on every pass: fused once, not once per pass
                mask_id, mask_hidden = self.drafter.mask_inputs(torch.zeros(1, 1, dtype=torch.long, device=device))
                self.mask_row = mask_id, mask_hidden.to(hidden.dtype)
            mask_id, mask_hidden = self.mask_row
            ids = torch.cat([ids, mask_id.expand(1, ahead)], 1)
            hidden = torch.cat([hidden, mask_hidden.expand(1, ahead, -1)], 1)
            positions = torch.arange(keep, length - 1 + ahead, device=device)[None]
        n = ids.shape[1]
        if keep == 0:  # the whole prompt (a new request): causal attention without an [n, n] mask
            hidden, past = self.drafter.step(ids, hidden, positions, causal=True)
        else:
            past = crop(self.past, keep)
            mask = torch.ones(n, keep + n, dtype=torch.bool, device=device).tril(keep)
            hidden, past = self.drafter.step(ids, hidden, positions, past, mask)
        committed = length - 1
        self.past = crop(past, committed) if ahead else past
        self.cached = tokens.clone()
        hidden = hidden[:, -1 - ahead:]
        return hidden, self.drafter.logits(hidden, self._head)[0].float(), length - 2

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain of `shape.length` tokens, or an EAGLE-2 tree when `shape.tree` is set."""
        if shape.tree is not None:
            tokens, parents, _ = self.tree(state, *shape.tree)
            return Draft(tokens, parents)
        hidden, logits, position = self._catch_up(state)
        logits = logits[-1]
        past, drafted, probs = self.past, [], []
        rule = self.stopping_rule(shape.length)
        for i in range(shape.length):
            if rule is not None and not rule.keep_step(logits):
                break
            token, q = self._choose(logits, sampling)
            drafted.append(token)
            probs.append(q)
            if i + 1 == shape.length:
                break
            pos = torch.tensor([[position + 1 + i]], device=token.device)
            hidden, past = self.drafter.step(token.view(1, 1), hidden, pos, past)
            logits = self.drafter.logits(hidden, self._head)[0, -1].float()
        return chain(drafted, probs, state)

    def _choose(self, logits: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next token (target id) and, when sampling, the processed distribution over the target vocabulary."""
        return draw(logits, sampling, self.generator, self.rows)

    @torch.no_grad()
    def tree(self, state: DecodeState, depth: int, top_k: int, total_tokens: int):
        """EAGLE-2 dynamic tree: (tokens [n] target ids, parents [n], cumulative log-probs [n])."""
        root_hidden, logits, position = self._catch_up(state)
        logits = logits[-1]
        slots, past = TreeSlots(), self.past
        hiddens = root_hidden  # slot s sits at s + 1; the root's output at 0
        committed = cache_length(self.past)

        def grow(node_ids, draft_tokens, parent_ids):
            nonlocal past, hiddens
            parent_slots, depths, sees = slots.add(node_ids, parent_ids)
            device = root_hidden.device
            parent_hidden = hiddens[:, (parent_slots + 1).to(device)]
            mask = torch.cat([torch.ones(len(node_ids), committed, dtype=torch.bool), sees], 1).to(device)
            ids = self.rows.to_target(draft_tokens.to(device))[None]
            out, past = self.drafter.step(ids, parent_hidden, (position + depths.to(device))[None], past, mask)
            hiddens = torch.cat([hiddens, out], 1)
            return torch.log_softmax(self.drafter.logits(out, self._head)[0].float(), -1).cpu()

        tokens, parents, scores = dynamic_tree(torch.log_softmax(logits, -1).cpu(), grow, depth, top_k, total_tokens)
        return self.rows.to_target(tokens), parents, scores


class ParallelEagleProposer(EagleProposer):
    """P-EAGLE: a chain of k tokens (or a tree of depth k) from one drafter forward per verify pass, which runs the
    positions committed since the last pass and k - 1 mask rows after them. Position j's distribution does not
    depend on the tokens drafted before it, so a tree is built from the k distributions, as for Medusa heads."""

    drafts_in_one_forward = True  # any chain length is one forward (drafters.fallback charges it per call)

    def __init__(self, drafter: StepDrafter, target, generator: torch.Generator | None = None):
        super().__init__(drafter, target, generator)
        self.longest_draft = drafter.config.ttt_steps  # the positions it was trained to draft

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        if shape.tree is not None:
            tokens, parents, _ = self.tree(state, *shape.tree)
            return Draft(tokens, parents)
        length = min(shape.length, self.longest_draft)
        if length < 1:
            return Draft(state.tokens[0, :0])
        _, logits, _ = self._catch_up(state, ahead=length - 1)
        rule = self.stopping_rule(length)
        if sampling.greedy and rule is None:  # every position's argmax at once: they do not depend on each other
            return Draft(self.rows.to_target(logits.argmax(-1)).cpu())
        drafted, probs = [], []
        for step_logits in logits:
            if rule is not None and not rule.keep_step(step_logits):
                break
            token, q = self._choose(step_logits, sampling)
            drafted.append(token)
            probs.append(q)
        return chain(drafted, probs, state)

    @torch.no_grad()
    def tree(self, state: DecodeState, depth: int, top_k: int, total_tokens: int):
        """EAGLE-2's dynamic tree over the k per-position distributions: a child of a depth-d node is one of
        position d's top tokens, whatever its parent. (tokens [n] target ids, parents [n], scores [n])."""
        depth = min(depth, self.longest_draft)
        _, logits, _ = self._catch_up(state, ahead=max(depth, 1) - 1)
        tokens, parents, scores = per_position_tree(torch.log_softmax(logits, -1).cpu(), depth, top_k, total_tokens)
        return self.rows.to_target(tokens), parents, scores
