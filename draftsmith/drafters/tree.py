"""EAGLE-2 dynamic draft trees, for any autoregressive drafter (DESIGN §3).

The drafter supplies the log-probabilities of the root's children and a `grow` callback that
runs a set of frontier nodes through the drafter and returns their children's log-probabilities.
`TreeSlots` does the bookkeeping a drafter with its own KV cache needs to do that: which cache
slot holds each node, what each slot may attend to, and each node's depth.
"""

from __future__ import annotations

from typing import Callable

import torch

# grow(node_ids [n], tokens [n], parent_ids [n], -1 = root) -> log-probs of each node's children [n, V]
Grow = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dynamic_tree(
    root_log_probs: torch.Tensor, grow: Grow, depth: int, top_k: int, total_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build an EAGLE-2 tree of at most `total_tokens` nodes and depth `depth` below the root.

    Score = cumulative draft log-prob. Each round expands the `top_k` frontier nodes into
    `top_k` children each; the best `top_k` children become the next frontier. Finally the best
    `total_tokens` of all candidates are kept. Returns (tokens [n], parents [n] with -1 for the
    root's children and parents[i] < i, scores [n]); tokens are in the vocabulary of the log-probs.
    """
    top_k = min(top_k, root_log_probs.numel())
    if depth < 1 or top_k < 1 or total_tokens < 1:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty.clone(), torch.zeros(0)
    scores, tokens = root_log_probs.float().clamp(max=0.0).topk(top_k)
    all_tokens, all_parents, all_scores = [tokens], [torch.full_like(tokens, -1)], [scores]
    frontier, frontier_parents = torch.arange(top_k), all_parents[0]
    count = top_k
    for _ in range(depth - 1):
        # Clamp at 0 so a child never outscores its parent: keeping the best nodes then keeps a
        # connected tree (ties are broken by creation order, and parents are created first).
        log_probs = grow(frontier, tokens, frontier_parents).float().clamp(max=0.0)
        child_scores, child_tokens = log_probs.topk(top_k, dim=-1)  # [top_k, top_k]
        candidate_scores = (scores[:, None] + child_scores).flatten()
        candidate_parents = frontier.repeat_interleave(top_k)
        candidate_ids = count + torch.arange(candidate_scores.numel())
        count += candidate_scores.numel()
        all_tokens.append(child_tokens.flatten())
        all_parents.append(candidate_parents)
        all_scores.append(candidate_scores)
        best = _best(candidate_scores, top_k)
        frontier, frontier_parents = candidate_ids[best], candidate_parents[best]
        tokens, scores = child_tokens.flatten()[best], candidate_scores[best]
    tokens, parents, scores = torch.cat(all_tokens), torch.cat(all_parents), torch.cat(all_scores)
    keep = _best(scores, total_tokens).sort().values  # creation order: parents before children
    renumber = torch.full((count,), -1, dtype=torch.long)
    renumber[keep] = torch.arange(keep.numel())
    kept_parents = parents[keep]
    kept_parents = torch.where(kept_parents >= 0, renumber[kept_parents.clamp(min=0)], -1)
    return tokens[keep], kept_parents, scores[keep]


def per_position_tree(log_probs: list[torch.Tensor] | torch.Tensor, depth: int, top_k: int, total_tokens: int):
    """`dynamic_tree` for a drafter whose position-d distribution does not depend on the tokens before it (Medusa
    heads, P-EAGLE): a child of a depth-d node is one of `log_probs[d]`'s top tokens, whatever its parent."""
    depth_of: dict[int, int] = {}

    def grow(node_ids, _tokens, parent_ids):
        depths = [1 if int(p) < 0 else depth_of[int(p)] + 1 for p in parent_ids]
        depth_of.update({int(n): d for n, d in zip(node_ids, depths)})
        return torch.stack([log_probs[d] for d in depths])

    return dynamic_tree(log_probs[0], grow, depth, top_k, total_tokens)


def _best(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the `n` highest scores; ties go to the lower index (a stable sort)."""
    return torch.sort(scores, descending=True, stable=True).indices[:n]


class TreeSlots:
    """Where each grown tree node sits in a drafter's cache (after the committed prefix) and what it sees."""

    def __init__(self) -> None:
        self.slot_of: dict[int, int] = {}
        self.sees = torch.zeros(0, 0, dtype=torch.bool)  # [slots, slots]: itself and its ancestors
        self.depth = torch.zeros(0, dtype=torch.long)  # root's children have depth 1

    def add(self, node_ids: torch.Tensor, parent_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Give new nodes the next slots. Returns (parent slot or -1 [n], depth [n], sees [n, slots])."""
        old, n = self.sees.shape[0], node_ids.numel()
        parent_slots = torch.tensor([self.slot_of[int(p)] if p >= 0 else -1 for p in parent_ids], dtype=torch.long)
        has_parent = parent_slots >= 0
        rows = torch.zeros(n, old + n, dtype=torch.bool)
        rows[has_parent, :old] = self.sees[parent_slots[has_parent]]
        rows[:, old:] = torch.eye(n, dtype=torch.bool)
        depth = torch.ones(n, dtype=torch.long)
        depth[has_parent] = self.depth[parent_slots[has_parent]] + 1
        self.sees = torch.cat([torch.cat([self.sees, torch.zeros(old, n, dtype=torch.bool)], 1), rows], 0)
        self.depth = torch.cat([self.depth, depth])
        for offset, node in enumerate(node_ids.tolist()):
            self.slot_of[node] = old + offset
        return parent_slots, depth, rows
