"""An independent draft LM: any causal LM sharing the target's tokenizer, with its own KV cache.

Decode time only for now (`hf:<model>` in `draftsmith eval`). The proposer keeps the tokens its
cache covers and, on every call, rolls the cache back to the longest prefix shared with the
committed tokens, feeds what is new, then drafts a chain token by token.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling
from draftsmith.errors import DraftsmithError
from draftsmith.eval.verify import target_probs


class DraftLM:
    """The Proposer around a `draftsmith.target.Target` used as a small autoregressive drafter."""

    required_layers: list[int] = []

    def __init__(self, model, target_vocab_size: int, generator: torch.Generator | None = None):
        self.model = model  # a Target (forward with cache=, .vocab_size, .name)
        self.target_vocab_size = target_vocab_size
        self.generator = generator
        self.reset()

    def reset(self) -> None:
        """Drop the cache of the previous request."""
        self.cache = DynamicCache(config=self.model.config)
        self.cached = torch.zeros(0, dtype=torch.long)  # tokens whose keys/values the cache holds

    def describe(self) -> dict:
        """Kind, source and size of the draft model, for reports."""
        params = sum(p.numel() for p in self.model.model.parameters())
        return {"kind": "draft_lm", "source": self.model.name, "parameters": params}

    def _rollback(self, tokens: torch.Tensor) -> int:
        """Crop the cache to the longest prefix shared with `tokens` (leaving ≥ 1 token to feed)."""
        length = min(self.cached.numel(), tokens.numel() - 1)
        same = int(torch.cumprod((self.cached[:length] == tokens[:length]).long(), 0).sum()) if length else 0
        if self.cached.numel() > same:
            self.cache.crop(-(self.cached.numel() - same))
        self.cached = tokens[:same]
        return same

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """Draft `shape.length` tokens autoregressively; with sampling, also their distributions q."""
        if shape.tree is not None:
            raise DraftsmithError(
                "The hf:<model> drafter proposes chains only; use --draft-length instead of --tree."
            )
        tokens = state.tokens[0]
        start = self._rollback(tokens)
        feed = tokens[start:][None]
        drafted, probs = [], []
        for _ in range(shape.length):
            logits = self.model.forward(feed.to(self.model.device), cache=self.cache, logits_to_keep=1).logits[0, -1]
            logits = _fit_vocab(logits[None].float().cpu(), self.target_vocab_size)
            self.cached = torch.cat([self.cached, feed[0]])
            if sampling.greedy:
                token = logits.argmax(-1)
            else:
                q = target_probs(logits, sampling)
                token = torch.multinomial(q, 1, generator=self.generator)[:, 0]
                probs.append(q)
            drafted.append(token)
            feed = token[None]
        draft_tokens = torch.cat(drafted) if drafted else tokens[:0]
        return Draft(draft_tokens, probs=torch.cat(probs) if probs else None)


def _fit_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Pad (with -inf) or cut the draft's logits to the target vocabulary size."""
    if logits.shape[-1] >= size:
        return logits[..., :size]
    pad = logits.new_full((*logits.shape[:-1], size - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def check_same_tokenizer(draft_tokenizer, target_tokenizer, draft_name: str, target_name: str) -> None:
    """Raise a clear error unless the two tokenizers map the same strings to the same ids."""
    if draft_tokenizer is None or target_tokenizer is None:
        raise DraftsmithError(
            f"Cannot compare tokenizers: '{draft_name if draft_tokenizer is None else target_name}' "
            "has no tokenizer files. A draft model must share the target's tokenizer."
        )
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if draft_vocab != target_vocab:
        differing = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()), key=lambda kv: kv[1])[:3]
        raise DraftsmithError(
            f"The draft model '{draft_name}' does not share the tokenizer of target '{target_name}' "
            f"(vocabularies of {len(draft_vocab)} and {len(target_vocab)} tokens; first differences "
            f"{differing}). Speculative decoding needs the same token ids; pick a draft model from "
            "the target's family."
        )


def load_proposer(spec: str, target, dtype: str | torch.dtype | None = None) -> DraftLM:
    """`hf:<path or id>` -> a DraftLM after checking that it shares the target's tokenizer."""
    from draftsmith.target import load_target

    draft = load_target(spec, dtype=dtype or target.dtype)
    check_same_tokenizer(draft.tokenizer, target.tokenizer, spec, target.name)
    return DraftLM(draft, target.vocab_size)
