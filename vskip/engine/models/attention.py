"""Grouped-query attention without copying the cache, for transformers verifiers on a CPU.

transformers' ``sdpa`` attention repeats every key/value head of the cache to the number of query
heads before each call whenever a mask is given (on a CPU, always for a multi-token call): the
whole cache is copied in every layer of every verification. PyTorch's
``scaled_dot_product_attention`` takes ``enable_gqa=True`` and reads the shared heads in place.
This registers that variant under :data:`NAME` for a model whose attention is ``sdpa``; it
computes the same attention.
"""

from __future__ import annotations

import torch.nn.functional as F

NAME = "vskip_sdpa_gqa"


def sdpa_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """query [B, H, T, D]; key/value [B, KVH, S, D]; mask broadcastable to [B, H, T, S] or None.
    Returns ([B, T, H, D], None) as transformers' attention functions do."""
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
