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

DSpark (`variant: dspark`) adds two small heads on the same backbone, which still runs once per block:
- a sequential (Markov) head: block position k's logits get the low-rank bias markov_w2(markov_w1[prev_k]), prev_k
  the block token just before k (the anchor for k = 1; in decoding, the token drafted at k-1), so drafting walks
  the block left to right with this cheap bias only;
- a confidence head: sigmoid(confidence([hidden_k; markov_w1[prev_k]])) predicts that position k is accepted,
  trained (BCE, weight `confidence_weight`) against whether the biased draft's top token is the target's there.
  Decoding cuts each block where the confidences stop paying for their verify cost (`dflash_proposer`).
These are the speculators library's DSpark heads (`markov_head_type: vanilla`, `confidence_head_with_markov`) in
the block layout whose position 0 is the anchor (its `sample_from_anchor: false`).

This module holds the options, the drafter (the pieces training and decoding share, saving, loading) and how one is
built for a target; the training blocks and their loss are in `dflash_training`, the draft layers and the masks of the
block layout in `dflash_layers`, the decode-time proposer in `dflash_proposer`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

from draftsmith.config import build
from draftsmith.data.vocab import checked_draft_vocab
from draftsmith.drafters import ReadsTarget, load_attached, read_folder, save_folder, target_info
from draftsmith.drafters.base import DraftRows
from draftsmith.drafters.dflash_layers import Layer
from draftsmith.drafters.dflash_proposer import DFlashProposer
from draftsmith.drafters.dflash_training import BlockTraining
from draftsmith.drafters.losses import LossOptions
from draftsmith.errors import DraftsmithError


@dataclass
class Config(LossOptions):
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
    """training blocks per sequence, anchors drawn inside loss-masked spans; 0: every allowed anchor, up to the
    speculators trainer's 512"""
    gamma: float | None = None
    """position weight w_k = exp(-(k-1)/gamma); null: 7 for B >= 16, else 4 (the DFlash paper's values)"""
    position_weighting: str = "decay"
    """decay: the fixed weights w_k above; dpace: D-PACE, each block's weights from the drafter's own confidence
    there (w_k = sum over counted j >= k of prod_{i <= j} ((1 - dpace_alpha) c_i + dpace_alpha), c_i = exp(-cross
    entropy) at position i, held constant), so a position weighs what the accepted runs through it are worth"""
    dpace_alpha: float = 0.5
    """D-PACE: smoothing of the confidences (1 = every weight is the number of counted positions from k on)"""
    mask_token_id: int | None = None
    """MASK id; null: the tokenizer's mask token, else an id no text maps to (written into the config)"""
    anchor_seed: int = 0
    """seeds the anchor draws (with each batch's sample ids, so a resumed run draws the same anchors)"""
    fresh_anchors: bool = False
    """draw a sequence's anchors afresh every time it is trained on, as the reference trainers do (the draw is also
    seeded by the micro-batch's place in the training stream, so a resumed run still draws the same); false: the
    same anchors in every epoch"""
    variant: str = "dflash"
    """dflash, or dspark: DFlash plus a Markov logit-bias head and a confidence head that cuts each block"""
    markov_rank: int = 256
    """DSpark: rank r of the Markov bias markov_w2(markov_w1[previous token]) (r x vocabulary, twice)"""
    confidence_weight: float = 1.0
    """DSpark: weight of the confidence head's loss (BCE against whether the position's draft was the target's)"""
    confidence_cut: bool = True
    """DSpark: cut each block where the confidences stop paying for their verify cost (false: draft the whole block)"""
    attention: str = "auto"
    """training attention over the blocks, the same loss each way: sdpa (a boolean mask over all blocks), flex
    (flex_attention with a block mask, compiled), blockwise (context and own-block scores under one softmax: no block
    scored against another, so its cost grows linearly with the blocks) or auto: flex on CUDA, blockwise on a CPU
    (torch has no flex_attention backward on CPUs)"""

    def validate(self) -> None:
        self.validate_loss()
        if self.block_size < 2:
            raise DraftsmithError(f"drafter.block_size must be at least 2, got {self.block_size}.")
        if self.num_layers < 1:
            raise DraftsmithError(f"drafter.num_layers must be at least 1, got {self.num_layers}.")
        if self.num_target_layers < 2 and self.target_layer_ids is None:
            raise DraftsmithError(f"drafter.num_target_layers must be at least 2, got {self.num_target_layers}.")
        if self.anchors_per_sequence < 0:
            raise DraftsmithError(f"drafter.anchors_per_sequence must be 0 (every allowed anchor) or more, got "
                                  f"{self.anchors_per_sequence}.")
        if self.gamma is not None and self.gamma <= 0:
            raise DraftsmithError(f"drafter.gamma must be positive, got {self.gamma}.")
        if self.variant not in ("dflash", "dspark"):
            raise DraftsmithError(f"drafter.variant must be dflash or dspark, got {self.variant!r}.")
        if self.variant == "dspark" and self.markov_rank < 1:
            raise DraftsmithError(f"drafter.markov_rank must be at least 1 for variant dspark, got {self.markov_rank}.")
        if self.confidence_weight < 0:
            raise DraftsmithError(f"drafter.confidence_weight must be >= 0, got {self.confidence_weight}.")
        if self.position_weighting not in ("decay", "dpace"):
            raise DraftsmithError(f"drafter.position_weighting must be decay or dpace, got {self.position_weighting!r}.")
        if not 0.0 <= self.dpace_alpha <= 1.0:
            raise DraftsmithError(f"drafter.dpace_alpha must be in [0, 1], got {self.dpace_alpha}.")
        if self.attention not in ("auto", "sdpa", "flex", "blockwise"):
            raise DraftsmithError(f"drafter.attention must be auto, sdpa, flex or blockwise, got {self.attention!r}.")

    def position_weights(self) -> list[float]:
        """w_k for block positions k = 1..B-1."""
        gamma = self.gamma or (7.0 if self.block_size >= 16 else 4.0)
        return [math.exp(-(k - 1) / gamma) for k in range(1, self.block_size)]


def default_layer_ids(num_layers: int, count: int) -> list[int]:
    """`count` output-layer ids spread over a target of `num_layers` layers (DESIGN §3; `dflash:N` in capture)."""
    return [round(1 + i * (num_layers - 4) / (count - 1)) for i in range(count)]


# --------------------------------------------------------------------------- the model
class Drafter(BlockTraining, ReadsTarget, nn.Module):
    """DFlash draft layers on the frozen target; `forward(batch, target_head)` is the training loss (from
    `dflash_training`)."""

    named = "This DFlash drafter"

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

    def trained_for(self) -> dict:
        """The target's sizes this drafter was made for (it reads the target's frozen embedding and lm_head)."""
        s = self.sizes
        return {"hidden_size": s["hidden_size"], "vocab_size": s["vocab_size"], "num_layers": s["num_target_layers"]}

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
        over its whole vocabulary, or the drafter's own head over its draft vocabulary (see `rows`)."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        target = self._target()
        return target.model.get_output_embeddings()(hidden.to(target.dtype)).float()

    @property
    def rows(self) -> DraftRows:
        """The target token each head row drafts (row i: i + d2t[i] over a draft vocabulary, else i)."""
        return DraftRows.from_offsets(self.d2t, self.sizes["vocab_size"])

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """Target id of each head row (i + d2t[i]); None: the rows are the target's whole vocabulary."""
        return self.rows.ids

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
