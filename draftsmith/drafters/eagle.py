"""EAGLE-3, P-EAGLE and EAGLE-1 drafters (DESIGN §3): decoder layers (one by default) on the target's features.

EAGLE-3: fc(low, mid, high features) -> hidden; attention reads [norm(embed), norm(hidden)] (2H),
residual on the hidden; draft-vocabulary head; training-time test (TTT) over k steps. P-EAGLE (parallel
drafting): EAGLE-3's layer, but steps j >= 1 read a mask token and a learned `mask_hidden` (fused like the
target's features) instead of the previous step's token and output, so at decode time the k steps are k
rows of one forward. EAGLE-1: fc(embed, top feature) with bias, no input norm, the target's head, feature
regression + 0.1 CE. With num_layers > 1 (EAGLE-3 and P-EAGLE), plain Llama decoder layers follow the first, as in
the speculators layout; each step's output is the last layer's.

Indexing: index t reads feature f_t and token x_{t+1} at position t and predicts x_{t+2}; TTT step
j at index t runs at position t + j, reads x_{t+1+j}, and learns the target's distribution at
t+1+j. `loss_mask[s] = 1` marks tokens to learn: a prediction counts when the token it predicts is.
Weights use the speculators / vLLM EAGLE-3 names (`fc`, `layers.0.*`, `norm`, `lm_head`, `d2t`,
`t2d`). The frozen target parts (embedding, final norm, lm_head) are never stored: a drafter is
attached to its target (`attach`), checked by fingerprint, and reads them from there, as engines do.

This module holds the options, the drafter (the pieces training and decoding share, saving, loading) and how one is
built for a target; the training-time test and its loss are in `eagle_training`, the draft layer and its attentions in
`eagle_layers`, the decode-time proposer (chains and EAGLE-2 trees over a cache of committed positions) in
`eagle_proposer`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from draftsmith.config import build
from draftsmith.data.vocab import checked_draft_vocab
from draftsmith.drafters import ReadsTarget, load_attached, read_folder, save_folder, target_info
from draftsmith.drafters.base import DraftRows
from draftsmith.drafters.eagle_layers import DraftLayer, grouped_query_attention
from draftsmith.drafters.eagle_proposer import EagleProposer, ParallelEagleProposer
from draftsmith.drafters.eagle_training import TrainingTimeTest
from draftsmith.drafters.losses import LossOptions
from draftsmith.errors import DraftsmithError


@dataclass
class Config(LossOptions):
    """Options of the EAGLE drafter."""

    variant: Literal["eagle3", "peagle", "eagle1"] = "eagle3"
    """eagle3 (fused low/mid/high features, TTT, draft-vocabulary head), peagle (P-EAGLE: eagle3 whose later
    steps read a mask token and a learned mask hidden, so one forward drafts every step) or eagle1 (top feature,
    feature regression)"""
    layers: list[int] | None = None
    """target feature layers (output-layer ids); default 1, L/2-1, L-4 for eagle3 and L-1 for eagle1"""
    ttt_steps: int | None = None
    """training-time-test steps k; default 7 for eagle3 and peagle (for peagle also the longest chain one forward
    drafts), 1 for eagle1"""
    mask_token_id: int | None = None
    """peagle: the token whose (target) embedding fills the steps after the first; default the tokenizer's mask
    token, else its pad token, else its end-of-sequence token"""
    step_weight: float = 0.8
    """loss = sum over TTT steps j of step_weight^j * loss_j"""
    cod_ratio: float = 1.0
    """eagle3, peagle: TTT step j >= 1 trains on a share max(cod_ratio^j, cod_ratio_min) of the indices step 0 trains
    on, nested (each inside the step before's), drawn afresh every batch: P-EAGLE's conditional-drop (COD) sampling,
    the speculators trainer's down_sample_ratio (its P-EAGLE default 0.7), so the later steps cost less of a training
    step. 1: every step at every index. Validation scores every index either way"""
    cod_ratio_min: float = 0.2
    """the smallest share cod_ratio leaves a step (speculators' down_sample_ratio_min)"""
    intermediate_size: int | None = None
    """MLP width of the draft layer; default the target's"""
    num_layers: int = 1
    """eagle3, peagle: decoder layers; the first reads [embed, hidden] (2H), each later one is a plain Llama layer
    over the hidden (the speculators layout). More layers give P-EAGLE's positions after the first, which never see
    the tokens drafted before them, more to work with, at one more layer per forward"""
    norm_before_residual: bool = False
    """eagle3: take the residual from the normed hidden instead of the raw one"""
    fc_norm: bool = False
    """eagle3: an RMSNorm on each target feature layer before fc, fc(norm_a(low), norm_b(mid), norm_c(high))
    (EAGLE 3.1, with norm_output; speculators' fc_norm)"""
    norm_output: bool = False
    """eagle3: each step's output goes through the final norm before it feeds the next step and the head, so its
    size does not drift over the steps (EAGLE 3.1, with fc_norm; speculators' norm_output)"""
    init_head_from_target: bool = False
    """eagle3: start lm_head from the target's lm_head rows of the draft vocabulary (final-norm scale folded in)"""
    feature_noise: float = 0.1
    """eagle1: U(-a, a) noise added to the input features during training"""
    token_loss_weight: float = 0.1
    """eagle1: weight of the cross-entropy term next to the feature regression"""
    labels: Literal["head", "topk"] = "head"
    """what the loss learns: head = the target's distribution from its last layer through its frozen head (a stored
    top-k, data.topk_logits, then only supplies the argmax); topk = the stored top-k logits alone (no head pass;
    the vocabulary beyond the top k counts as zero)"""

    def validate(self) -> None:
        self.validate_loss(sparse_labels=self.labels == "topk")
        if self.ttt_steps is not None and self.ttt_steps < 1:
            raise DraftsmithError(f"eagle: ttt_steps must be at least 1, got {self.ttt_steps}.")
        if self.num_layers < 1 or (self.variant == "eagle1" and self.num_layers != 1):
            raise DraftsmithError(f"eagle: num_layers must be at least 1 (exactly 1 for eagle1), got {self.num_layers}.")
        if self.variant == "eagle1" and (self.fc_norm or self.norm_output):
            raise DraftsmithError("eagle: fc_norm and norm_output (EAGLE 3.1) are options of eagle3 and peagle.")
        if self.layers is not None and self.variant != "eagle1" and len(self.layers) != 3:
            raise DraftsmithError(f"{self.variant} fuses three feature layers; got layers={self.layers}.")
        if not (0 < self.cod_ratio <= 1 and 0 < self.cod_ratio_min <= 1):
            raise DraftsmithError(f"eagle: cod_ratio and cod_ratio_min must be in (0, 1], got {self.cod_ratio} and "
                                  f"{self.cod_ratio_min}.")
        if self.cod_ratio < 1 and self.variant == "eagle1":
            raise DraftsmithError("eagle: cod_ratio (COD sampling of the TTT steps) is an option of eagle3 and peagle.")
        if self.mask_token_id is not None and self.variant != "peagle":
            raise DraftsmithError("eagle: mask_token_id is an option of the peagle variant.")


# --------------------------------------------------------------------------- the model
class Drafter(TrainingTimeTest, ReadsTarget, nn.Module):
    """EAGLE-3 / P-EAGLE / EAGLE-1 drafter. `forward(batch, target_head)` is the training loss (so DDP wraps it), from
    `eagle_training`."""

    named = "This EAGLE drafter"

    def __init__(self, config: Config, layer_config: LlamaConfig):
        super().__init__()
        self.eagle3 = config.variant != "eagle1"  # fused features, draft-vocabulary head (eagle3 and peagle)
        self.parallel = config.variant == "peagle"
        if config.ttt_steps is None:
            config = dataclasses.replace(config, ttt_steps=7 if self.eagle3 else 1)
        self.config, self.layer_config = config, layer_config
        # target_name, target_architectures (what exporters name as the verifier), target_fingerprint
        self.target_info: dict = {}
        self.target = None  # the frozen target whose embedding this drafter reads (`attach`); not a submodule
        H, V, N = layer_config.hidden_size, layer_config.vocab_size, layer_config.draft_vocab_size
        self.last_layer = layer_config.target_num_layers - 1
        fc_in = 3 * H if self.eagle3 else 2 * H
        self.fc = nn.Linear(fc_in, H, bias=not self.eagle3)
        self.layers = nn.ModuleList([DraftLayer(layer_config, self.eagle3, config.norm_before_residual, first=i == 0)
                                     for i in range(config.num_layers)])
        self.rotary_emb = LlamaRotaryEmbedding(layer_config)
        if self.eagle3:
            self.norm = LlamaRMSNorm(H, eps=layer_config.rms_norm_eps)
            self.lm_head = nn.Linear(H, N, bias=False)
        if config.fc_norm:  # one per feature layer, over the target's hidden size
            self.fc_norm = nn.ModuleList([LlamaRMSNorm(layer_config.target_hidden_size, eps=layer_config.rms_norm_eps)
                                          for _ in range(3)])
        if self.parallel:  # what the steps after the first read in place of the target's three features
            self.mask_hidden = nn.Parameter(torch.randn(1, 1, 3 * layer_config.target_hidden_size))
        self.register_buffer("d2t", torch.zeros(N, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(V, dtype=torch.bool))

    @property
    def required_layers(self) -> list[int]:
        """What capture must record: the input layers plus the last layer (the training target)."""
        return list(dict.fromkeys([*self.config.layers, self.last_layer]))

    def trained_for(self) -> dict:
        """The target's sizes this drafter was made for (it reads the target's frozen embedding)."""
        lc = self.layer_config
        return {"hidden_size": lc.target_hidden_size, "vocab_size": lc.vocab_size, "num_layers": lc.target_num_layers}

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) embedding of `ids`."""
        if self.target is None:
            raise DraftsmithError("This drafter is not attached to a target: call drafter.attach(target) first.")
        return self.target.embed(ids.to(self.target.device))

    @property
    def rows(self) -> DraftRows:
        """The target token each row of the head drafts (draft id i: target id i + d2t[i])."""
        return DraftRows.from_offsets(self.d2t, self.t2d.numel())

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target id of every draft-vocabulary entry (i + d2t[i])."""
        return self.rows.ids

    # ---- pieces shared by training and decoding
    def fuse(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        """Step-0 hidden from target features: fc(low, mid, high) for EAGLE-3, the top feature for EAGLE-1."""
        inputs = [features[layer].to(self.fc.weight.dtype) for layer in self.config.layers]
        if self.config.fc_norm:
            inputs = [norm(x) for norm, x in zip(self.fc_norm, inputs)]
        inputs = torch.cat(inputs, dim=-1)
        return self.fc(inputs) if self.eagle3 else inputs

    def mask_inputs(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """P-EAGLE's inputs for the steps after the first, one per entry of `like` [B, n]: (mask token ids [B, n],
        the fused mask hidden [B, n, H])."""
        width = self.mask_hidden.shape[-1] // 3
        features = dict(zip(self.config.layers, self.mask_hidden[0, 0].split(width)))
        hidden = self.fuse(features).to(like.device)
        ids = torch.full_like(like, self.config.mask_token_id)
        return ids, hidden.expand(*like.shape, -1)

    def output(self, hidden: torch.Tensor) -> torch.Tensor:
        """A step's output hidden from the last layer's (final-normed with norm_output): what the next step reads."""
        return self.norm(hidden) if self.config.norm_output else hidden

    def inputs(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """What the layers read for tokens `ids` [B, n] and hidden [B, n, H] at `positions` [B, n]: (embeds, the
        first layer's hidden (EAGLE-1: fc(embed, feature)), (cos, sin))."""
        embeds = self.embed_tokens(ids).to(hidden.device, hidden.dtype)
        if not self.eagle3:
            hidden = self.fc(torch.cat([embeds, hidden], dim=-1))
        return embeds, hidden, self.rotary_emb(hidden, positions)

    def logits(self, hidden: torch.Tensor, target_head) -> torch.Tensor:
        """Draft logits: over the draft vocabulary (EAGLE-3) or the target's (EAGLE-1, target head)."""
        if not self.eagle3:
            return target_head(hidden)
        return self.lm_head(hidden if self.config.norm_output else self.norm(hidden))

    def step(self, ids, hidden, positions, past=None, mask=None, causal: bool = False):
        """One cached pass over n inputs attending to `past` (one (keys, values) per layer) and themselves, as
        `mask` [n, past+n] allows (None: everything; `causal`: no past, each input sees itself and those before it).
        Returns (output hidden, past + new: one (keys, values) per layer)."""
        if causal and (past is not None or mask is not None):
            raise ValueError("causal=True is for a pass without past and without a mask")
        embeds, hidden, (cos, sin) = self.inputs(ids, hidden, positions)
        grown = []
        for i, layer in enumerate(self.layers):
            q, k, v, residual = layer.project(embeds, hidden, cos, sin)
            keys, values = (k, v) if past is None else (torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2))
            if causal:  # a whole prompt: SDPA's causal kernel, never an [n, n] mask (3x faster at 4096 tokens on CPU)
                attention = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
            else:
                attention = grouped_query_attention(q, keys, values, mask)
            hidden = layer.finish(attention, residual)
            grown.append((keys, values))
        return self.output(hidden), tuple(grown)

    # ---- after training
    @torch.no_grad()
    def narrow_vocab(self, token_counts: torch.Tensor, size: int) -> None:
        """Keep the `size` draft-vocabulary entries most frequent in `token_counts` [V] (ties: lower id):
        a smaller, cheaper EAGLE-3 head whose logits equal the old head's on the tokens it keeps."""
        if not self.eagle3 or not 1 <= size <= self.d2t.numel():
            raise DraftsmithError(f"Can only narrow an EAGLE-3 head of {self.d2t.numel()} entries to 1..that many; got {size}.")
        ids = self.draft_ids
        order = torch.sort(-token_counts.to(ids.device)[ids].long(), stable=True).indices[:size]
        keep = torch.sort(order).values  # draft ids stay sorted by target id, as build_draft_vocab makes them
        head = nn.Linear(self.lm_head.in_features, size, bias=False).to(self.lm_head.weight)
        head.weight.copy_(self.lm_head.weight[keep])
        self.lm_head = head
        self.t2d.zero_()
        self.t2d[ids[keep]] = True
        self.d2t = ids[keep] - torch.arange(size, device=ids.device)
        self.layer_config.draft_vocab_size = size

    # ---- saving
    def save_pretrained(self, folder: str | Path) -> None:
        """config.json (draftsmith_kind, options, draft-layer LlamaConfig) + model.safetensors."""
        save_folder(folder, "eagle", {"config": dataclasses.asdict(self.config), "transformer_layer_config": self.layer_config.to_dict()}, self)

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Drafter:
        """Load a folder written by `save_pretrained`, attached to `target` when given."""
        meta, tensors, target_record = read_folder(folder, "eagle")
        drafter = cls(build(Config, meta["config"]), LlamaConfig.from_dict(meta["transformer_layer_config"]))
        tensors.pop("embed_tokens.weight", None)  # folders written before draftsmith stopped storing it
        drafter.load_state_dict(tensors)
        drafter.target_info = target_record
        return drafter if target is None else drafter.attach(target)

    def proposer(self, target, generator: torch.Generator | None = None) -> EagleProposer:
        """The decode-time view of this drafter for `target`."""
        return (ParallelEagleProposer if self.parallel else EagleProposer)(self, target, generator)


# --------------------------------------------------------------------------- building
def create(config: Config, target, draft_vocab=None) -> Drafter:
    """A fresh drafter for `target`; `draft_vocab` (with `.d2t`, `.t2d`) restricts EAGLE-3's head."""
    config = dataclasses.replace(config)
    eagle3 = config.variant != "eagle1"
    if config.layers is None:
        config.layers = target.default_eagle3_layers() if eagle3 else [target.num_layers - 1]
    if config.variant == "peagle" and config.mask_token_id is None:
        config.mask_token_id = default_mask_token(target)
    config.validate()
    if not eagle3 and config.layers != [target.num_layers - 1]:
        raise DraftsmithError(f"eagle1 reads the target's last layer ({target.num_layers - 1}); got {config.layers}.")
    d2t, t2d = checked_draft_vocab(draft_vocab if eagle3 else None, target.vocab_size)
    drafter = Drafter(config, _layer_config(target, config, d2t.numel())).to(target.device)
    drafter.target_info = target_info(target)
    drafter.attach(target)
    with torch.no_grad():
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)
        if eagle3 and config.init_head_from_target:
            # final_norm(ones) is the norm's per-channel scale, so norm(h) @ W.T matches the target's head.
            scale = target.final_norm(torch.ones(1, target.hidden_size, device=target.device, dtype=target.dtype))
            head = target.model.get_output_embeddings().weight[drafter.draft_ids]
            drafter.lm_head.weight.copy_(head * scale.float())
    return drafter


def default_mask_token(target) -> int:
    """The token P-EAGLE's later steps read when the recipe names none: the tokenizer's mask token, else its pad
    token, else its end-of-sequence token (the speculators trainer's order, without adding a token)."""
    tokenizer = target.tokenizer
    for name in ("mask_token_id", "pad_token_id", "eos_token_id"):
        token = getattr(tokenizer, name, None)
        if isinstance(token, int) and 0 <= token < target.vocab_size:
            return token
    raise DraftsmithError("peagle: the target's tokenizer has no mask, pad or end-of-sequence token; set "
                          "drafter.mask_token_id to a token id of the target.")


def _layer_config(target, config: Config, draft_vocab_size: int) -> LlamaConfig:
    """The draft layer's LlamaConfig, shaped like one of the target's layers."""
    tc = target.config
    heads, get = tc.num_attention_heads, lambda key, default: getattr(tc, key, None) or default
    rope = get("rope_parameters", {"rope_type": "default", "rope_theta": get("rope_theta", 1e4)})
    rope = rope.get("full_attention", rope)  # models with per-layer-type rope settings
    return LlamaConfig(
        hidden_size=target.hidden_size, intermediate_size=config.intermediate_size or tc.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=heads, head_dim=get("head_dim", target.hidden_size // heads),
        num_key_value_heads=get("num_key_value_heads", heads), rms_norm_eps=get("rms_norm_eps", 1e-6),
        hidden_act=get("hidden_act", "silu"), rope_parameters=dict(rope),
        max_position_embeddings=tc.max_position_embeddings, vocab_size=target.vocab_size, tie_word_embeddings=False,
        draft_vocab_size=draft_vocab_size, target_num_layers=target.num_layers, target_hidden_size=target.hidden_size,
        # the target's special ids, so that exported layer configs do not carry Llama's defaults
        bos_token_id=getattr(tc, "bos_token_id", None), eos_token_id=getattr(tc, "eos_token_id", None),
        pad_token_id=getattr(tc, "pad_token_id", None),
    )


def load_proposer(folder: str | Path, target) -> EagleProposer:
    """A saved drafter folder as a Proposer for `target` (checked to have matching sizes)."""
    return load_attached(Drafter, folder, target).proposer(target)
