"""Paged attention through the Triton kernels (`attention_backend="triton"`).

The same contract as `TorchPagedAttention`: write the step's K/V to their slots, then attend. The difference
is where the context is read: the torch backend gathers (copies) each sequence's blocks and runs SDPA on the
copy; here `lab.kernels.reshape_and_cache` writes (quantizing for a quantized pool) and
`paged_decode_attention` / `paged_prefill_attention` read the blocks in place through the block tables,
dequantizing on read. Decodes (one query) go to the split-KV decode kernel, prefill chunks (prefix hits and
chunked prefill included) to the extend kernel, all chunks of a step in one launch.

Formats that need exact copies outside the pool (per-channel keys, windows) or a rotation on read (pre-RoPE
keys) stay on the torch backend (`lab.kernels.check_supported`), and so do models whose sliding windows bind or
whose attention logits are soft-capped (Gemma 2): `check_layout` refuses them by name.
"""

from __future__ import annotations

import torch

from lab.kernels import PagedKVCache, paged_decode_attention, paged_prefill_attention, reshape_and_cache
from lab.models.attention import AttentionLayout, PagedAttentionMetadata



def check_layout(layout: AttentionLayout) -> None:
    """The kernels compute plain causal attention: sliding windows that bind and Gemma 2's soft cap are refused by
    name (the torch backend, `lab.models.attention`, computes both)."""
    missing = [what for what, needed in (("sliding windows that bind", any(layout.windows)),
                                         ("soft-capped attention logits", layout.softcap is not None)) if needed]
    if missing:
        raise ValueError(f"attention_backend='triton' does not implement {' or '.join(missing)}; use "
                         f"attention_backend='torch' (or a max_model_len within the window)")


def kernel_caches(store) -> list[PagedKVCache]:
    """Each layer's pool of a `lab.kv.KVStore`, as the kernels read it (`store.kernel_view`: views, no copies but
    the static scales, repeated per KV head). A store the kernels cannot read is refused by `PagedKVCache`."""
    return [PagedKVCache(**store.kernel_view(layer)) for layer in range(store.num_layers)]


class TritonPagedAttention:
    """An `AttentionContext` over the engine's paged KV cache, attending with the Triton kernels."""

    def __init__(self, caches: list[PagedKVCache], meta: PagedAttentionMetadata):
        self.caches, self.meta = caches, meta
        dev = meta.slot_mapping.device
        bd = meta.decode_rows.numel()
        # Block tables and lengths once per step (every layer reads the same ones).
        self.decode_tables = meta.decode_blocks.view(bd, -1).to(torch.int32) if bd else None
        self.decode_lens = meta.decode_lens.to(torch.int32)
        self.max_context = meta.max_decode_len
        if meta.prefills:
            width = max(blocks.numel() for _, _, blocks, _ in meta.prefills)
            self.prefill_tables = torch.stack([torch.nn.functional.pad(blocks, (0, width - blocks.numel()))
                                               for _, _, blocks, _ in meta.prefills]).to(torch.int32)
            starts, qlens, lens = zip(*((row, n, ctx) for row, n, _, ctx in meta.prefills))
            self.query_starts, self.query_lens, self.prefill_lens = (
                torch.tensor(x, dtype=torch.int32, device=dev) for x in (starts, qlens, lens))
            self.max_query_len = max(qlens)

    def attend(self, layer, q, k, v):
        m, cache = self.meta, self.caches[layer]
        # The runner built the slots, tables and lengths: no checks that read them back from the device.
        reshape_and_cache(k, v, cache, m.slot_mapping, validate=False)
        bd = m.decode_rows.numel()
        if bd:
            qd = q if not m.prefills else q[m.decode_rows]
            o = paged_decode_attention(qd, cache, self.decode_tables, self.decode_lens, max_context=self.max_context,
                                       validate=False)
            if not m.prefills:
                return o
        out = torch.empty_like(q)
        if bd:
            out[m.decode_rows] = o
        return paged_prefill_attention(q, cache, self.prefill_tables, self.query_starts, self.query_lens,
                                       self.prefill_lens, out=out, max_query_len=self.max_query_len, validate=False)
