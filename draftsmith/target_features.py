"""How a target's forward passes give features (`Target.forward`): the decoder-layer list that layer ids index,
the forward hooks that take those layers' outputs, and the grouped-query SDPA those passes use on a CPU.

Layer id i is the output of 0-based decoder layer i (see `draftsmith.target`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.errors import DraftsmithError


# --------------------------------------------------------------------------- layers and hooks
def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of a causal LM (`model.model.layers` and its look-alikes)."""
    count = getattr(model.config, "num_hidden_layers", None)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
    if isinstance(layers, nn.ModuleList) and (count is None or len(layers) == count):
        return layers
    for _name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and count is not None and len(module) == count:
            return module
    raise DraftsmithError(
        f"Cannot find the decoder layers of {type(model).__name__}: expected a ModuleList of "
        f"{count} layers (such as model.model.layers). This architecture is not supported yet."
    )


def capture_into(store: dict[int, torch.Tensor], layer_id: int):
    """A forward hook that puts a decoder layer's output (its hidden states) into `store[layer_id]`."""

    def hook(_module, _inputs, output):
        store[layer_id] = output[0] if isinstance(output, tuple) else output

    return hook


# --------------------------------------------------------------------------- attention on CPU
GROUPED_SDPA = "draftsmith_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except that on CPU a masked pass of grouped-query attention reads the
    shared keys/values in place (`enable_gqa`) instead of copying them once per query head.

    Verify and tree passes carry a mask, one-token steps do not, and transformers copies the whole cache per
    head only in the masked case: at 8192 cached tokens that copy made a 5-token verify pass cost ~3 plain
    steps (bench/long_context.py). Same numbers either way; every other case is transformers' own path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (attention_mask is None or query.device.type != "cpu" or getattr(module, "num_key_value_groups", 1) <= 1
             or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None
             or kwargs.get("softcap") is not None or kwargs.get("output_attentions"))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model: nn.Module) -> None:
    """Switch a model that uses transformers' SDPA attention to `grouped_sdpa` (identical results)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # the masks SDPA gets (without it: no mask at all)
    try:
        model.set_attn_implementation(GROUPED_SDPA)
    except (ValueError, TypeError, NotImplementedError):  # a model that refuses custom attention keeps plain SDPA
        return
