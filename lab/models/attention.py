"""Causal attention in plain PyTorch: the math every attention backend in the lab must reproduce.

softmax(q k^T / sqrt(d) + mask) v, where query i of a chunk of T new tokens that follows `offset`
cached tokens may see keys 0 .. offset + i (Vaswani et al., 2017). Grouped-query attention (Ainslie
et al., 2023) lets each group of n_heads / n_kv_heads query heads share one key/value head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


@dataclass(frozen=True)
class AttentionLayout:
    """What a model's attention adds to plain causal attention, per layer of its KV pool.

    `windows[layer]`: a sliding window of W keys — the query at position p sees keys p - W + 1 .. p (Beltagy et
    al., "Longformer", 2020; Mistral 7B, Jiang et al., 2023; transformers' sliding_window_overlay: kv > q - W) —
    or None for the whole causal context. `softcap`: Gemma 2's soft cap on the attention logits, cap *
    tanh(scores / cap) after the 1/sqrt(d) scale and before the mask (Gemma Team, arXiv:2408.00118, section 2)."""

    windows: tuple[int | None, ...] = ()
    softcap: float | None = None

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if layer < len(self.windows) else None

    @property
    def plain(self) -> bool:
        return self.softcap is None and not any(self.windows)


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[Tq, Tk] True where the query at q_pos may see the key at k_pos: causal, within `window` if one."""
    mask = k_pos[None, :] <= q_pos[:, None]
    return mask if window is None else mask & (k_pos[None, :] > q_pos[:, None] - window)


def check_plain(layout: AttentionLayout, layer: int, num_keys: int, where: str) -> None:
    """Refuse, by name, attention code that computes plain causal attention where `layout` would change the result
    at `num_keys` keys: a soft cap, or a window narrower than the keys (a window that never binds changes nothing)."""
    window = layout.window(layer)
    if layout.softcap is not None or (window is not None and num_keys > window):
        what = "a logit soft cap" if layout.softcap is not None else f"a sliding window of {window} keys"
        raise ValueError(f"{where} computes plain causal attention, but layer {layer} of this model has {what}, "
                         f"which changes attention over {num_keys} keys; it is not implemented there")


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     softcap: float | None) -> torch.Tensor:
    """softmax(cap(q k^T / sqrt(d)) masked) v, the scores in float32: SDPA has no soft cap. q [B, H, Tq, d], k, v
    [B, H_kv, Tk, d] (grouped-query heads repeated here), mask broadcastable to [B, H, Tq, Tk]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, NEG_INF)
    return torch.matmul(scores.softmax(-1).to(q.dtype), v)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """q [T, n_heads, d] are the last T positions of the S keys/values k, v [S, n_kv_heads, d]; each query sees
    the last `window` keys up to itself if a window is given, and its scores are soft-capped if `softcap`."""
    T, S = q.shape[0], k.shape[0]
    if window is not None and window >= S:
        window = None  # no query can reach past it
    if window is not None or softcap is not None:
        pos = torch.arange(S, device=q.device)
        mask = attention_mask(pos[S - T:], pos, window)
        qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))
        if softcap is None:
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        else:
            out = capped_attention(qh, kh, vh, mask, softcap)
        return out[0].transpose(0, 1)
    # A batch dimension of 1: SDPA's fused CPU kernel takes only 4-D inputs; 3-D ones fall back to the math path,
    # which materializes the T x S scores (measured: a 2048-token prefill's attention 0.32 s a layer, 0.04 s 4-D).
    qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))
    if T == S:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        # Query i sits at position S - T + i and sees keys 0 .. S - T + i.
        mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(S - T, S, device=q.device)[:, None]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


def partly_exact_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, exact_keys: torch.Tensor,
                           exact_values: torch.Tensor, key_exact: torch.Tensor | None,
                           value_exact: torch.Tensor | None, block: int = 1024,
                           q_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention over a quantized cache in which each query reads some keys and values exactly.

    q [T, n_heads, d] are the last T of S positions; keys, values [S, n_kv_heads, d] are as read from the
    quantized cache and exact_keys, exact_values the full-precision ones; key_exact, value_exact [T, S] say
    where query i reads the exact one (None: nowhere). A full-precision window (KIVI) differs per query, so
    this cannot be one gathered K/V: scores against the exact keys replace the quantized ones where the mask
    says, and the exact values correct the output there. Exact reads sit in a band near the diagonal, so
    `block` queries at a time compute them only over the columns where that block has any, and only up to
    the block's last visible key (which also keeps the scores of 8K tokens within memory). `q_positions`
    [T] (increasing) places the queries elsewhere than the last T positions, e.g. a sample of them."""
    T, n_heads, d = q.shape
    S, n_kv = keys.shape[:2]
    group = n_heads // n_kv
    if q_positions is None:
        q_positions = torch.arange(S - T, S, device=q.device)
    out = torch.empty_like(q)
    for a in range(0, T, block):
        b = min(a + block, T)
        end = int(q_positions[b - 1]) + 1  # keys this block of queries can see
        km = None if key_exact is None else key_exact[a:b, :end]
        vm = None if value_exact is None else value_exact[a:b, :end]
        lo = min((int(m.any(0).nonzero()[0, 0]) for m in (km, vm) if m is not None and m.any()), default=end)
        future = torch.arange(end, device=q.device)[None, :] > q_positions[a:b, None]
        for h in range(n_kv):
            heads = slice(h * group, (h + 1) * group)
            qh = q[a:b, heads].transpose(0, 1).float() * d ** -0.5  # [group, block, d]
            scores = qh @ keys[:end, h].float().t()
            if km is not None and lo < end:
                # where(), not a blend: the quantized side may hold a key group still filling (never read).
                band = qh @ exact_keys[lo:end, h].float().t()
                scores[..., lo:end] = torch.where(km[:, lo:end], band, scores[..., lo:end])
            p = scores.masked_fill_(future, NEG_INF).softmax(-1)
            o = p @ values[:end, h].float()
            if vm is not None and lo < end:
                o += (p[..., lo:end] * vm[:, lo:end]) @ (exact_values[lo:end, h].float() - values[lo:end, h].float())
            out[a:b, heads] = o.transpose(0, 1).to(q.dtype)
    return out
