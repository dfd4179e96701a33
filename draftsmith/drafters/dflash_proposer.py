"""The decode-time view of a DFlash / DSpark drafter (`draftsmith.drafters.dflash`): what the decoder calls to
draft a block.

`DecodeState.features` hold the target's features at committed positions 0..T-2, so the block sits at the last
committed token T-1 and the context covers positions < T-1, exactly the training layout. Context keys/values
depend on c only (not on the block), so the proposer caches them per layer and rolls them back by comparing its
tokens with `state.tokens`.

Both cut the block by `draftsmith.cost.StoppingRule` read off the verify-cost curve t(n): position k is drafted only
if, projecting its own confidence onto the positions after it, some length >= k gives more expected tokens per
unit of verify cost than stopping before k. DSpark's confidence is its confidence head's, and it walks the block
left to right, adding at each position the Markov bias of the token drafted before it; DFlash's is the top
probability of position k's distribution (DSpark's cut generalised: what EAGLE, MTP and Medusa chains are cut by).
The rule looks at confidences 1..k only, which depend on tokens before k (DFlash's on none), so whether a token is
drafted never depends on that token and sampling stays lossless. A block of any length up to B - 1 costs one
forward (`drafts_in_one_forward`), so the fallback (`drafters.fallback`) charges its drafting per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.drafters.base import CachedProposer, CutsDrafts, DraftRows, cache_length, crop, draw, feature_tokens
from draftsmith.drafters.tree import dynamic_tree
from draftsmith.sampling import target_probs


class BlockDrafter(Protocol):
    """What the proposer reads of a DFlash / DSpark drafter (`draftsmith.drafters.dflash.Drafter`, which builds its
    proposer: named here by this shape, so the two files do not import each other)."""

    config: Any  # the kind's Config (a dataclass): block_size, confidence_cut
    sizes: dict
    layer_ids: list[int]
    mask_token_id: int
    fc: nn.Linear  # the context projection: its weight sits on the drafter's device

    @property
    def dspark(self) -> bool: ...

    def eval(self) -> BlockDrafter: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def context_kv(self, features: dict, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    def blocks(self, block_ids, positions, context_kv, mask) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    @property
    def rows(self) -> DraftRows: ...

    def markov(self, hidden: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class DFlashProposer(CutsDrafts, CachedProposer):
    """One forward per cycle: block [x_{T-1}, MASK...] at T-1 over cached context keys of positions < T-1."""

    drafts_in_one_forward = True  # a block of any length is one forward (drafters.fallback charges it per call)

    def __init__(self, drafter: BlockDrafter, generator: torch.Generator | None = None):
        self.drafter, self.generator = drafter.eval(), generator
        self.required_layers = list(drafter.layer_ids)
        self.confidence_cut = drafter.config.confidence_cut  # DSpark's head, DFlash's top probabilities (module doc)
        self.longest_draft = drafter.config.block_size - 1
        self.reset()

    def reset(self) -> None:
        """Forget the previous request."""
        self.context: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, positions 0..n-1
        self.forget_cache()  # `cached`: the committed tokens those positions came from
        self.rows = self.drafter.rows  # the target id each head row drafts

    def describe(self) -> dict:
        """Kind, options and trained parameter count."""
        described = {"kind": "dflash", **dataclasses.asdict(self.drafter.config),
                     "draft_vocab_size": self.drafter.sizes.get("draft_vocab_size"),
                     "parameters": sum(p.numel() for p in self.drafter.parameters())}
        return {**described, **self.describe_cut()} if self.drafter.dspark else described

    def networks(self) -> list[nn.Module]:
        return [self.drafter]

    @torch.no_grad()
    def _catch_up(self, state: DecodeState) -> None:
        """Keep the cached context positions whose tokens still match, add those committed since (< T-1)."""
        tokens = state.tokens[0].cpu()
        keep = self.reusable(tokens, 0 if self.context is None else cache_length(self.context))  # the feature at j
        end = tokens.numel() - 1  # depends on tokens 0..j
        new = self.drafter.context_kv(state.features, keep, end)
        if self.context is None:
            self.context = new
        else:
            self.context = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                            for (k, v), (nk, nv) in zip(crop(self.context, keep), new)]
        self.cached = tokens[:end].clone()

    @torch.no_grad()
    def block_hidden(self, state: DecodeState) -> torch.Tensor:
        """Normed hiddens [B, H] of the block [x_{T-1}, MASK...] at the last committed token."""
        feature_tokens(state, "The DFlash drafter")
        self._catch_up(state)
        drafter, T = self.drafter, state.tokens.shape[1]
        size, device = drafter.config.block_size, drafter.fc.weight.device
        block = torch.full((1, size), drafter.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = state.tokens[0, -1]
        positions = torch.arange(T - 1, T - 1 + size, device=device)[None]
        return drafter.blocks(block, positions, self.context, None)[0]  # no mask: all context < T-1, block is free

    @torch.no_grad()
    def block_logits(self, state: DecodeState) -> torch.Tensor:
        """Backbone logits [B-1, N] over the head's rows at block positions 1..B-1 (DSpark's Markov bias not added:
        it needs the draft)."""
        return self.drafter.logits(self.block_hidden(state)[1:])

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """min(length, B-1) tokens from one forward: greedy, or each sampled from its own q (lossless), cut where the
        confidences stop paying (module doc). DSpark walks the block adding each position's Markov bias."""
        if shape.tree is not None:
            return self.tree(state, *shape.tree)
        drafter = self.drafter
        hidden = self.block_hidden(state)[1 : 1 + shape.length]
        logits = drafter.logits(hidden)
        if not drafter.dspark:
            logits = logits[: self._kept(logits)]
            if sampling.greedy:
                return Draft(self.rows.to_target(logits.argmax(-1)).cpu())
            # Block positions do not see each other's draft, so each q_k is the full law of x_k given the prefix.
            q = target_probs(logits, sampling)
            rows = torch.multinomial(q, 1, generator=self.generator)[:, 0]
            return Draft(self.rows.to_target(rows).cpu(), probs=self.rows.probs_to_target(q).cpu())
        return self._walk(hidden, logits, state.tokens[0, -1], sampling)

    @torch.no_grad()
    def tree(self, state: DecodeState, depth: int, top_k: int, total_tokens: int) -> Draft:
        """A tree from the same single forward: EAGLE-2's best-first growth over the block positions' top-k, a
        depth-d node's children being position d+1's picks (DSpark: with the Markov bias of that node's token)."""
        hidden = self.block_hidden(state)[1 : 1 + depth]
        logits = self.drafter.logits(hidden)
        depth_of: dict[int, int] = {}

        def children(position: int, tokens: torch.Tensor) -> torch.Tensor:  # tokens: the parents' target ids
            rows = logits[position].expand(tokens.numel(), -1)
            if self.drafter.dspark:
                rows = rows + self.drafter.markov(hidden[position].expand(tokens.numel(), -1), tokens)[0]
            return torch.log_softmax(rows, -1).cpu()

        def grow(node_ids, rows, parent_ids):  # rows: the frontier's head rows
            depths = [1 if int(p) < 0 else depth_of[int(p)] + 1 for p in parent_ids]
            depth_of.update({int(n): d for n, d in zip(node_ids, depths)})
            return children(depths[0], self.rows.to_target(rows))  # one frontier is one depth

        root = children(0, state.tokens[0, -1:].to(logits.device))[0]
        rows, parents, _ = dynamic_tree(root, grow, len(logits), top_k, total_tokens)
        return Draft(self.rows.to_target(rows), parents)

    def _kept(self, logits: torch.Tensor) -> int:
        """DFlash: how many leading block positions (of `logits` [k, N]) pay under the stopping rule, each position's
        confidence its top probability (no rule: all)."""
        rule = self.stopping_rule(len(logits))
        if rule is None:
            return len(logits)
        return next((k for k, row in enumerate(logits) if not rule.keep_step(row)), len(logits))

    def _walk(self, hidden, logits, anchor, sampling: Sampling) -> Draft:
        """DSpark: position k's logits plus the Markov bias of the token drafted before it, left to right."""
        drafter, rule = self.drafter, self.stopping_rule(len(logits))
        tokens, probs, prev = [], [], anchor.reshape(())
        for k in range(len(logits)):
            bias, confidence = drafter.markov(hidden[k], prev)
            if rule is not None and not rule.keep(float(torch.sigmoid(confidence))):
                break
            row, q = draw(logits[k] + bias, sampling, self.generator)  # q over the head's rows
            prev = self.rows.to_target(row)
            tokens.append(prev)
            probs.append(q)
        drafted = torch.stack(tokens).cpu() if tokens else torch.zeros(0, dtype=torch.long)
        if sampling.greedy:
            return Draft(drafted)
        return Draft(drafted, probs=self.rows.probs_to_target(torch.stack(probs) if probs else logits[:0]).cpu())
