"""The speculative decoding loop and the plain loop it is measured against (batch size 1).

One cycle (gpt-fast style): the proposer drafts from the committed state; the target verifies
[last committed token] + draft in ONE forward (a chain with its causal mask, a tree with a tree
mask and depth positions); the acceptance rule of `verify.py` picks the accepted prefix plus one
target token; the target's KV cache is rolled back *by position* to the accepted path.

Cache invariant between cycles: the target cache holds positions 0..T-2 of the T committed
tokens; the last committed token is fed at the start of the next verify pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling
from draftsmith.errors import DraftsmithError
from draftsmith.kv_cache import attention_windows, keep_cache, rollback_cache, tree_attention_mask
from draftsmith.eval.verify import tree_layout, verify_chain, verify_tree
from draftsmith.sampling import choose


@dataclass
class Cycle:
    """One verify pass: how much was drafted, offered, accepted and emitted, and what it cost."""

    drafted: int  # draft nodes sent to the target
    offered: int  # deepest draft position the walk reached (chain: min(k, accepted + 1))
    accepted: int  # drafted tokens accepted
    emitted: int  # tokens committed by this pass (accepted + 1, less any cut by max_new_tokens / EOS)
    draft_s: float
    verify_s: float


@dataclass
class Generation:
    """New tokens of one request plus its timings (seconds) and, when speculative, its cycles."""

    tokens: list[int]
    ttft_s: float | None  # None where the method gives no hook for it (transformers generate())
    total_s: float
    cycles: list[Cycle] = field(default_factory=list)

    @property
    def draft_s(self) -> float:
        return sum(c.draft_s for c in self.cycles)


def eos_ids(target) -> set[int]:
    """Token ids that end a response: the generation config's EOS ids plus the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(target.model, "generation_config", None), target.config):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else value or [])
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        ids.add(int(target.tokenizer.eos_token_id))
    return ids


class GrowingFeatures:
    """Target features of the committed positions, appended in amortised O(new) time.

    `state.features[layer]` is a view of the first `length` columns of a buffer that doubles when
    full, so a cycle copies only the accepted positions instead of concatenating the whole history."""

    def __init__(self, features: dict[int, torch.Tensor]):
        self.buffers = dict(features)
        self.length = next(iter(features.values())).shape[1] if features else 0

    def append(self, new: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Add `new[layer]` [1, n, H] after the kept positions; return the views to put in the state."""
        count = next(iter(new.values())).shape[1] if new else 0
        for layer, values in new.items():
            buffer = self.buffers[layer]
            if self.length + count > buffer.shape[1]:
                grown = buffer.new_empty(buffer.shape[0], max(2 * buffer.shape[1], self.length + count), buffer.shape[2])
                grown[:, : self.length] = buffer[:, : self.length]
                self.buffers[layer] = buffer = grown
            buffer[:, self.length : self.length + count] = values
        self.length += count
        return {layer: buffer[:, : self.length] for layer, buffer in self.buffers.items()}


# --------------------------------------------------------------------------- prefill
def _prefill(target, prompt: torch.Tensor, layers: list[int], sampling: Sampling, generator, cache=None):
    """Run the prompt through the target (into `cache`, else the model's own kind of DynamicCache); return
    (cache, first new token [1], features)."""
    cache = DynamicCache(config=target.config) if cache is None else cache
    out = target.forward(prompt, layers=layers, cache=cache, logits_to_keep=1)
    first = choose(out.logits[0, -1:].float().cpu(), sampling, generator)
    return out.cache, first, out.features


def _stop_at(tokens: torch.Tensor, room: int, eos: set[int]) -> tuple[torch.Tensor, bool]:
    """Cut new tokens to the remaining budget and just after the first EOS; say whether to stop."""
    tokens = tokens[:room]
    if eos:
        hits = torch.isin(tokens, torch.tensor(sorted(eos))).nonzero()
        if hits.numel():
            return tokens[: int(hits[0]) + 1], True
    return tokens, tokens.numel() >= room


# --------------------------------------------------------------------------- plain loop
@torch.no_grad()
def plain_generate(
    target, prompt: torch.Tensor, sampling: Sampling, max_new_tokens: int,
    eos: set[int] | None = None, generator: torch.Generator | None = None,
) -> Generation:
    """Our baseline: prefill, then one target forward per token with the same cache handling."""
    eos = eos_ids(target) if eos is None else eos
    start = time.perf_counter()
    cache, token, _ = _prefill(target, prompt, [], sampling, generator)
    ttft = time.perf_counter() - start
    new = [int(token)]
    while len(new) < max_new_tokens and new[-1] not in eos:
        out = target.forward(token[None], cache=cache)
        token = choose(out.logits[0, -1:].float().cpu(), sampling, generator)
        new.append(int(token))
    return Generation(new, ttft, time.perf_counter() - start)


# --------------------------------------------------------------------------- speculative loop
@torch.no_grad()
def speculative_generate(
    target, proposer: Proposer, prompt: torch.Tensor, shape: DraftShape, sampling: Sampling,
    max_new_tokens: int, eos: set[int] | None = None, generator: torch.Generator | None = None,
) -> Generation:
    """Speculative decoding of one prompt [1, P]: draft, verify in one pass, accept, roll back."""
    eos = eos_ids(target) if eos is None else eos
    prompt = prompt.cpu()  # committed tokens and the acceptance math live on the CPU; the target anywhere
    layers = list(proposer.required_layers)
    proposer.reset()
    start = time.perf_counter()
    cache, first, features = _prefill(target, prompt, layers, sampling, generator, rollback_cache(target.config))
    ttft = time.perf_counter() - start
    state = DecodeState(torch.cat([prompt, first[None]], dim=1), features, prompt_length=prompt.shape[1])
    stored = GrowingFeatures(features)
    cycles: list[Cycle] = []
    done = int(first) in eos or max_new_tokens <= 1
    while not done:
        tick = time.perf_counter()
        draft = proposer.propose(state, shape, sampling)
        if target.device.type == "cuda":  # the draft's kernels may still run: charge them to drafting
            torch.cuda.synchronize(target.device)
        tock = time.perf_counter()
        path, emitted, offered = _verify(target, cache, state, draft, layers, sampling, generator, stored)
        room = max_new_tokens - (state.tokens.shape[1] - state.prompt_length)
        emitted, done = _stop_at(emitted, room, eos)
        state.tokens = torch.cat([state.tokens, emitted[None]], dim=1)
        cycles.append(Cycle(len(draft), offered, len(path) - 1, emitted.numel(), tock - tick, time.perf_counter() - tock))
    return Generation(state.tokens[0, state.prompt_length:].tolist(), ttft, time.perf_counter() - start, cycles)


def tree_forward(target, inputs: torch.Tensor, parents: torch.Tensor, past: int, cache, layers=()):
    """Target pass over [root] + tree nodes `inputs` [1, n+1]: tree mask, positions past + depth."""
    sees, depth = tree_layout(parents)
    positions = past + depth
    mask = tree_attention_mask(sees, past, target.dtype, positions, attention_windows(target.config))
    return target.forward(inputs, layers=layers, cache=cache, attention_mask=mask, position_ids=positions[None])


def _verify(target, cache, state: DecodeState, draft: Draft, layers, sampling, generator, stored: GrowingFeatures):
    """One target pass over [root] + draft; commit features and cache for the accepted path.

    Returns (accepted path as indices into [root]+draft, emitted tokens, offered depth).
    """
    past = state.tokens.shape[1] - 1  # cached positions; the root sits at position `past`
    draft = Draft(draft.tokens.cpu().long(), None if draft.parents is None else draft.parents.cpu().long(),
                  None if draft.probs is None else draft.probs.cpu())
    inputs = torch.cat([state.tokens[:, -1:], draft.tokens.view(1, -1).long()], dim=1)
    if draft.parents is None:
        out = target.forward(inputs, layers=layers, cache=cache)
        accepted, emitted = verify_chain(out.logits[0].float().cpu(), draft, sampling, generator)
        path = torch.arange(accepted + 1)
        offered = min(len(draft), accepted + 1)
    else:
        parents = draft.parents
        if not bool((parents < torch.arange(len(draft))).all()) or bool((parents < -1).any()):
            raise DraftsmithError("A tree draft must list every node after its parent (parents[i] < i, -1 = root).")
        out = tree_forward(target, inputs, parents, past, cache, layers)
        node_path, emitted, has_children = verify_tree(out.logits[0].float().cpu(), draft, sampling, generator)
        path = torch.tensor(node_path)
        offered = len(node_path) - 1 + int(has_children)
    keep_cache(cache, past, path)
    state.features = stored.append(
        {layer: out.features[layer][:, path.to(out.features[layer].device)] for layer in layers})
    return path, emitted, offered
