"""The decode-time view of an EAGLE drafter (`draftsmith.drafters.eagle`): what the decoder calls to draft a chain
or an EAGLE-2 dynamic tree.

The proposer keeps the drafter's keys/values for committed positions only (index t made from feature f_t and
token x_{t+1}); each call crops them to what still matches `state.tokens`, runs the positions committed since,
and drafts from there, so entries made from draft hiddens are always recomputed from the target's real features.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from draftsmith.cost import OPEN_CHAIN_REACH, CutsDrafts
from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling, shared_prefix
from draftsmith.drafters.tree import TreeSlots, dynamic_tree
from draftsmith.errors import DraftsmithError
from draftsmith.sampling import target_probs

if TYPE_CHECKING:
    from draftsmith.drafters.eagle import Drafter


class EagleProposer(CutsDrafts):
    """Drafts chains or EAGLE-2 trees; keeps the drafter's keys/values for committed positions.

    With `confidence_cut` (off unless asked), a chain stops before the first step whose top draft probability no
    longer pays for its verify cost (`draftsmith.cost.StoppingRule`); that probability comes from the tokens
    drafted before the step, never from the step's own token, so sampling stays lossless."""

    longest_draft = OPEN_CHAIN_REACH

    def __init__(self, drafter: Drafter, target, generator: torch.Generator | None = None):
        self.drafter, self.target, self.generator = drafter.eval(), target, generator
        self.required_layers = list(drafter.config.layers)
        self.reset()

    def reset(self) -> None:
        """Forget the previous request."""
        self.past = None  # (keys, values) [1, kv_heads, R, d]: index t made from f_t and x_{t+1}
        self.cached = torch.zeros(0, dtype=torch.long)  # the tokens x_0..x_R those entries came from

    def describe(self) -> dict:
        trained = sum(p.numel() for p in self.drafter.parameters() if p.requires_grad)
        return {"kind": "eagle", **dataclasses.asdict(self.drafter.config),
                "draft_vocab_size": int(self.drafter.d2t.numel()), "parameters": trained, **self.describe_cut()}

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.head(hidden.to(self.target.dtype))

    @torch.no_grad()
    def _catch_up(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Crop the cache to what still matches `state`, run the new committed positions; only committed
        positions are cached, so entries made from draft hiddens are always recomputed from real features.
        Returns (output hidden [1, 1, H], next-token logits, position of the last index)."""
        tokens = state.tokens[0].cpu()
        length = tokens.numel()
        if length < 2:
            raise DraftsmithError("The EAGLE drafter needs two committed tokens (one target feature) to draft.")
        same = shared_prefix(self.cached, tokens)
        keep = max(0, min(same - 1, length - 2, 0 if self.past is None else self.past[0].shape[2]))
        device = self.drafter.d2t.device
        features = {layer: state.features[layer][:, keep : length - 1].to(device) for layer in self.required_layers}
        ids = tokens[keep + 1 :][None].to(device)
        positions = torch.arange(keep, length - 1, device=device)[None]
        n = length - 1 - keep
        if keep == 0:  # the whole prompt (a new request): causal attention without an [n, n] mask
            hidden, self.past = self.drafter.step(ids, self.drafter.fuse(features), positions, causal=True)
        else:
            past = (self.past[0][:, :, :keep], self.past[1][:, :, :keep])
            mask = torch.ones(n, keep + n, dtype=torch.bool, device=device).tril(keep)
            hidden, self.past = self.drafter.step(ids, self.drafter.fuse(features), positions, past, mask)
        self.cached = tokens.clone()
        hidden = hidden[:, -1:]
        return hidden, self.drafter.logits(hidden, self._head)[0, -1].float(), length - 2

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain of `shape.length` tokens, or an EAGLE-2 tree when `shape.tree` is set."""
        if shape.tree is not None:
            tokens, parents, _ = self.tree(state, *shape.tree)
            return Draft(tokens, parents)
        hidden, logits, position = self._catch_up(state)
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
        tokens = torch.stack(drafted).cpu() if drafted else state.tokens[0, :0]
        return Draft(tokens, probs=None if sampling.greedy or not drafted else torch.stack(probs).cpu())

    def _choose(self, logits: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next token (target id) and, when sampling, the processed distribution over the target vocabulary."""
        if sampling.greedy:
            return self.drafter.draft_ids[logits.argmax(-1)], None
        full = logits.new_full((self.drafter.t2d.numel(),), float("-inf"))
        q = target_probs(full.index_copy(0, self.drafter.draft_ids, logits)[None], sampling)[0]
        return torch.multinomial(q, 1, generator=self.generator)[0], q

    @torch.no_grad()
    def tree(self, state: DecodeState, depth: int, top_k: int, total_tokens: int):
        """EAGLE-2 dynamic tree: (tokens [n] target ids, parents [n], cumulative log-probs [n])."""
        root_hidden, logits, position = self._catch_up(state)
        slots, past = TreeSlots(), self.past
        hiddens = root_hidden  # slot s sits at s + 1; the root's output at 0
        committed = self.past[0].shape[2]

        def grow(node_ids, draft_tokens, parent_ids):
            nonlocal past, hiddens
            parent_slots, depths, sees = slots.add(node_ids, parent_ids)
            device = root_hidden.device
            parent_hidden = hiddens[:, (parent_slots + 1).to(device)]
            mask = torch.cat([torch.ones(len(node_ids), committed, dtype=torch.bool), sees], 1).to(device)
            ids = self.drafter.draft_ids[draft_tokens.to(device)][None]
            out, past = self.drafter.step(ids, parent_hidden, (position + depths.to(device))[None], past, mask)
            hiddens = torch.cat([hiddens, out], 1)
            return torch.log_softmax(self.drafter.logits(out, self._head)[0].float(), -1).cpu()

        tokens, parents, scores = dynamic_tree(torch.log_softmax(logits, -1).cpu(), grow, depth, top_k, total_tokens)
        return self.drafter.draft_ids[tokens.to(self.drafter.d2t.device)].cpu(), parents, scores
