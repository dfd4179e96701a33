"""An independent draft LM: a small causal LM with the target's tokenizer, trained by distillation.

Decode time (`DraftLM`): any causal LM sharing the target's tokenizer, `hf:<model>` or a trained
folder, with its own KV cache. On every call it rolls the cache back to the longest prefix shared
with the committed tokens, feeds what is new, then drafts a chain token by token, or an EAGLE-2
dynamic tree (DESIGN §3), whose nodes it runs with a tree mask and drops from its cache afterwards.

Training (`Drafter`, DESIGN §3 "Independent draft LM"): the draft model is a `transformers` model of
the target's architecture, either the target cut to its first N layers (its embedding, those layers,
its final norm and lm_head) or a fresh smaller config; it learns the target's next-token distribution
at every loss-masked position (forward KL, reverse KL or total variation, from the target's logits or
its stored top-k), optionally plus CE on the data. The folder it saves is a plain `transformers` model
folder (config.json, safetensors, tokenizer, generation config) that loads with
`AutoModelForCausalLM.from_pretrained(DIR)` and works as `assistant_model` or a vLLM draft model; the
format needs the embedding and head, so they are stored (the draftsmith metadata rides in config.json).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.drafters import DecodeState, Draft, DraftShape, Sampling, predicting_positions
from draftsmith.drafters.base import CachedProposer, crop
from draftsmith.drafters.losses import LossOptions, distribution_loss
from draftsmith.drafters.tree import TreeSlots, dynamic_tree
from draftsmith.errors import DraftsmithError
from draftsmith.kv_cache import attention_windows, rollback_cache, tree_attention_mask
from draftsmith.sampling import target_probs

META_KEYS = ("draftsmith_kind", "draftsmith_config", "target_name", "target_fingerprint")
"""what a trained draft-LM folder adds to its config.json (transformers keeps and ignores them)"""


@dataclass
class Config(LossOptions):
    """Options of the distilled draft LM."""

    init: Literal["truncated", "fresh"] = "truncated"
    """truncated: the target's embedding, first num_layers layers, final norm and lm_head; fresh: a new
    config of the target's architecture with the sizes below (embedding and head copied when the width matches)"""
    num_layers: int = 2
    """decoder layers of the draft model"""
    hidden_size: int | None = None
    """fresh: width (default the target's)"""
    intermediate_size: int | None = None
    """fresh: MLP width (default the target's, scaled with hidden_size)"""
    num_attention_heads: int | None = None
    """fresh: attention heads (default the target's)"""
    num_key_value_heads: int | None = None
    """fresh: key/value heads (default the target's)"""
    freeze_embeddings: bool = True
    """keep the embedding and lm_head frozen at the target's (they are most of a small draft model's weights)"""
    top_k: int = 0
    """distil on the target's top-k logits only, renormalised (0 = the full distribution, from the target's last
    layer through its head); a batch's stored top-k logits (data.topk_logits >= top_k) then spare that head pass.
    With 0, top-k logits a shared capture holds are not used: the loss is the same offline and online"""
    ce_weight: float = 0.0
    """weight of an extra cross-entropy term on the data's next tokens"""

    def validate(self) -> None:
        if self.num_layers < 1:
            raise DraftsmithError(f"drafter.num_layers must be at least 1, got {self.num_layers}.")
        if self.top_k < 0 or self.ce_weight < 0:
            raise DraftsmithError("drafter.top_k and drafter.ce_weight must be >= 0.")
        self.validate_loss(sparse_labels=bool(self.top_k))


# --------------------------------------------------------------------------- the trained drafter
class Drafter(nn.Module):
    """A draft causal LM plus its distillation loss; `forward(batch, target_head)` is the training loss."""

    def __init__(self, config: Config, model: nn.Module, target_num_layers: int, tokenizer=None):
        super().__init__()
        self.config, self.model = config, model
        self.target_num_layers = target_num_layers
        self.tokenizer = tokenizer  # the target's; saved with the folder so that it loads anywhere
        self.target_info: dict = {}

    @property
    def required_layers(self) -> list[int]:
        """The target's last layer: its output through the target's head gives the distribution to learn."""
        return [self.target_num_layers - 1]

    def forward(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """Distillation loss at the positions whose next token is learned; acc_0 = greedy agreement."""
        loss_mask = batch["loss_mask"].bool()
        rows = predicting_positions(loss_mask)
        hidden = self.model.get_decoder()(input_ids=batch["input_ids"],
                                          attention_mask=batch.get("attention_mask")).last_hidden_state
        draft_logits = self.model.get_output_embeddings()(hidden[rows]).float()
        log_q = torch.log_softmax(draft_logits, -1)
        with torch.no_grad():
            indices, log_p = self._target(batch, rows, target_head)
        loss = distribution_loss(self.config.loss, log_q, log_p.exp(), indices, self.config.loss_eta)
        if self.config.ce_weight:
            labels = batch["input_ids"][:, 1:][rows[0], rows[1]]
            loss = loss + self.config.ce_weight * F.cross_entropy(draft_logits, labels, reduction="none")
        total = loss.mean() if loss.numel() else draft_logits.sum() * 0.0
        target_argmax = log_p.argmax(-1) if indices is None else indices.gather(-1, log_p.argmax(-1, keepdim=True))[:, 0]
        agreement = (log_q.argmax(-1) == target_argmax).float().mean() if loss.numel() else total.detach()
        return total, {"loss": float(total.detach()), "acc_0": float(agreement)}

    def _target(self, batch, rows, target_head) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(token ids or None for all, log p [M, k or V]) of the target at `rows`."""
        k = self.config.top_k
        stored = batch.get("target_topk")
        if k and stored is not None and stored["values"].shape[-1] >= k:  # data.topk_logits: no head pass
            values = stored["values"][rows][:, :k].float()  # stored sorted, largest first
            return stored["indices"][rows][:, :k].long(), torch.log_softmax(values, -1)
        logits = target_head(batch["features"][self.target_num_layers - 1][rows]).float()
        if self.config.top_k:
            values, indices = logits.topk(self.config.top_k, -1)
            return indices, torch.log_softmax(values, -1)
        return None, torch.log_softmax(logits, -1)

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)

    # ---- saving
    def save_pretrained(self, folder: str | Path) -> None:
        """A plain `transformers` model folder, plus draftsmith's metadata inside its config.json."""
        folder = Path(folder)
        self.model.save_pretrained(folder)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(folder)
        meta = json.loads((folder / "config.json").read_text())
        meta.update(draftsmith_kind="draft_lm", draftsmith_config=dataclasses.asdict(self.config),
                    draftsmith_target_num_layers=self.target_num_layers, **self.target_info)
        (folder / "config.json").write_text(json.dumps(meta, indent=2, default=str))

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Drafter:
        """Load a folder written by `save_pretrained`; with `target`, check that it shares the tokenizer."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from draftsmith.config import build

        folder = Path(folder)
        meta = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        if meta.get("draftsmith_kind") != "draft_lm":
            raise DraftsmithError(f"'{folder}' is not a trained draft-LM folder (no draftsmith_kind: draft_lm).")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        drafter = cls(build(Config, meta["draftsmith_config"], prefix="drafter."), model,
                      meta["draftsmith_target_num_layers"], tokenizer)
        drafter.target_info = {k: meta[k] for k in ("target_name", "target_fingerprint") if k in meta}
        if target is not None:
            check_same_tokenizer(tokenizer, target.tokenizer, str(folder), target.name)
        return drafter

    def proposer(self, target, generator: torch.Generator | None = None) -> DraftLM:
        """The decode-time view of this draft model for `target`."""
        from draftsmith.target import Target

        return DraftLM(Target(self.model, self.tokenizer, name="draft-lm"), target.vocab_size, generator)


# --------------------------------------------------------------------------- building
def create(config: Config, target, draft_vocab=None) -> Drafter:
    """A fresh draft LM for `target` (the target cut to its first layers, or a new smaller config)."""
    from transformers import AutoModelForCausalLM

    config.validate()
    if draft_vocab is not None:
        raise DraftsmithError("A draft LM predicts over the target's whole vocabulary (engines need that); set "
                              "data.draft_vocab: null for kind draft_lm.")
    if config.init == "truncated" and config.num_layers > target.num_layers:
        raise DraftsmithError(f"drafter.num_layers={config.num_layers}, but target '{target.name}' has only "
                              f"{target.num_layers} layers to cut from.")
    model = AutoModelForCausalLM.from_config(_draft_config(config, target), dtype=torch.float32).to(target.device)
    _copy_from_target(model, target, config)
    if getattr(target.model, "generation_config", None) is not None:  # EOS ids etc. for generate(assistant_model)
        model.generation_config = target.model.generation_config.__class__.from_dict(
            target.model.generation_config.to_dict())
    if config.freeze_embeddings:
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            if module.weight.shape[-1] != target.hidden_size:
                raise DraftsmithError("drafter.freeze_embeddings=true needs the target's width "
                                      "(drafter.hidden_size unset), so that its embedding and head can be reused.")
            module.requires_grad_(False)
    drafter = Drafter(config, model, target.num_layers, target.tokenizer)
    drafter.target_info = {"target_name": target.name, "target_fingerprint": target.fingerprint()}
    return drafter


def _draft_config(config: Config, target):
    """The target's config with the draft model's depth (and, for a fresh model, sizes)."""
    draft = target.config.__class__.from_dict(target.config.to_dict())
    draft.num_hidden_layers = config.num_layers
    if getattr(draft, "layer_types", None):
        draft.layer_types = list(draft.layer_types)[: config.num_layers]
    if config.init == "fresh":
        width = config.hidden_size or target.hidden_size
        scale = width / target.hidden_size
        draft.hidden_size = width
        draft.intermediate_size = config.intermediate_size or int(target.config.intermediate_size * scale)
        draft.num_attention_heads = config.num_attention_heads or target.config.num_attention_heads
        draft.num_key_value_heads = config.num_key_value_heads or getattr(
            target.config, "num_key_value_heads", draft.num_attention_heads)
        if getattr(target.config, "head_dim", None):
            draft.head_dim = width // draft.num_attention_heads
    return draft


@torch.no_grad()
def _copy_from_target(model: nn.Module, target, config: Config) -> None:
    """Copy every draft tensor whose name and shape the target shares: for a truncated model that is all of
    them (the first layers keep their names); for a fresh one the embedding and head when widths match."""
    source = target.model.state_dict()
    for name, tensor in model.state_dict().items():
        if config.init == "fresh" and ".layers." in name:
            continue
        if name in source and source[name].shape == tensor.shape:
            tensor.copy_(source[name])


def load_proposer(spec: str | Path, target, dtype: str | torch.dtype | None = None) -> DraftLM:
    """A draft model (a trained draft-LM folder, or for `hf:` any model folder / hub id) -> a DraftLM, after
    checking that it shares the target's tokenizer."""
    from draftsmith.target import load_target

    draft = load_target(str(spec), dtype=dtype or target.dtype)
    if target.tokenizer is not None and draft.vocab_size < len(target.tokenizer):
        # Padded vocabularies may differ in size (logits are padded or cut to fit); fewer rows than the
        # tokenizer has tokens means some target tokens could never be drafted.
        raise DraftsmithError(f"The draft model '{spec}' predicts over {draft.vocab_size} tokens, but the tokenizer "
                              f"of target '{target.name}' has {len(target.tokenizer)} (target vocabulary "
                              f"{target.vocab_size}): it cannot draft every token.")
    check_same_tokenizer(draft.tokenizer, target.tokenizer, str(spec), target.name)
    return DraftLM(draft, target.vocab_size)


# --------------------------------------------------------------------------- decoding
class DraftLM(CachedProposer):
    """The Proposer around a `draftsmith.target.Target` used as a small autoregressive drafter."""

    def __init__(self, model, target_vocab_size: int, generator: torch.Generator | None = None):
        self.model = model  # a Target (forward with cache=, .vocab_size, .name)
        self.target_vocab_size = target_vocab_size
        self.generator = generator
        self.reset()

    def reset(self) -> None:
        """Drop the cache of the previous request."""
        self.cache = rollback_cache(self.model.config)
        self.forget_cache()  # `cached`: the tokens whose keys/values the cache holds
        self.windows = attention_windows(self.model.config)

    @property
    def assistant_model(self):
        """The draft model itself, for `generate(assistant_model=...)`."""
        return self.model.model

    def describe(self) -> dict:
        """Kind, source and size of the draft model, for reports."""
        params = sum(p.numel() for p in self.model.model.parameters())
        return {"kind": "draft_lm", "source": self.model.name, "parameters": params}

    def networks(self) -> list[nn.Module]:
        return [self.model.model]

    def _rollback(self, tokens: torch.Tensor) -> int:
        """Crop the cache to the longest prefix shared with `tokens` (leaving ≥ 1 token to feed)."""
        same = self.reusable(tokens, self.cached.numel(), limit=tokens.numel() - 1)
        crop(self.cache, same)
        self.cached = tokens[:same]
        return same

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """Draft `shape.length` tokens autoregressively (with sampling, also their distributions q), or an
        EAGLE-2 dynamic tree when `shape.tree` is set."""
        if shape.tree is not None:
            tokens, parents = self.tree(state, *shape.tree)
            return Draft(tokens, parents)
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

    @torch.no_grad()
    def tree(self, state: DecodeState, depth: int, top_k: int, total_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-2 dynamic tree (tokens [n], parents [n]); the tree's entries leave the cache afterwards."""
        tokens = state.tokens[0]
        start = self._rollback(tokens)
        device = self.model.device
        root = self.model.forward(tokens[start:][None].to(device), cache=self.cache, logits_to_keep=1).logits[0, -1]
        self.cached = tokens.clone()
        committed, slots = tokens.numel(), TreeSlots()

        def grow(node_ids, node_tokens, parent_ids):
            _, depths, sees = slots.add(node_ids, parent_ids)
            mask = tree_attention_mask(sees, committed, self.model.dtype, committed - 1 + slots.depth, self.windows)
            out = self.model.forward(node_tokens[None].to(device), cache=self.cache, attention_mask=mask,
                                     position_ids=(committed - 1 + depths)[None].to(device))
            return torch.log_softmax(_fit_vocab(out.logits[0].float().cpu(), self.target_vocab_size), -1)

        root_log_probs = torch.log_softmax(_fit_vocab(root[None].float().cpu(), self.target_vocab_size)[0], -1)
        try:
            drafted, parents, _ = dynamic_tree(root_log_probs, grow, depth, top_k, total_tokens)
        finally:  # only committed tokens stay cached
            crop(self.cache, committed)
        return drafted, parents


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

