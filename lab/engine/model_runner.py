"""Turns a scheduled step into tensors, runs the model on the paged KV cache, and samples.

For each scheduled (sequence, n) the step feeds tokens num_computed .. num_computed + n - 1 at
those positions; their KV goes to slot block_table[p // block_size] * block_size + p % block_size.
Only sequences whose step reaches their last token produce logits (one row each), so the LM head,
the largest matrix of a small model, runs on a handful of rows rather than every prompt token.
"""

from __future__ import annotations

import torch

from lab.models.llama import LlamaModel

from .attention import PagedAttentionMetadata, TorchPagedAttention
from .kv_store import PlainKVStore, QuantizedKVStore
from .sampling import sample
from .sequence import Sequence


def kv_cache_bytes_per_block(model: LlamaModel, block_size: int, kv_format) -> int:
    """Pool bytes of one block: `kv_format` is None (the model's dtype) or a `KVCacheFormat`."""
    c = model.config
    shape = (c.num_hidden_layers, block_size, c.num_key_value_heads, c.head_dim)
    if kv_format is None:
        return PlainKVStore.bytes_per_block(*shape, model.embed_tokens.weight.dtype)
    return QuantizedKVStore.bytes_per_block(*shape, kv_format)


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, kv_format=None, kv_scales=None):
        c = model.config
        self.model, self.block_size = model, block_size
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        shape = (c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        if kv_format is None:
            self.kv = PlainKVStore(*shape, self.dtype, self.device)
        else:
            self.kv = QuantizedKVStore(*shape, kv_format, self.dtype, self.device, kv_scales, model.rope)

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv.nbytes

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        """Flat input_ids, positions, attention metadata, and the rows whose logits are sampled."""
        bs, dev = self.block_size, self.device
        ids, positions, slots, sample_rows = [], [], [], []
        decode_rows, decode_tables, decode_lens, prefills = [], [], [], []
        row = 0
        for seq, n in scheduled:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            table = seq.block_table[:-(-end // bs)]
            ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(table)
                decode_lens.append(end)
            else:
                prefills.append((row, n, torch.tensor(table, device=dev), end))
            if end == len(seq):
                sample_rows.append(row + n - 1)
            row += n
        width = max((len(t) for t in decode_tables), default=0)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables], dtype=torch.long, device=dev)
        lens = torch.tensor(decode_lens, dtype=torch.long, device=dev)
        outside = torch.arange(width * bs, device=dev)[None, :] >= lens[:, None]
        bias = torch.zeros(outside.shape, dtype=self.dtype, device=dev).masked_fill_(outside, float("-inf"))
        positions = torch.tensor(positions, dtype=torch.long, device=dev)
        meta = PagedAttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            positions=positions,
            decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=dev),
            decode_blocks=tables.view(-1),
            decode_bias=bias[:, None, None, :],
            prefills=prefills,
        )
        return torch.tensor(ids, dtype=torch.long, device=dev), positions, meta, sample_rows

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> list[int | None]:
        """Run one step; returns the sampled token of each scheduled sequence (None if mid-prompt)."""
        input_ids, positions, meta, sample_rows = self.prepare(scheduled)
        hidden = self.model(input_ids, positions, TorchPagedAttention(self.kv, meta))
        sampling = [seq for seq, n in scheduled if seq.num_computed_tokens + n == len(seq)]
        tokens = iter(sample(self.model.compute_logits(hidden[sample_rows]), [s.params for s in sampling],
                             [s.generator for s in sampling]) if sampling else [])
        return [next(tokens) if seq.num_computed_tokens + n == len(seq) else None for seq, n in scheduled]
