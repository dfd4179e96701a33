"""The decode-time view of Medusa heads (`draftsmith.drafters.medusa`): chains of the heads' choices, Medusa's
static tree measured on held-out data, or EAGLE-2's dynamic tree over the heads' probabilities.

`DecodeState.features` hold the target's features at committed positions 0..T-2, and the feature at T-2 is the one
whose lm_head prediction is the last committed token x_{T-1}, so head 0 at T-2 predicts the first draft token x_T.
The heads read one feature and keep no cache: a chain is head i's choice at position i.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.drafters.base import CutsDrafts, DraftRows, chain, draw, feature_tokens
from draftsmith.drafters.tree import per_position_tree


class HeadsDrafter(Protocol):
    """What the proposer reads of Medusa heads (`draftsmith.drafters.medusa.Drafter`, which builds its proposer:
    named here by this shape, so the two files do not import each other)."""

    config: Any  # the kind's Config (a dataclass): num_heads, confidence_cut

    @property
    def last_layer(self) -> int: ...

    @property
    def rows(self) -> DraftRows: ...

    def eval(self) -> HeadsDrafter: ...

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...

    def static_tree(self) -> list[tuple[int, ...]] | None: ...

    def head_rows(self, i: int, last_features: torch.Tensor) -> torch.Tensor: ...

    def head(self, i: int, last_features: torch.Tensor) -> torch.Tensor: ...


class MedusaProposer(CutsDrafts):
    """Chains or trees of head choices at the last feature; no cache (the heads read one feature each cycle).

    With `confidence_cut`, a chain stops at the first head whose top probability no longer pays for its verify
    cost (`draftsmith.cost.StoppingRule`); the heads' probabilities do not depend on the drafted tokens, so the cut
    never depends on a drafted token and sampling stays lossless."""

    verifier = None  # Medusa-2: the tuned target that must verify these drafts (None: the target itself)

    def __init__(self, drafter: HeadsDrafter, generator: torch.Generator | None = None):
        self.drafter, self.generator = drafter.eval(), generator
        self.required_layers = [drafter.last_layer]
        self.static = drafter.static_tree()
        self.confidence_cut, self.longest_draft = drafter.config.confidence_cut, drafter.config.num_heads

    def reset(self) -> None:
        """Nothing to forget: the heads keep no state between cycles."""

    def networks(self) -> list[nn.Module]:
        """The heads and, for Medusa-2, the tuned target that verifies them (its few-row products too)."""
        return [self.drafter, *([] if self.verifier is None else [self.verifier.model])]

    def describe(self) -> dict:
        """Kind, options and parameter count."""
        heads = [p for name, p in self.drafter.named_parameters() if not name.startswith("tuned.")]
        return {"kind": "medusa", "variant": "medusa2" if self.verifier is not None else "medusa1",
                **dataclasses.asdict(self.drafter.config), "parameters": sum(p.numel() for p in heads),
                "tree": "static" if self.static else "dynamic", **self.describe_cut()}

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain: head i's choice for draft position i, up to min(length, heads) tokens; or a tree."""
        feature_tokens(state, "The Medusa drafter")
        feature = state.features[self.drafter.last_layer][0, -1]  # position T-2: its prediction is x_{T-1}
        if shape.tree is not None:
            return self.tree(feature, *shape.tree)
        tokens, probs, rows = [], [], self.drafter.rows
        length = min(shape.length, self.drafter.config.num_heads)
        rule = self.stopping_rule(length)
        for i in range(length):
            logits = self.drafter.head_rows(i, feature)
            if rule is not None and not rule.keep_step(logits):
                break
            token, q = draw(logits, sampling, self.generator, rows)
            tokens.append(token)
            probs.append(q)
        return chain(tokens, probs, state)

    def tree(self, feature: torch.Tensor, depth: int, top_k: int, total_tokens: int) -> Draft:
        """The static tree measured on held-out data (its nodes of depth <= depth and ranks < top_k, the first
        total_tokens of them), or, before any measurement, EAGLE-2's dynamic tree over the heads' probabilities."""
        depth = min(depth, self.drafter.config.num_heads)
        log_probs = [torch.log_softmax(self.drafter.head(i, feature), -1).cpu() for i in range(depth)]
        if self.static:
            return self.static_draft(log_probs, top_k, total_tokens)
        tokens, parents, _ = per_position_tree(log_probs, depth, top_k, total_tokens)  # head d picks depth d
        return Draft(tokens, parents)

    def static_draft(self, log_probs: list[torch.Tensor], top_k: int, total_tokens: int) -> Draft:
        """Tokens of the static tree's paths: node (r_1..r_d) is head d-1's rank-r_d choice (a depth-d node's
        tokens do not depend on its parent's: Medusa heads do not see the drafted tokens)."""
        paths = [p for p in self.static if len(p) <= len(log_probs) and max(p) < top_k][:total_tokens]
        ranked = [lp.topk(min(top_k, lp.numel())).indices for lp in log_probs]
        index = {path: i for i, path in enumerate(paths)}
        tokens = torch.tensor([int(ranked[len(p) - 1][p[-1]]) for p in paths], dtype=torch.long)
        parents = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in paths], dtype=torch.long)
        return Draft(tokens, parents)
