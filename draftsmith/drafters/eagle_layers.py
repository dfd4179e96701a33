"""The draft layers of the EAGLE drafter (`draftsmith.drafters.eagle`) and the two attentions they run under.

A layer projects its inputs (the first layer of EAGLE-3: [norm(embed), norm(hidden)], 2H wide; EAGLE-1:
fc(embed, feature); every later layer: norm(hidden), as a Llama decoder layer) and finishes with the output
projection, residual and MLP; the attention between is the caller's: training-time test (`ttt_attention`: step 0's
keys under a mask, each later step's own key as a diagonal) or a cached pass (`grouped_query_attention`, the
decoder's steps and trees).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)


class DraftLayer(nn.Module):
    """A decoder layer; the attention itself is the caller's (TTT or cached). `first`: the layer that reads the
    token's embedding beside the hidden (EAGLE-3); a later layer is a plain Llama decoder layer over the hidden.
    `eagle3`: the drafter is EAGLE-3 or P-EAGLE, not EAGLE-1; `norm_before_residual`: its Config's option."""

    def __init__(self, layer_config: LlamaConfig, eagle3: bool, norm_before_residual: bool, first: bool = True):
        super().__init__()
        c, H, eps = layer_config, layer_config.hidden_size, layer_config.rms_norm_eps
        self.eagle3, self.norm_before_residual = eagle3 and first, norm_before_residual
        self.plain = not first  # input_layernorm over the hidden, the residual the raw hidden
        self.head_dim, self.kv_groups = c.head_dim, c.num_attention_heads // c.num_key_value_heads
        width = 2 * H if self.eagle3 else H
        q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(width, q_width, bias=False), "k_proj": nn.Linear(width, kv_width, bias=False),
            "v_proj": nn.Linear(width, kv_width, bias=False), "o_proj": nn.Linear(q_width, H, bias=False)})
        self.mlp = LlamaMLP(layer_config)
        if self.eagle3 or self.plain:
            self.input_layernorm = LlamaRMSNorm(H, eps=eps)
        if self.eagle3:
            self.hidden_norm = LlamaRMSNorm(H, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=eps)

    def project(self, embeds, hidden, cos, sin):
        """(q, k, v [B, heads, n, d] with RoPE, not yet repeated for GQA; residual). EAGLE-1: hidden = fc(embed, f).
        A later layer does not read `embeds`."""
        x = residual = hidden
        if self.plain:
            x = self.input_layernorm(hidden)
        elif self.eagle3:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        batch, n, _ = x.shape
        q, k, v = (self.self_attn[name](x).view(batch, n, -1, self.head_dim).transpose(1, 2)
                   for name in ("q_proj", "k_proj", "v_proj"))
        return (*apply_rotary_pos_emb(q, k, cos, sin), v, residual)

    def finish(self, attention: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP block. `attention` [B, heads, n, d]."""
        batch, _, n, _ = attention.shape
        hidden = residual + self.self_attn["o_proj"](attention.transpose(1, 2).reshape(batch, n, -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def grouped_query_attention(q, keys, values, mask=None) -> torch.Tensor:
    """SDPA for q [B, heads, n, d] over keys/values [B, kv_heads, S, d] with `mask` [n, S] or None.

    The query heads that share a key/value head are stacked along the query axis instead of copying
    the keys/values once per head (repeat_kv): same result, but nothing proportional to the context
    is copied, which at a long context was most of the drafter's cost per step."""
    batch, heads, n, dim = q.shape
    groups = heads // keys.shape[1]
    stacked = q.reshape(batch, keys.shape[1], groups * n, dim)  # query head h reads key/value head h // groups
    mask = None if mask is None else mask.repeat(groups, 1)
    return F.scaled_dot_product_attention(stacked, keys, values, mask).reshape(batch, heads, n, dim)


def ttt_attention(q, keys, values, sees) -> torch.Tensor:
    """Step-j attention: step-0 keys as `sees` allows, plus every later step's key at the query's own index.

    Those are a diagonal: scored as row-wise dot products, joined to the step-0 scores in one softmax."""
    scale = q.shape[-1] ** -0.5
    scores = (q @ keys[0].transpose(-1, -2)) * scale
    scores = scores.masked_fill(~sees, float("-inf"))
    diagonal = [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    length = scores.shape[-1]
    out = probs[..., :length] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + probs[..., length + i : length + i + 1] * v
    return out
