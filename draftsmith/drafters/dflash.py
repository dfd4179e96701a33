"""DFlash block-diffusion drafter (DESIGN §3 "DFlash"): one forward pass drafts a whole block.

Context c = RMSNorm(fc(concat of the target's features at n layers spread over depth)), one vector per
committed position. A block at anchor a is [x_a, MASK x (B-1)] at positions a..a+B-1; in every draft layer the
block's queries attend to keys/values proj(c) at positions < a (all of them: the context is causal only in that
it stops before the anchor) and proj(block) (bidirectional inside the block). Draft layers are Qwen3-style
(q/k norms) built from transformers' Qwen3 pieces, shaped as the `dflash` reference's `DFlashDraftModel`
computes them: the context enters k/v without the layer's input norm, RoPE puts context position j at j. The
final `norm` is the drafter's own; embedding and lm_head are the target's, frozen and never stored. With a draft
vocabulary (`data.draft_vocab`, N of the target's V tokens) the drafter has its own head over those N rows instead,
started from the target's lm_head rows and trained (d2t/t2d map rows to target ids, as EAGLE-3 and the speculators
library's reduced-vocabulary DFlash do); its soft labels are the target's distribution renormalised over them.

Block position k (1..B-1) predicts x_{a+k}; its label is the target's distribution at a+k-1 (soft labels).

Decoding: `DecodeState.features` hold the target's features at committed positions 0..T-2, so the block sits
at the last committed token T-1 and the context covers positions < T-1, exactly the training layout. Context
keys/values depend on c only (not on the block), so the proposer caches them per layer and rolls them back
by comparing its tokens with `state.tokens`.

DSpark (`variant: dspark`) adds two small heads on the same backbone, which still runs once per block:
- a sequential (Markov) head: block position k's logits get the low-rank bias markov_w2(markov_w1[prev_k]), prev_k
  the block token just before k (the anchor for k = 1; in decoding, the token drafted at k-1), so drafting walks
  the block left to right with this cheap bias only;
- a confidence head: sigmoid(confidence([hidden_k; markov_w1[prev_k]])) predicts that position k is accepted,
  trained (BCE, weight `confidence_weight`) against whether the biased draft's top token is the target's there.
  Decoding cuts the block by `draftsmith.cost.StoppingRule` read off the verify-cost curve t(n): position k is
  drafted only if, projecting its own confidence onto the positions after it, some length >= k gives more expected
  tokens per unit of verify cost than stopping before k. The rule looks at confidences 1..k only, which depend on
  tokens before k, so whether a token is drafted never depends on that token and sampling stays lossless.
These are the speculators library's DSpark heads (`markov_head_type: vanilla`, `confidence_head_with_markov`) in
the block layout whose position 0 is the anchor (its `sample_from_anchor: false`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

from draftsmith.config import build
from draftsmith.cost import CutsDrafts
from draftsmith.data.vocab import checked_draft_vocab
from draftsmith.drafters import (
    DecodeState, Draft, DraftShape, Sampling, check_target, load_attached, read_folder, save_folder, soft_labels,
    target_info,
)
from draftsmith.drafters.tree import dynamic_tree
from draftsmith.errors import DraftsmithError
from draftsmith.sampling import target_probs



@dataclass
class Config:
    """Options of the DFlash drafter."""

    block_size: int = 8
    """B: block = [last committed token, MASK x (B-1)]; one forward drafts B-1 tokens (4, 8, 16)"""
    num_layers: int = 1
    """draft decoder layers (Qwen3-style)"""
    num_target_layers: int = 5
    """n target layers whose features form the context, spread over depth: round(1 + i(L-4)/(n-1))"""
    target_layer_ids: list[int] | None = None
    """explicit output-layer ids of the context layers (overrides num_target_layers)"""
    anchors_per_sequence: int = 8
    """training blocks per sequence, anchors drawn inside loss-masked spans"""
    gamma: float | None = None
    """position weight w_k = exp(-(k-1)/gamma); null: 7 for B >= 16, else 4 (the DFlash paper's values)"""
    mask_token_id: int | None = None
    """MASK id; null: the tokenizer's mask token, else an id no text maps to (written into the config)"""
    anchor_seed: int = 0
    """seeds the anchor draws (with each batch's sample ids, so a resumed run draws the same anchors)"""
    variant: str = "dflash"
    """dflash, or dspark: DFlash plus a Markov logit-bias head and a confidence head that cuts each block"""
    markov_rank: int = 256
    """DSpark: rank r of the Markov bias markov_w2(markov_w1[previous token]) (r x vocabulary, twice)"""
    confidence_weight: float = 1.0
    """DSpark: weight of the confidence head's loss (BCE against whether the position's draft was the target's)"""
    confidence_cut: bool = True
    """DSpark: cut each block where the confidences stop paying for their verify cost (false: draft the whole block)"""
    attention: str = "auto"
    """training attention over the blocks: sdpa (a boolean mask), flex (flex_attention with a block mask, compiled;
    the same loss) or auto: flex on CUDA, sdpa on a CPU (torch has no flex_attention backward on CPUs)"""

    def validate(self) -> None:
        if self.block_size < 2:
            raise DraftsmithError(f"drafter.block_size must be at least 2, got {self.block_size}.")
        if self.num_layers < 1:
            raise DraftsmithError(f"drafter.num_layers must be at least 1, got {self.num_layers}.")
        if self.num_target_layers < 2 and self.target_layer_ids is None:
            raise DraftsmithError(f"drafter.num_target_layers must be at least 2, got {self.num_target_layers}.")
        if self.anchors_per_sequence < 1:
            raise DraftsmithError(f"drafter.anchors_per_sequence must be at least 1, got {self.anchors_per_sequence}.")
        if self.gamma is not None and self.gamma <= 0:
            raise DraftsmithError(f"drafter.gamma must be positive, got {self.gamma}.")
        if self.variant not in ("dflash", "dspark"):
            raise DraftsmithError(f"drafter.variant must be dflash or dspark, got {self.variant!r}.")
        if self.variant == "dspark" and self.markov_rank < 1:
            raise DraftsmithError(f"drafter.markov_rank must be at least 1 for variant dspark, got {self.markov_rank}.")
        if self.confidence_weight < 0:
            raise DraftsmithError(f"drafter.confidence_weight must be >= 0, got {self.confidence_weight}.")
        if self.attention not in ("auto", "sdpa", "flex"):
            raise DraftsmithError(f"drafter.attention must be auto, sdpa or flex, got {self.attention!r}.")

    def position_weights(self) -> list[float]:
        """w_k for block positions k = 1..B-1."""
        gamma = self.gamma or (7.0 if self.block_size >= 16 else 4.0)
        return [math.exp(-(k - 1) / gamma) for k in range(1, self.block_size)]


def default_layer_ids(num_layers: int, count: int) -> list[int]:
    """`count` output-layer ids spread over a target of `num_layers` layers (DESIGN §3; `dflash:N` in capture)."""
    return [round(1 + i * (num_layers - 4) / (count - 1)) for i in range(count)]


def block_attention_mask(anchors: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """Boolean [b, 1, N*B, length + N*B]: block n's queries see context keys j < anchors[:, n] and its own block."""
    which = torch.arange(anchors.shape[1], device=anchors.device).repeat_interleave(block_size)
    context = torch.arange(length, device=anchors.device) < anchors.repeat_interleave(block_size, 1)[..., None]
    own = (which[:, None] == which[None, :]).expand(anchors.shape[0], -1, -1)
    return torch.cat([context, own], -1)[:, None]


def flex_block_mask(anchors: torch.Tensor, length: int, block_size: int):
    """`block_attention_mask` as a flex_attention BlockMask (the same rule, evaluated block-sparsely)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def rule(b, _head, query, key):
        block = query // block_size
        return torch.where(key < length, key < anchors[b, block], (key - length) // block_size == block)

    queries = anchors.shape[1] * block_size
    return create_block_mask(rule, anchors.shape[0], None, queries, length + queries, device=anchors.device)


_compiled_flex = None


def flex_attention(q, k, v, block_mask, enable_gqa: bool) -> torch.Tensor:
    """flex_attention, compiled once per process on CUDA. On a CPU it runs torch's uncompiled reference code
    (forward only, slow): torch 2.13's compiled CPU kernel has no backward and, measured here, returns wrong
    values or NaN at head_dim 16."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention as flex

    if q.device.type == "cpu":
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()": on purpose here
            return flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


# --------------------------------------------------------------------------- the model
class Attention(nn.Module):
    """Qwen3-style attention whose keys/values are the context's and the block's; queries from the block."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        H, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(H, self.kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(H, self.kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * d, H, bias=config.attention_bias)
        self.q_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)

    def key_value(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed, rotated keys and values [b, kv_heads, n, d] of `x` [b, n, H]."""
        b, n = x.shape[:2]
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        return _rope(k, cos, sin), self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, context_kv, cos, sin, mask) -> torch.Tensor:
        """Attention output [b, n, H] for block hiddens `x`; `mask`: [b, 1, n, context + n] boolean, a flex
        BlockMask of the same rule, or None (everything visible)."""
        b, n = x.shape[:2]
        q = _rope(self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)).transpose(1, 2), cos, sin)
        k, v = self.key_value(x, cos, sin)
        k, v = torch.cat([context_kv[0], k], 2), torch.cat([context_kv[1], v], 2)
        if mask is not None and not isinstance(mask, torch.Tensor):
            out = flex_attention(q, k, v, mask, enable_gqa=self.heads != self.kv_heads)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class Layer(nn.Module):
    """Pre-norm Qwen3 decoder layer; the context goes into k/v as it is (no input norm), as the reference does."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, context_kv, cos, sin, mask) -> torch.Tensor:
        """The layer on block hiddens `x` [b, n, H]."""
        x = x + self.self_attn(self.input_layernorm(x), context_kv, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """DFlash draft layers on the frozen target; `forward(batch, target_head)` is the training loss."""

    def __init__(self, config: Config, layer_config: dict, sizes: dict, layer_ids: list[int], mask_token_id: int):
        super().__init__()
        self.config, self.sizes = config, sizes
        self.layer_ids, self.mask_token_id = list(layer_ids), int(mask_token_id)
        self.layer_config = Qwen3Config(**{**layer_config, "num_hidden_layers": config.num_layers})
        H = self.layer_config.hidden_size
        self.fc = nn.Linear(len(self.layer_ids) * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(self.layer_config) for _ in range(config.num_layers)])
        self.norm = Qwen3RMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(self.layer_config)
        V = sizes["vocab_size"]
        N = sizes.get("draft_vocab_size") or V
        # Over a draft vocabulary of N < V tokens the drafter has its own head, row i drafting target id i + d2t[i]
        # (t2d marks those ids), as the speculators library's reduced-vocabulary DFlash; else the target's lm_head.
        self.lm_head = nn.Linear(H, N, bias=False) if N < V else None
        self.register_buffer("d2t", torch.zeros(N, dtype=torch.long) if N < V else None)
        self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool) if N < V else None)
        if config.variant == "dspark":
            r = config.markov_rank
            self.markov_w1 = nn.Embedding(V, r)  # indexed by the previous token's target id
            nn.init.normal_(self.markov_w1.weight, std=0.01)
            self.markov_w2 = nn.Linear(r, N, bias=False)  # a bias on the head's rows
            nn.init.zeros_(self.markov_w2.weight)  # the bias starts at zero: training begins from plain DFlash
            self.confidence = nn.Linear(H + r, 1)
        self.target_info: dict = {}
        self.target = None  # the frozen target (embedding, lm_head); attached, never a submodule

    @property
    def required_layers(self) -> list[int]:
        """The context layers plus the last layer (the soft labels come from the target's own distribution)."""
        return sorted(set(self.layer_ids) | {self.sizes["num_target_layers"] - 1})

    def attach(self, target) -> Drafter:
        """Read the target's frozen embedding and lm_head from now on (after checking it fits)."""
        s = self.sizes
        check_target({"hidden_size": s["hidden_size"], "vocab_size": s["vocab_size"],
                      "num_layers": s["num_target_layers"]}, self.target_info.get("target_fingerprint"), target,
                     "This DFlash drafter")
        self.target = target
        return self

    def _target(self):
        if self.target is None:
            raise DraftsmithError("This DFlash drafter is not attached to a target: call drafter.attach(target) first.")
        return self.target

    # ---- pieces shared by training and decoding
    def context_kv(self, features: dict, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, keys/values of the context at positions start..end-1 (features indexed from 0)."""
        parts = [features[i][:, start:end] for i in self.layer_ids]
        context = self.hidden_norm(self.fc(torch.cat(parts, -1).to(self.fc.weight.dtype)))
        positions = torch.arange(start, end, device=context.device)[None].expand(context.shape[0], -1)
        cos, sin = self.rotary_emb(context, positions)
        return [layer.self_attn.key_value(context, cos, sin) for layer in self.layers]

    def blocks(self, block_ids, positions, context_kv, mask) -> torch.Tensor:
        """Normed hiddens [b, n, H] of the block tokens `block_ids` [b, n] at `positions` [b, n]."""
        target = self._target()
        x = target.embed(block_ids.to(target.device)).to(self.fc.weight.device, self.fc.weight.dtype)
        cos, sin = self.rotary_emb(x, positions)
        for layer, kv in zip(self.layers, context_kv):
            x = layer(x, kv, cos, sin, mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., N] over the head's rows on the drafter's normed hidden (float32): the target's frozen lm_head
        over its whole vocabulary, or the drafter's own head over its draft vocabulary (see `to_target`)."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        target = self._target()
        return target.model.get_output_embeddings()(hidden.to(target.dtype)).float()

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """Target id of each head row (i + d2t[i]); None: the rows are the target's whole vocabulary."""
        return None if self.d2t is None else torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def to_target(self, rows: torch.Tensor) -> torch.Tensor:
        """Target token ids of head rows `rows` (on their device)."""
        return rows if self.d2t is None else rows + self.d2t[rows.to(self.d2t.device)].to(rows.device)

    def to_vocabulary(self, q: torch.Tensor) -> torch.Tensor:
        """A distribution [..., N] over head rows as one over the target's vocabulary [..., V] (0 outside the draft
        vocabulary), as the lossless acceptance rule reads it."""
        if self.d2t is None:
            return q
        full = q.new_zeros(*q.shape[:-1], self.t2d.numel())
        full[..., self.draft_ids.to(q.device)] = q
        return full

    @property
    def dspark(self) -> bool:
        return self.config.variant == "dspark"

    def markov(self, hidden: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DSpark's heads at block positions with normed hiddens `hidden` [..., H] whose previous block tokens are
        `prev` [...] (target ids): the Markov logit bias over the head's rows [..., N] and the confidence logit [...]
        (sigmoid = P(accepted))."""
        emb = self.markov_w1(prev.to(self.markov_w1.weight.device))
        confidence = self.confidence(torch.cat([hidden, emb.to(hidden.dtype)], -1))[..., 0]
        return self.markov_w2(emb).float(), confidence.float()

    def block_hidden(self, input_ids, features, anchors: torch.Tensor) -> torch.Tensor:
        """Hiddens [b, N, B, H] of the blocks at `anchors` [b, N], each seeing the context before its anchor."""
        (b, length), size = input_ids.shape, self.config.block_size
        block = torch.full((b, anchors.shape[1], size), self.mask_token_id, dtype=torch.long, device=input_ids.device)
        block[..., 0] = input_ids.gather(1, anchors)
        positions = (anchors[..., None] + torch.arange(size, device=anchors.device)).flatten(1)
        mask = (flex_block_mask if self.uses_flex(anchors.device) else block_attention_mask)(anchors, length, size)
        hidden = self.blocks(block.flatten(1), positions, self.context_kv(features, 0, length), mask)
        return hidden.view(b, anchors.shape[1], size, -1)

    def uses_flex(self, device: torch.device) -> bool:
        """Whether training attention runs flex_attention here (see `Config.attention`)."""
        if self.config.attention == "auto":
            return device.type == "cuda"
        if self.config.attention == "flex" and device.type == "cpu" and torch.is_grad_enabled():
            raise DraftsmithError("drafter.attention=flex: torch has no flex_attention backward on a CPU, so it cannot "
                                  "train here; use auto or sdpa.")
        return self.config.attention == "flex"

    # ---- training
    def sample_anchors(self, input_ids, loss_mask, sample_ids=None) -> torch.Tensor:
        """[b, N] anchors a >= 1 whose first label x_{a+1} is loss-masked, drawn without replacement; -1 = none.
        Seeded by anchor_seed and the batch's sample ids (its tokens when there are none)."""
        key = sample_ids if sample_ids is not None else input_ids
        generator = torch.Generator().manual_seed(self.config.anchor_seed * 1_000_003 + int(key.sum()))
        allowed = torch.zeros_like(loss_mask, dtype=torch.bool, device="cpu")
        allowed[:, 1:-1] = loss_mask[:, 2:].bool().cpu()
        anchors = torch.full((loss_mask.shape[0], self.config.anchors_per_sequence), -1, dtype=torch.long)
        for row in range(loss_mask.shape[0]):
            where = allowed[row].nonzero().flatten()
            chosen = where[torch.randperm(where.numel(), generator=generator)[: anchors.shape[1]]]
            anchors[row, : chosen.numel()] = chosen.sort().values
        return anchors.to(loss_mask.device)

    def forward(self, batch: dict, target_head, anchors: torch.Tensor | None = None):
        """sum_k w_k CE_k against the target's distribution at a+k-1; loss_j / acc_j for block position k = j+1."""
        ids, loss_mask = batch["input_ids"], batch["loss_mask"].bool()
        if anchors is None:
            anchors = self.sample_anchors(ids, loss_mask, batch.get("sample_ids"))
        used = anchors >= 0
        hidden = self.block_hidden(ids, batch["features"], anchors.clamp(min=0))
        last = batch["features"][self.sizes["num_target_layers"] - 1]
        total, metrics = hidden.new_zeros((), dtype=torch.float32), {}
        for k, weight in enumerate(self.config.position_weights(), start=1):
            label_at = anchors.clamp(min=0) + k
            counted = used & (label_at < ids.shape[1])
            counted &= loss_mask.gather(1, label_at.clamp(max=ids.shape[1] - 1))
            rows = counted.nonzero(as_tuple=True)
            if rows[0].numel() == 0:
                continue
            at = hidden[rows[0], rows[1], k]
            logits = self.logits(at)
            if self.dspark:  # the block token before k: the anchor, then the data's tokens (teacher forcing)
                bias, confidence = self.markov(at, ids[rows[0], label_at[rows] - 1])
                logits = logits + bias
            log_q = torch.log_softmax(logits, -1)
            with torch.no_grad():  # over a draft vocabulary: the target's distribution renormalised over its rows
                p, best = soft_labels(target_head, last[rows[0], label_at[rows] - 1], self.draft_ids)
            ce = -(p * log_q).sum(-1).mean()
            total = total + weight * ce
            matched = (self.to_target(log_q.argmax(-1)) == best).float()
            metrics[f"loss_{k - 1}"] = float(ce.detach())
            metrics[f"acc_{k - 1}"] = float(matched.mean())
            if self.dspark:
                bce = F.binary_cross_entropy_with_logits(confidence, matched)
                total = total + self.config.confidence_weight * bce
                metrics[f"confidence_loss_{k - 1}"] = float(bce.detach())
                metrics[f"confidence_{k - 1}"] = float(torch.sigmoid(confidence.detach()).mean())
        metrics["loss"] = float(total.detach())
        return total, metrics

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)

    # ---- saving
    def save_pretrained(self, folder: str | Path) -> None:
        """config.json (kind, options, sizes, layer ids, mask id, draft-layer config) + model.safetensors."""
        meta = {"config": dataclasses.asdict(self.config), **self.sizes, "target_layer_ids": self.layer_ids,
                "mask_token_id": self.mask_token_id, "layer_config": self.layer_config.to_dict()}
        save_folder(folder, "dflash", meta, self)

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Drafter:
        """Load a folder written by `save_pretrained`, attached to `target` when given."""
        meta, tensors, target_record = read_folder(folder, "dflash")
        sizes = {k: meta[k] for k in ("hidden_size", "vocab_size", "num_target_layers")}
        if meta.get("draft_vocab_size"):
            sizes["draft_vocab_size"] = meta["draft_vocab_size"]
        drafter = cls(build(Config, meta["config"], prefix="drafter."), meta["layer_config"], sizes,
                      meta["target_layer_ids"], meta["mask_token_id"])
        drafter.load_state_dict(tensors)
        drafter.target_info = target_record
        return drafter if target is None else drafter.attach(target)

    def proposer(self, target, generator: torch.Generator | None = None) -> DFlashProposer:
        """The decode-time view of this drafter for `target`."""
        return DFlashProposer(self.attach(target), generator)


# --------------------------------------------------------------------------- building
def resolve_mask_token(chosen: int | None, tokenizer, vocab_size: int) -> int:
    """The MASK id: `chosen`, else the tokenizer's mask token, else an embedding row past the tokenizer, else its
    last special token that is not bos/eos/pad/unk. Refuses an id that the tokenizer uses for real text."""
    special = set() if tokenizer is None else set(tokenizer.all_special_ids) | {
        i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    if chosen is None and tokenizer is not None:
        if tokenizer.mask_token_id is not None:
            chosen = tokenizer.mask_token_id
        elif len(tokenizer) < vocab_size:
            chosen = len(tokenizer)  # the embedding has rows no text maps to
        else:
            roles = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
            spare = sorted(special - roles)
            chosen = spare[-1] if spare else None
    if chosen is None:
        raise DraftsmithError("drafter.mask_token_id: the tokenizer has no mask token and no spare id; give one.")
    if not 0 <= chosen < vocab_size:
        raise DraftsmithError(f"drafter.mask_token_id={chosen} is outside the target's vocabulary 0..{vocab_size - 1}.")
    if tokenizer is not None and chosen < len(tokenizer) and chosen not in special:
        raise DraftsmithError(f"drafter.mask_token_id={chosen} is {tokenizer.convert_ids_to_tokens(chosen)!r}, a token "
                              "the tokenizer uses for real text; pick a special or unused id.")
    return int(chosen)


def layer_config_for(target, num_layers: int) -> dict:
    """A Qwen3 config for the draft layers with the target's sizes, RoPE and norm epsilon."""
    tc = target.config
    heads = tc.num_attention_heads
    return Qwen3Config(
        vocab_size=target.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads, rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings, rope_parameters=dict(tc.rope_parameters),
        attention_bias=False, tie_word_embeddings=False).to_dict()


def create(config: Config, target, draft_vocab=None) -> Drafter:
    """A fresh DFlash drafter for `target` (context layers, mask id and draft-layer config fixed here). With
    `draft_vocab` (`.d2t`, `.t2d`, from `prepare`) it drafts over those tokens only, through its own head started
    from the target's lm_head rows of those tokens (trained with the drafter)."""
    config = dataclasses.replace(config)
    config.validate()
    head = target.model.get_output_embeddings()
    if draft_vocab is not None and getattr(head, "bias", None) is not None:
        raise DraftsmithError("data.draft_vocab: this target's lm_head has a bias, which a DFlash draft-vocabulary "
                              "head (and the speculators layout) does not hold; set data.draft_vocab: null.")
    L = target.num_layers
    if config.target_layer_ids is None and config.num_target_layers > L:
        raise DraftsmithError(f"drafter.num_target_layers={config.num_target_layers} but target '{target.name}' has "
                              f"only {L} layers.")
    layer_ids = config.target_layer_ids or default_layer_ids(L, config.num_target_layers)
    if any(not 0 <= i < L for i in layer_ids) or len(set(layer_ids)) != len(layer_ids):
        raise DraftsmithError(f"drafter.target_layer_ids={layer_ids}: need distinct output-layer ids in 0..{L - 1}.")
    mask_id = resolve_mask_token(config.mask_token_id, target.tokenizer, target.vocab_size)
    sizes = {"hidden_size": target.hidden_size, "vocab_size": target.vocab_size, "num_target_layers": L}
    if draft_vocab is not None:
        d2t, t2d = checked_draft_vocab(draft_vocab, target.vocab_size)
        if d2t.numel() < target.vocab_size:
            sizes["draft_vocab_size"] = d2t.numel()
    drafter = Drafter(config, layer_config_for(target, config.num_layers), sizes, layer_ids, mask_id)
    if drafter.lm_head is not None:
        with torch.no_grad():
            drafter.d2t.copy_(d2t)
            drafter.t2d.copy_(t2d)
            drafter.lm_head.weight.copy_(head.weight[drafter.draft_ids.to(head.weight.device)].float())
    drafter.target_info = target_info(target)
    return drafter.to(target.device).attach(target)


def load_proposer(folder: str | Path, target) -> DFlashProposer:
    """A saved DFlash folder as a Proposer for `target`."""
    return load_attached(Drafter, folder, target).proposer(target)


# --------------------------------------------------------------------------- decoding
class DFlashProposer(CutsDrafts):
    """One forward per cycle: block [x_{T-1}, MASK...] at T-1 over cached context keys of positions < T-1."""

    def __init__(self, drafter: Drafter, generator: torch.Generator | None = None):
        self.drafter, self.generator = drafter.eval(), generator
        self.required_layers = list(drafter.layer_ids)
        self.can_cut = drafter.dspark  # DSpark's confidence head (see CutsDrafts)
        self.confidence_cut = drafter.dspark and drafter.config.confidence_cut
        self.longest_draft = drafter.config.block_size - 1
        self.reset()

    def reset(self) -> None:
        """Forget the previous request."""
        self.context: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, positions 0..n-1
        self.cached = torch.zeros(0, dtype=torch.long)  # the committed tokens those positions came from

    def describe(self) -> dict:
        """Kind, options and trained parameter count."""
        described = {"kind": "dflash", **dataclasses.asdict(self.drafter.config),
                     "draft_vocab_size": self.drafter.sizes.get("draft_vocab_size"),
                     "parameters": sum(p.numel() for p in self.drafter.parameters())}
        return {**described, **self.describe_cut()} if self.drafter.dspark else described

    @torch.no_grad()
    def _catch_up(self, state: DecodeState) -> None:
        """Keep the cached context positions whose tokens still match, add those committed since (< T-1)."""
        tokens = state.tokens[0].cpu()
        common = min(self.cached.numel(), tokens.numel())
        same = int(torch.cumprod((self.cached[:common] == tokens[:common]).long(), 0).sum())
        have = 0 if self.context is None else self.context[0][0].shape[2]
        keep, end = min(have, same), tokens.numel() - 1  # the feature at j depends on tokens 0..j
        new = self.drafter.context_kv(state.features, keep, end)
        if self.context is None:
            self.context = new
        else:
            self.context = [(torch.cat([k[:, :, :keep], nk], 2), torch.cat([v[:, :, :keep], nv], 2))
                            for (k, v), (nk, nv) in zip(self.context, new)]
        self.cached = tokens[:end].clone()

    @torch.no_grad()
    def block_hidden(self, state: DecodeState) -> torch.Tensor:
        """Normed hiddens [B, H] of the block [x_{T-1}, MASK...] at the last committed token."""
        if state.tokens.shape[1] < 2:
            raise DraftsmithError("The DFlash drafter needs two committed tokens (one target feature) to draft.")
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
        """min(length, B-1) tokens from one forward: greedy, or each sampled from its own q (lossless). DSpark
        walks the block adding each position's Markov bias and stops where its confidences stop paying."""
        if shape.tree is not None:
            return self.tree(state, *shape.tree)
        drafter = self.drafter
        hidden = self.block_hidden(state)[1 : 1 + shape.length]
        logits = drafter.logits(hidden)
        if not drafter.dspark:
            if sampling.greedy:
                return Draft(drafter.to_target(logits.argmax(-1)).cpu())
            # Block positions do not see each other's draft, so each q_k is the full law of x_k given the prefix.
            q = target_probs(logits, sampling)
            rows = torch.multinomial(q, 1, generator=self.generator)[:, 0]
            return Draft(drafter.to_target(rows).cpu(), probs=drafter.to_vocabulary(q).cpu())
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
            return children(depths[0], self.drafter.to_target(rows))  # one frontier is one depth

        root = children(0, state.tokens[0, -1:].to(logits.device))[0]
        rows, parents, _ = dynamic_tree(root, grow, len(logits), top_k, total_tokens)
        return Draft(self.drafter.to_target(rows), parents)

    def _walk(self, hidden, logits, anchor, sampling: Sampling) -> Draft:
        """DSpark: position k's logits plus the Markov bias of the token drafted before it, left to right."""
        drafter, rule = self.drafter, self.stopping_rule(len(logits))
        tokens, probs, prev = [], [], anchor.reshape(())
        for k in range(len(logits)):
            bias, confidence = drafter.markov(hidden[k], prev)
            if rule is not None and not rule.keep(float(torch.sigmoid(confidence))):
                break
            row = logits[k] + bias
            if sampling.greedy:
                prev = drafter.to_target(row.argmax())
            else:
                q = target_probs(row[None], sampling)[0]
                prev = drafter.to_target(torch.multinomial(q, 1, generator=self.generator)[0])
                probs.append(q)
            tokens.append(prev)
        drafted = torch.stack(tokens).cpu() if tokens else torch.zeros(0, dtype=torch.long)
        if sampling.greedy:
            return Draft(drafted)
        return Draft(drafted, probs=drafter.to_vocabulary(torch.stack(probs) if probs else logits[:0]).cpu())
