"""Paged attention in PyTorch: the engine's reference attention backend.

The KV pool of one layer is [num_blocks, block_size, n_kv_heads, head_dim] (`lab.engine.kv_store`: plain or
quantized); a sequence's token j lives in block `block_table[j // block_size]` at offset `j % block_size`.
Each step:

1. write: this step's k, v go to their slots (`slot_mapping`, one flat index per token);
2. read: decodes (one query each) are batched, gathering whole blocks through the padded block
   tables and masking positions past each sequence's length; a prefill chunk gathers its own blocks
   and runs causal attention with the chunk's queries at the end of its context.

Gathering copies the context once per layer, which a fused kernel would not (the Triton backend
reads blocks in place); the math is the same and this is what the kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.models.attention import causal_attention


@dataclass
class PagedAttentionMetadata:
    """Everything attention needs about a step's batch, built once per step by the model runner."""

    slot_mapping: torch.Tensor  # [T] flat slot of each new token
    positions: torch.Tensor  # [T] position of each new token in its sequence (pre-RoPE KV formats need it)
    decode_rows: torch.Tensor  # [Bd] token index of each single-query sequence
    decode_blocks: torch.Tensor  # [Bd * max_blocks] the decodes' block tables, flattened (padded with block 0)
    decode_bias: torch.Tensor  # [Bd, 1, 1, max_blocks * block_size] 0 inside the context, -inf past its end
    prefills: list[tuple[int, int, torch.Tensor, int]]  # (first token row, query length, block ids, context length)


class TorchPagedAttention:
    """An `AttentionContext` over the engine's paged KV cache (a `lab.engine.kv_store` store)."""

    def __init__(self, store, meta: PagedAttentionMetadata):
        self.store, self.meta = store, meta

    def attend(self, layer, q, k, v):
        m = self.meta
        n_kv, d = k.shape[-2:]
        self.store.write(layer, m.slot_mapping, k, v, m.positions)
        bd = m.decode_rows.numel()
        if bd:
            keys, values = self.store.gather(layer, m.decode_blocks, m.decode_blocks.numel() // bd)
            keys = keys.view(bd, -1, n_kv, d).transpose(1, 2)  # [Bd, n_kv, L, d]
            values = values.view(bd, -1, n_kv, d).transpose(1, 2)
            # The n_heads / n_kv query heads that share a KV head become the query rows of that head:
            # one small matmul per (sequence, KV head) and no copy of K/V per query head.
            qd = (q if not m.prefills else q[m.decode_rows]).view(bd, n_kv, -1, d)
            o = F.scaled_dot_product_attention(qd, keys, values, attn_mask=m.decode_bias).view(bd, -1, d)
            if not m.prefills:
                return o
        out = torch.empty_like(q)
        if bd:
            out[m.decode_rows] = o
        for start, qlen, blocks, ctx_len in m.prefills:
            keys, values = self.store.gather(layer, blocks)
            keys, values = keys.view(-1, n_kv, d)[:ctx_len], values.view(-1, n_kv, d)[:ctx_len]
            out[start:start + qlen] = causal_attention(q[start:start + qlen], keys, values)
        return out
