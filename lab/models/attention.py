"""Causal attention in plain PyTorch: the math every attention backend in the lab must reproduce.

softmax(q k^T / sqrt(d) + mask) v, where query i of a chunk of T new tokens that follows `offset`
cached tokens may see keys 0 .. offset + i (Vaswani et al., 2017). Grouped-query attention (Ainslie
et al., 2023) lets each group of n_heads / n_kv_heads query heads share one key/value head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [T, n_heads, d] are the last T positions of the S keys/values k, v [S, n_kv_heads, d]."""
    T, S = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if T == S:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        # Query i sits at position S - T + i and sees keys 0 .. S - T + i.
        mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(S - T, S, device=q.device)[:, None]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
    return out.transpose(0, 1)
