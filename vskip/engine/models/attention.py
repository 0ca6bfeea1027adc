"""Grouped-query attention without copying the cache, for transformers verifiers on a CPU.

transformers' ``sdpa`` attention repeats every key/value head of the cache to the number of query
heads before each call whenever a mask is given (on a CPU, always for a multi-token call): the
whole cache is copied in every layer of every verification. PyTorch's
``scaled_dot_product_attention`` takes ``enable_gqa=True`` and reads the shared heads in place.
This registers that variant under :data:`NAME` for a model whose attention is ``sdpa``; it
computes the same attention.

It also lets a batched forward *pack* its rows (:func:`packed`): rows of different lengths (one
verifying 3 positions, another 17) go through the model as one sequence of their real positions
laid end to end, so the projections and MLPs, most of a forward's work, compute no padding. Only
attention runs in the padded layout, each row against its own row of the ragged cache.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch.nn.functional as F

NAME = "vskip_sdpa_gqa"

#: (row, col, rows, width) of the packed forward in progress (:func:`packed`), or None
_PACKED: ContextVar = ContextVar("vskip_packed_rows", default=None)


@contextmanager
def packed(row, col, rows: int, width: int):
    """Within this block a forward's inputs [1, N] are several rows' positions laid end to end:
    position i is column ``col[i]`` of row ``row[i]`` in a padded [rows, width] layout, the layout
    of its attention mask and of the rows of the cache that :func:`sdpa_gqa` attends to."""
    token = _PACKED.set((row, col, rows, width))
    try:
        yield
    finally:
        _PACKED.reset(token)


def sdpa_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """query [B, H, T, D]; key/value [B, KVH, S, D]; mask broadcastable to [B, H, T, S] or None.
    Returns ([B, T, H, D], None) as transformers' attention functions do. In a :func:`packed`
    forward the query is [1, H, N, D], spread to its rows for attention and gathered back."""
    p = _PACKED.get()
    if p is not None:
        row, col, rows, width = p
        out, _ = _attend(module, spread(query, row, col, rows, width), key, value, attention_mask, dropout, scaling,
                         is_causal)
        return out[row, col][None], None
    return _attend(module, query, key, value, attention_mask, dropout, scaling, is_causal)


def spread(t, row, col, rows: int, width: int):
    """Packed [1, heads, N, hd] into the padded layout [rows, heads, width, hd] (zeros between):
    position i to column ``col[i]`` of row ``row[i]``."""
    out = t.new_zeros((rows, t.shape[1], width, t.shape[3]))
    out[row, :, col] = t[0].transpose(0, 1)
    return out


def _attend(module, query, key, value, attention_mask, dropout, scaling, is_causal):
    q_len = query.shape[2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = q_len > 1 and attention_mask is None and causal
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_gqa_attention(model) -> bool:
    """Switch a transformers model from ``sdpa`` to :func:`sdpa_gqa` (same masks); returns whether
    it did. Other attention implementations are left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, sdpa_gqa)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(NAME)
    return True
