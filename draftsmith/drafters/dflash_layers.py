"""The draft layers of the DFlash drafter (`draftsmith.drafters.dflash`) and the attention masks of its layout.

A layer's block queries attend to keys/values of the context (positions before the block's anchor) and of the
block itself (bidirectional inside it). Training lays N blocks side by side after the context and masks each to
its own anchor: a boolean mask for SDPA, the same rule as a flex_attention BlockMask (compiled on CUDA), or a
`BlockLayout`, which computes that rule as two score products (context, own block) under one softmax, so that its
cost grows with blocks x context instead of (blocks x block size)^2 and many blocks per sequence fit on a CPU.
Decoding needs no mask: one block, the whole context before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, rotate_half


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


@dataclass(frozen=True)
class BlockLayout:
    """N blocks of `block_size` queries side by side, block n seeing the context keys j < anchors[:, n] and its own
    block (the rule of `block_attention_mask`), for `blockwise_attention`."""

    anchors: torch.Tensor  # [b, N]
    length: int  # context positions
    block_size: int


def blockwise_attention(q, context_kv, k, v, layout: BlockLayout) -> torch.Tensor:
    """Attention [b, h, N*B, d] of block queries `q` over the context keys/values `context_kv` ([b, kv, L, d] each)
    before each block's anchor and the keys/values `k`, `v` [b, kv, N*B, d] of the query's own block: one softmax
    over both, as SDPA with `block_attention_mask` computes it, without scoring any block against another."""
    (b, h, n, d), size = q.shape, layout.block_size
    blocks = n // size
    group = h // k.shape[1]
    kc, vc, k, v = (t.repeat_interleave(group, 1) if group > 1 else t for t in (*context_kv, k, v))
    scale = d ** -0.5
    before = torch.arange(layout.length, device=q.device) < layout.anchors.repeat_interleave(size, 1)[..., None]
    context = (q @ kc.transpose(-1, -2) * scale).masked_fill(~before[:, None], float("-inf"))
    q_blocks = q.view(b, h, blocks, size, d)
    own = q_blocks @ k.view(b, h, blocks, size, d).transpose(-1, -2) * scale  # [b, h, N, B, B]
    p = torch.softmax(torch.cat([context.view(b, h, blocks, size, -1), own], -1).float(), -1).to(q.dtype)
    p_context, p_own = p[..., : layout.length], p[..., layout.length:]
    out = p_context.reshape(b, h, n, layout.length) @ vc
    return out + (p_own @ v.view(b, h, blocks, size, d)).view(b, h, n, d)


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


# --------------------------------------------------------------------------- the layers
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
        BlockMask of the same rule, a `BlockLayout`, or None (everything visible)."""
        b, n = x.shape[:2]
        q = _rope(self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)).transpose(1, 2), cos, sin)
        k, v = self.key_value(x, cos, sin)
        if isinstance(mask, BlockLayout):
            out = blockwise_attention(q, context_kv, k, v, mask)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))
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
