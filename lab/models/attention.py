"""Causal attention in plain PyTorch: the math every attention backend in the lab must reproduce.

softmax(q k^T / sqrt(d) + mask) v, where query i of a chunk of T new tokens that follows `offset`
cached tokens may see keys 0 .. offset + i (Vaswani et al., 2017). Grouped-query attention (Ainslie
et al., 2023) lets each group of n_heads / n_kv_heads query heads share one key/value head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


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


def partly_exact_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, exact_keys: torch.Tensor,
                           exact_values: torch.Tensor, key_exact: torch.Tensor | None,
                           value_exact: torch.Tensor | None) -> torch.Tensor:
    """Causal attention over a quantized cache in which each query reads some keys and values exactly.

    q [T, n_heads, d] are the last T of S positions; keys, values [S, n_kv_heads, d] are as read from the
    quantized cache and exact_keys, exact_values the full-precision ones; key_exact, value_exact [T, S] say
    where query i reads the exact one (None: nowhere). A full-precision window (KIVI) differs per query, so
    this cannot be one gathered K/V: scores are taken against both and chosen per (query, key). One KV head
    at a time keeps the [group, T, S] scores of 8K tokens within memory."""
    T, n_heads, d = q.shape
    S, n_kv = keys.shape[:2]
    group = n_heads // n_kv
    causal = torch.arange(S, device=q.device)[None, :] <= torch.arange(S - T, S, device=q.device)[:, None]
    out = torch.empty_like(q)
    for h in range(n_kv):
        qh = q[:, h * group:(h + 1) * group].transpose(0, 1).float() * d ** -0.5  # [group, T, d]
        scores = qh @ keys[:, h].float().t()
        if key_exact is not None:
            # where(), not a blend: the quantized side may hold a group that is still filling (never read).
            scores = torch.where(key_exact, qh @ exact_keys[:, h].float().t(), scores)
        p = scores.masked_fill(~causal, NEG_INF).softmax(-1)
        o = p @ values[:, h].float() if value_exact is None else (
            (p * value_exact) @ exact_values[:, h].float() + (p * ~value_exact) @ values[:, h].float())
        out[:, h * group:(h + 1) * group] = o.transpose(0, 1).to(q.dtype)
    return out
