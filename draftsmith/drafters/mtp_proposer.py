"""The decode-time view of MTP modules (`draftsmith.drafters.mtp`): chains of the modules, or an EAGLE-2 tree of them.

Decoding is exact, not an approximation: step k's cache holds the committed indices t <= T-1-k (whose token x_{t+k}
is committed); a draft recomputes step k at indices T-k..T-2 from the drafted tokens, so draft token k equals what
the teacher-forced modules give on the committed tokens plus the draft so far.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn
from transformers import DynamicCache

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.drafters.base import OPEN_CHAIN_REACH, CachedProposer, CutsDrafts, chain, crop, draw, feature_tokens
from draftsmith.drafters.tree import dynamic_tree


class ModulesDrafter(Protocol):
    """What the proposer reads of MTP modules (`draftsmith.drafters.mtp.Drafter`, which builds its proposer: named
    here by this shape, so the two files do not import each other)."""

    config: Any  # the kind's Config (a dataclass): num_modules, shared
    mtp_modules: nn.ModuleList  # their weights sit on the drafter's device
    last_layer: int  # the target's last layer: h^0 is its output after the final norm

    def eval(self) -> ModulesDrafter: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def normed(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def run(self, step: int, ids, hidden, index, mask, cache) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class MTPProposer(CutsDrafts, CachedProposer):
    """Chains the modules (or grows an EAGLE-2 tree of them); each step caches committed indices only.

    With `confidence_cut` (off unless asked), a chain stops before the first step whose top probability no longer
    pays for its verify cost (`draftsmith.cost.StoppingRule`), decided before that step's token is drawn."""

    def __init__(self, drafter: ModulesDrafter, generator: torch.Generator | None = None):
        self.drafter, self.generator = drafter.eval(), generator
        self.required_layers = [drafter.last_layer]
        self.longest_draft = OPEN_CHAIN_REACH if drafter.config.shared else drafter.config.num_modules
        self.reset()

    def reset(self) -> None:
        """Forget the previous request."""
        self.caches: list[DynamicCache] = []  # step k: keys/values of committed indices 0..T-1-k
        self.outputs: list[torch.Tensor] = []  # step k: h^k [1, n, H] at those indices
        self.forget_cache()  # `cached`: the committed tokens they came from

    def describe(self) -> dict:
        """Kind, options and trained parameter count."""
        trained = sum(p.numel() for p in self.drafter.parameters())
        return {"kind": "mtp", **dataclasses.asdict(self.drafter.config), "parameters": trained, **self.describe_cut()}

    def networks(self) -> list[nn.Module]:
        return [self.drafter]

    def max_steps(self, wanted: int) -> int:
        """Separate modules give D steps; a shared module can be applied as often as asked."""
        return wanted if self.drafter.config.shared else min(wanted, self.drafter.config.num_modules)

    @torch.no_grad()
    def _catch_up(self, state: DecodeState, steps: int) -> None:
        """Drop cached indices that no longer match `state.tokens`, then run each step over its new committed indices."""
        tokens = feature_tokens(state, "The MTP drafter")
        length = tokens.numel()
        device = self.drafter.mtp_modules[0].input_proj.weight.device
        hidden = self.drafter.normed(state.features[self.drafter.last_layer].to(device))  # h^0 at 0..T-2
        for step in range(1, steps + 1):
            if len(self.caches) < step:
                self.caches.append(DynamicCache())
                self.outputs.append(hidden[:, :0])
            valid = max(0, length - step)  # committed indices 0..T-1-step: x_{t+step} is known
            keep = self.reusable(tokens, self.outputs[step - 1].shape[1], lookahead=step, limit=valid)
            crop(self.caches[step - 1], keep)
            index = torch.arange(keep, valid, device=device)[None]
            new = hidden[:, keep:valid]
            if index.numel():
                mask = torch.ones(valid - keep, valid, dtype=torch.bool, device=device).tril(keep)[None, None]
                ids = tokens[keep + step : valid + step][None].to(device)
                new = self.drafter.run(step, ids, new, index, mask, self.caches[step - 1])
            self.outputs[step - 1] = torch.cat([self.outputs[step - 1][:, :keep], new], 1)
            hidden = self.outputs[step - 1]
        self.cached = tokens.clone()

    @torch.no_grad()
    def _advance(self, step: int, length: int, paths: torch.Tensor, hidden: torch.Tensor, committed: torch.Tensor):
        """Step `step` for n drafts at once: `paths` [n, step-1] drafted tokens, `hidden` h^{step-1} [n, m, H] at
        this step's uncommitted indices T-1-m..T-2 (m = step-1 but for short contexts). Returns h^step [n, m', H]
        at the next step's uncommitted indices (this step's last committed one first) and logits [n, V]."""
        n, m = hidden.shape[0], hidden.shape[1]
        cache = self.caches[step - 1]
        past = cache.get_seq_length()
        device = hidden.device
        ids = torch.cat([committed[None].expand(n, -1).to(paths.device), paths], 1)[:, -m:].to(device)
        scratch = DynamicCache()
        if past:
            layer = cache.layers[0]
            scratch.update(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1), 0)
        mask = torch.ones(m, past + m, dtype=torch.bool, device=device).tril(past)[None, None].expand(n, -1, -1, -1)
        index = torch.arange(length - 1 - m, length - 1, device=device)[None].expand(n, -1)
        out = self.drafter.run(step, ids, hidden, index, mask, scratch)
        if length - 2 - m >= 0:  # this step's last committed index, which the next step also recomputes from
            first = self.outputs[step - 1][:, length - 2 - m : length - 1 - m]
            out = torch.cat([first.expand(n, -1, -1), out], 1)
        return out, self.drafter.logits(out[:, -1])

    @torch.no_grad()
    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """A chain of up to `shape.length` tokens (D for separate modules), or an EAGLE-2 tree."""
        steps = self.max_steps(shape.tree[0] if shape.tree is not None else shape.length)
        self._catch_up(state, steps)
        if shape.tree is not None:
            tokens, parents = self.tree(state, steps, *shape.tree[1:])
            return Draft(tokens, parents)
        length, committed = state.tokens.shape[1], state.tokens[0].cpu()
        hidden = self.outputs[0][:, -1:]  # h^1 at index T-2: it predicts the first draft token
        logits = self.drafter.logits(hidden)[0, -1]
        paths, drafted, probs = committed[:0][None], [], []
        rule = self.stopping_rule(steps)
        for step in range(1, steps + 1):
            if step > 1:
                hidden, logits = self._advance(step, length, paths, hidden, committed)
                logits = logits[0]
            if rule is not None and not rule.keep_step(logits):
                break
            token, q = self._choose(logits, sampling)
            drafted.append(token.cpu())
            probs.append(q)
            paths = torch.cat([paths, token.view(1, 1).cpu()], 1)
        return chain(drafted, probs, state)

    def _choose(self, logits: torch.Tensor, sampling: Sampling):
        """Next token and, when sampling, the processed draft distribution it was drawn from."""
        return draw(logits, sampling, self.generator)

    @torch.no_grad()
    def tree(self, state: DecodeState, depth: int, top_k: int, total_tokens: int):
        """EAGLE-2 dynamic tree over the steps: a depth-d node's children come from step d+1 on its path."""
        length, committed = state.tokens.shape[1], state.tokens[0].cpu()
        root_hidden = self.outputs[0][:, -1:]
        paths = {-1: committed[:0]}  # node id -> drafted tokens on its path, itself included
        states = {-1: root_hidden}  # node id -> h^depth of its path, what its children's step reads

        def grow(node_ids, node_tokens, parent_ids):
            step = len(paths[int(parent_ids[0])]) + 2
            for node, token, parent in zip(node_ids.tolist(), node_tokens.tolist(), parent_ids.tolist()):
                paths[node] = torch.cat([paths[parent], torch.tensor([token])])
            hidden = torch.cat([states[p] for p in parent_ids.tolist()], 0)
            stacked = torch.stack([paths[node] for node in node_ids.tolist()])
            out, logits = self._advance(step, length, stacked, hidden, committed)
            for row, node in enumerate(node_ids.tolist()):
                states[node] = out[row : row + 1]
            return torch.log_softmax(logits, -1).cpu()

        root = torch.log_softmax(self.drafter.logits(root_hidden)[0, -1], -1).cpu()
        tokens, parents, _ = dynamic_tree(root, grow, depth, top_k, total_tokens)
        return tokens, parents
