"""Paged attention in PyTorch: the engine's reference attention backend.

The KV pool of one layer is [num_blocks, block_size, n_kv_heads, head_dim] (`lab.engine.kv_store`: plain or
quantized); a sequence's token j lives in block `block_table[j // block_size]` at offset `j % block_size`.
Each step:

1. write: this step's k, v go to their slots (`slot_mapping`, one flat index per token);
2. read: decodes (one query each) are batched, gathering whole blocks through the padded block
   tables and masking positions past each sequence's length; a prefill chunk gathers its own blocks
   and runs causal attention with the chunk's queries at the end of its context.

Quantized formats with a full-precision window or per-channel keys also read exact K/V from the store's
staging area (`lab.engine.kv_store.StagingMetadata`): a decode overwrites the gathered K/V at the positions it
reads exactly, a prefill chunk, whose queries each read a different window, chooses per (query, key)
(`lab.models.attention.partly_exact_attention`). Which positions are exact is `lab.quant.kv.exact_mask`.

Gathering copies the context once per layer, which a fused kernel would not (the Triton backend
reads blocks in place); the math is the same and this is what the kernels are tested against.

A model's `AttentionLayout` (sliding windows per layer, Gemma 2's logit soft cap) applies here too: a windowed
decode masks the keys before its window as it masks those past its end, a windowed prefill chunk gathers only the
blocks from its first query's window on (blocks before it may have been freed, `lab.engine.block_manager`), and a
soft cap computes the scores itself, since SDPA has none. The quantized formats' exact-copy paths take neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.models.attention import AttentionLayout, causal_attention, partly_exact_attention
from lab.quant.kv import exact_mask

from .kv_store import StagingMetadata


@dataclass
class PagedAttentionMetadata:
    """Everything attention needs about a step's batch, built once per step by the model runner."""

    slot_mapping: torch.Tensor  # [T] flat slot of each new token
    positions: torch.Tensor  # [T] position of each new token in its sequence (pre-RoPE KV formats need it)
    decode_rows: torch.Tensor  # [Bd] token index of each single-query sequence
    decode_blocks: torch.Tensor  # [Bd * max_blocks] the decodes' block tables, flattened (padded with block 0)
    decode_bias: torch.Tensor  # [Bd, 1, 1, max_blocks * block_size] 0 inside the context, -inf past its end
    decode_lens: torch.Tensor  # [Bd] context length of each decode, its new token included
    prefills: list[tuple[int, int, torch.Tensor, int]]  # (first token row, query length, block ids, context length)
    staging: StagingMetadata | None = None
    max_decode_len: int = 0  # decode_lens.max(), kept on the host: reading it from a device stalls the step


class TorchPagedAttention:
    """An `AttentionContext` over the engine's paged KV cache (a `lab.engine.kv_store` store)."""

    def __init__(self, store, meta: PagedAttentionMetadata, layout: AttentionLayout | None = None):
        self.store, self.meta, self.layout = store, meta, layout or AttentionLayout()
        fmt = getattr(store, "fmt", None)
        if not self.layout.plain and (meta.staging is not None or getattr(fmt, "pre_rope", False)):
            raise ValueError(f"kv_cache_dtype {fmt.dtype} keeps exact copies or pre-RoPE keys, which the lab's "
                             f"sliding windows and soft-capped attention do not read; use a format without them")
        self._window_bias: dict[int, torch.Tensor] = {}  # window -> decode bias, built once a step

    def decode_bias(self, window: int | None) -> torch.Tensor:
        """The decodes' bias, -inf also before the window: the query at position len - 1 sees keys >= len - W."""
        if window is None:
            return self.meta.decode_bias
        if window not in self._window_bias:
            m = self.meta
            before = torch.arange(m.decode_bias.shape[-1], device=m.decode_bias.device)[None, :] < (
                m.decode_lens[:, None] - window)
            self._window_bias[window] = m.decode_bias.masked_fill(before[:, None, None, :], float("-inf"))
        return self._window_bias[window]

    def attend(self, layer, q, k, v):
        m, st, fmt = self.meta, self.meta.staging, getattr(self.store, "fmt", None)
        n_kv, d = k.shape[-2:]
        window, softcap = self.layout.window(layer), self.layout.softcap
        exact = None
        if st is not None:
            exact = self.store.exact_source(layer, st, k, v)
            self.store.stage(layer, st, k, v)
        self.store.write(layer, m.slot_mapping, k, v, m.positions, st, None if exact is None else exact[0])
        bd = m.decode_rows.numel()
        if bd:
            keys, values = self.store.gather(layer, m.decode_blocks, m.decode_blocks.numel() // bd)
            if st is not None:
                q_pos = m.positions[m.decode_rows][:, None]
                for x, src, role in ((keys, exact[0], "k"), (values, exact[1], "v")):
                    _overwrite_exact(x.view(bd, -1, n_kv, d), src, st, exact_mask(fmt, role, q_pos, st.decode_positions))
            # [Bd, n_kv, L, d], copied while rows of d stay whole: a strided view would make matmul copy K^T
            # element by element (3 ms of a 31 ms bf16 step at batch 32 went to that copy). Same values in bf16;
            # float32 sums in another order (~1e-6).
            keys = keys.view(bd, -1, n_kv, d).transpose(1, 2).contiguous()
            values = values.view(bd, -1, n_kv, d).transpose(1, 2).contiguous()
            # The n_heads / n_kv query heads that share a KV head become the query rows of that head:
            # one small matmul per (sequence, KV head) and no copy of K/V per query head.
            qd = (q if not m.prefills else q[m.decode_rows]).view(bd, n_kv, -1, d)
            o = _decode_attention(qd, keys, values, self.decode_bias(window), softcap).view(bd, -1, d)
            if not m.prefills:
                return o
        out = torch.empty_like(q)
        if bd:
            out[m.decode_rows] = o
        for i, (start, qlen, blocks, ctx_len) in enumerate(m.prefills):
            # A window: from the block holding the first key the chunk's first query sees (the ones before it may
            # be freed); the chunk's queries are still the last of the keys gathered.
            first = 0 if window is None else max(0, ctx_len - qlen - window + 1) // self.store.block_size
            keys, values = self.store.gather(layer, blocks[first:] if first else blocks)
            span = ctx_len - first * self.store.block_size if first else ctx_len
            keys, values = keys.view(-1, n_kv, d)[:span], values.view(-1, n_kv, d)[:span]
            qc = q[start:start + qlen]
            if st is None:
                out[start:start + qlen] = causal_attention(qc, keys, values, window, softcap)
                continue
            rows, first = st.prefill_spans[i]
            k_pos = torch.arange(ctx_len, device=q.device)[None, :]
            q_pos = k_pos[:, ctx_len - qlen:].t()
            exact_kv, masks = [], []
            for x, src, role in ((keys, exact[0], "k"), (values, exact[1], "v")):
                full = x.clone()
                full[first:ctx_len] = src.index_select(0, rows)
                exact_kv.append(full)
                mask = exact_mask(fmt, role, q_pos, k_pos)
                masks.append(None if mask is None else mask & (k_pos >= first))  # staged copies start at `first`
            out[start:start + qlen] = partly_exact_attention(qc, keys, values, *exact_kv, *masks)
        return out


def _decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                      softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v for the decodes, q [Bd, n_kv, group, d]. One sequence: SDPA's fused
    kernel. Several: two batched matmuls with the softmax in float32, which on this CPU took 0.36 ms where SDPA's
    flash kernel took 1.0 ms (bfloat16, 32 sequences of 208 tokens, one thread; 2.4 vs 6.1 ms at 1024 tokens;
    float32 the same speed either way): the flash kernel tiles for long queries, a decode has `group` of them.
    A soft cap goes between the scale and the bias, so SDPA cannot take it."""
    if q.shape[0] == 1 and softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float().mul_(q.shape[-1] ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores.div_(softcap)).mul_(softcap)
    scores.add_(bias)
    return torch.matmul(scores.softmax(-1).to(q.dtype), values)


def _overwrite_exact(x: torch.Tensor, src: torch.Tensor, st: StagingMetadata, mask: torch.Tensor | None) -> None:
    """x [Bd, L, n_kv, d] gathered for the decodes: where `mask` [Bd, S] says so, the staged exact copy."""
    if mask is None:
        return
    mask = mask & (st.decode_positions >= 0)
    b = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(mask)
    x[b[mask], st.decode_positions[mask]] = src.index_select(0, st.decode_rows[mask])
