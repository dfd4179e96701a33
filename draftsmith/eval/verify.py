"""The lossless acceptance rules of DESIGN §3, as tensor operations on one verify pass.

Everything here is pure math on logits and draft tokens (no model, no cache), so each rule can
be tested against a slow reference and a deliberately broken variant.

Conventions: the verify input is [root] + draft nodes; `logits[j]` is the target's prediction
after input j, so a node's own acceptance is judged by the logits of its *parent*.
"""

from __future__ import annotations

import torch

from draftsmith.drafters import Draft, Sampling
from draftsmith.sampling import target_probs


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A token from a [V] distribution, as a 0-d tensor."""
    return torch.multinomial(probs, 1, generator=generator)[0]


# --------------------------------------------------------------------------- chains
def verify_chain(
    logits: torch.Tensor, draft: Draft, sampling: Sampling, generator: torch.Generator | None = None
) -> tuple[int, torch.Tensor]:
    """Accept a prefix of a chain draft. `logits` [k+1, V]. Returns (accepted, emitted tokens [accepted+1])."""
    tokens = draft.tokens
    k = tokens.numel()
    if sampling.greedy:
        predicted = logits.argmax(-1)  # [k+1]
        # Accept while the draft equals the target's argmax; then emit the argmax (correction or bonus).
        accepted = int(torch.cumprod((tokens == predicted[:k]).long(), 0).sum()) if k else 0
        return accepted, torch.cat([tokens[:accepted], predicted[accepted : accepted + 1]])

    p = target_probs(logits, sampling)  # [k+1, V]
    rows = torch.arange(k)
    p_x = p[rows, tokens]
    # q(x): the draft's own probability, or 1 for deterministic drafts (q one-hot on x).
    q_x = draft.probs[rows, tokens].float() if draft.probs is not None else torch.ones(k)
    # Accept x_i with probability min(1, p(x_i)/q(x_i)), i.e. when u * q < p.
    u = torch.rand(k, generator=generator)
    rejected = (u * q_x >= p_x).nonzero()
    accepted = int(rejected[0]) if rejected.numel() else k
    if accepted == k:  # everything accepted: a bonus token from p_{k+1}
        return k, torch.cat([tokens, _sample(p[k], generator)[None]])
    # First rejection: resample from norm(max(0, p - q)).
    if draft.probs is not None:
        q = draft.probs[accepted].float()
    else:
        q = torch.zeros_like(p[accepted]).index_fill_(0, tokens[accepted : accepted + 1], 1.0)
    residual = (p[accepted] - q).clamp_min(0.0)
    total = residual.sum()
    # p == q leaves no residual mass; rejection then has probability 0 in exact arithmetic.
    residual = residual / total if total > 0 else p[accepted]
    return accepted, torch.cat([tokens[:accepted], _sample(residual, generator)[None]])


# --------------------------------------------------------------------------- trees
def tree_layout(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor matrix and depths of [root] + nodes.

    `parents` [n] (-1 = root). Returns `sees` bool [n+1, n+1] (row i: itself and its ancestors,
    root included) and `depth` [n+1] (root = 0). Pointer jumping: one tensor step per tree level.
    """
    n = parents.numel()
    up = torch.cat([torch.zeros(1, dtype=torch.long), parents.long() + 1])  # parent in [root]+nodes numbering
    rows = torch.arange(n + 1)
    sees = torch.eye(n + 1, dtype=torch.bool)
    ancestor = rows.clone()
    while bool((ancestor > 0).any()):
        ancestor = up[ancestor]
        sees[rows, ancestor] = True
    return sees, sees.sum(1) - 1


def verify_tree(
    logits: torch.Tensor, draft: Draft, sampling: Sampling, generator: torch.Generator | None = None
) -> tuple[list[int], torch.Tensor, bool]:
    """Walk a tree draft from the root. `logits` [n+1, V] for [root] + nodes.

    Returns (accepted path as indices into [root]+nodes, root first; emitted tokens [len(path)];
    whether the last accepted node had children, i.e. the walk was offered one more depth).
    Greedy: follow the child equal to the argmax. Sampling (candidates are top-k picks, q one-hot):
    try the children in order, accepting child x with probability p(x), else p(x) = 0, renormalise,
    next sibling; if none is accepted, sample from what is left of p.
    """
    tokens, parents = draft.tokens, draft.parents.long() + 1  # parents in [root]+nodes numbering
    probs = None if sampling.greedy else target_probs(logits, sampling)
    path, node = [0], 0
    while True:
        children = (parents == node).nonzero().flatten() + 1  # indices into [root]+nodes
        if children.numel() == 0:
            break
        child_tokens = tokens[children - 1]
        if sampling.greedy:
            hit = (child_tokens == logits[node].argmax()).nonzero()
        else:
            hit = _try_siblings(probs[node], child_tokens, generator)
        if hit.numel() == 0:
            break
        node = int(children[int(hit[0])])
        path.append(node)
    offered = bool((parents == node).any())
    if sampling.greedy:
        last = logits[node].argmax()
    else:
        last = _sample(_leftover(probs[node], tokens[(parents == node).nonzero().flatten()]), generator)
    emitted = torch.cat([tokens[torch.tensor(path[1:], dtype=torch.long) - 1], last[None]])
    return path, emitted, offered


def _try_siblings(p: torch.Tensor, child_tokens: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Index (as a 0/1-element tensor) of the first sibling accepted by sequential renormalised trials."""
    m = child_tokens.numel()
    # A repeated token had its mass zeroed when its first copy was rejected: it can never be accepted.
    repeated = (child_tokens[:, None] == child_tokens[None, :]).tril(-1).any(1)
    p_x = p[child_tokens].masked_fill(repeated, 0.0)
    # Trial j sees p with the earlier siblings zeroed and renormalised: accept with p(x_j) / (1 - sum_{i<j} p(x_i)).
    remaining = (1.0 - (p_x.cumsum(0) - p_x)).clamp_min(1e-30)
    u = torch.rand(m, generator=generator)
    return (u * remaining < p_x).nonzero().flatten()[:1]


def _leftover(p: torch.Tensor, rejected_tokens: torch.Tensor) -> torch.Tensor:
    """p with every rejected sibling zeroed, renormalised (p itself if nothing is left)."""
    left = p.clone()
    left[rejected_tokens] = 0.0
    total = left.sum()
    return left / total if total > 0 else p
