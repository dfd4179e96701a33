"""The key/value cache a speculative decoder can roll back by position, on any attention layout.

A verify pass appends the draft's keys and values, and the rejected ones are dropped afterwards. transformers'
sliding-window cache layers (Mistral, Gemma, Qwen with `use_sliding_window`, `layer_types`) keep only the last
`window - 1` positions and cannot be cropped once past the window, so a rollback would lose keys the next pass
needs. `rollback_cache` keeps every position in every attention layer instead (more memory on long contexts), and the
window lives in the attention masks alone: the model's own masks apply it by position for chains and prompts, and
`tree_attention_mask` for trees. What each layer attends to is then exactly what plain decoding attends to.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from draftsmith.errors import DraftsmithError

WINDOWED = ("full_attention", "sliding_attention")
"""the layer types whose attention a tree mask can express: the full context, or the last `window` positions"""


def attention_windows(config) -> dict[str, int | None]:
    """Layer type -> how many positions back a query attends (None: all of them), read as transformers reads the
    config when it builds the model's cache and masks ("full_attention" alone for most models)."""
    layer_types, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return {kind: options.get("sliding_window") if kind == "sliding_attention" else None
            for kind, options in zip(layer_types, kwargs)}


def rollback_cache(config) -> DynamicCache:
    """The target's (or a draft model's) DynamicCache with every sliding-window layer replaced by a full one, so
    that any pass can be rolled back by position; the masks keep applying the window."""
    cache = DynamicCache(config=config)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    return cache


def keep_cache(cache: DynamicCache, start: int, keep: torch.Tensor) -> None:
    """Keep cache positions [0, start) plus `start + keep` (sorted offsets), drop the rest.

    A tree's accepted path is moved in place into the slots right after `start`, then the tail is
    cropped: the cost is O(accepted tokens), not O(context) as re-indexing the whole cache would be."""
    length = cache.get_seq_length()
    count = keep.numel()
    if not bool((keep == torch.arange(count)).all()):  # a chain prefix needs no move, only the crop
        for layer in cache.layers:
            if not hasattr(layer, "keys") or getattr(layer, "is_sliding", False):
                raise DraftsmithError(
                    f"Tree verification needs a cache that keeps every position (`kv_cache.rollback_cache`); this one "
                    f"has a {type(layer).__name__}.")
            source = (start + keep).to(layer.keys.device)
            # index_select copies the few kept slots first, so overlapping source/destination is safe.
            layer.keys[..., start : start + count, :] = layer.keys.index_select(-2, source)
            layer.values[..., start : start + count, :] = layer.values.index_select(-2, source)
    if length > start + count:
        cache.crop(-(length - start - count))


def tree_attention_mask(sees: torch.Tensor, past: int, dtype: torch.dtype, positions: torch.Tensor | None = None,
                        windows: dict[str, int | None] | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive 4D mask [1, 1, n, past + m] for n queries: each sees the `past` cached positions and the
    last m (tree) positions that its row of `sees` [n, m] allows (itself and its ancestors).

    With `windows` (`attention_windows` of the model) and `positions` (the m tree positions' position ids; the
    queries are the last n of them), a sliding-window layer's queries also lose every key `window` or more positions
    behind them, as that layer's own mask does in plain decoding; where layer types differ the masks come as a dict
    by layer type, which is how transformers' models take per-type masks. Additive (0 / most negative) rather than
    boolean so that eager attention, which adds the mask to the scores, and SDPA read it the same way."""
    allowed = torch.cat([torch.ones(sees.shape[0], past, dtype=torch.bool), sees], dim=1)
    windows = windows or {"full_attention": None}
    unknown = sorted(set(windows) - set(WINDOWED))
    if unknown:
        raise DraftsmithError(f"Tree attention masks cover full and sliding-window attention layers; this model also "
                              f"has {', '.join(unknown)} layers. Use a chain draft (--draft-length) instead.")
    masks = {}
    for window in set(windows.values()):
        seen = allowed
        if window is not None:
            keys = torch.cat([torch.arange(past), positions.cpu()])
            queries = positions.cpu()[-sees.shape[0]:]
            seen = allowed & (keys[None, :] > queries[:, None] - window)
        masks[window] = torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[None, None]
    if len(masks) == 1:
        return next(iter(masks.values()))
    return {kind: masks[window] for kind, window in windows.items()}
