"""Turns a scheduled step into tensors, runs the model on the paged KV cache, and samples.

For each scheduled (sequence, n) the step feeds tokens num_computed .. num_computed + n - 1 at
those positions; their KV goes to slot block_table[p // block_size] * block_size + p % block_size.
Only sequences whose step reaches their last token produce logits (one row each), so the LM head,
the largest matrix of a small model, runs on a handful of rows rather than every prompt token.
"""

from __future__ import annotations

import torch

from lab.models.llama import LlamaModel

from .attention import PagedAttentionMetadata, StagingMetadata, TorchPagedAttention
from .kv_store import PlainKVStore, QuantizedKVStore
from .sampling import sample
from .sequence import Sequence, Status


def kv_cache_bytes_per_block(model: LlamaModel, block_size: int, kv_format) -> int:
    """Pool bytes of one block: `kv_format` is None (the model's dtype) or a `KVCacheFormat`."""
    c = model.config
    shape = (c.num_hidden_layers, block_size, c.num_key_value_heads, c.head_dim)
    if kv_format is None:
        return PlainKVStore.bytes_per_block(*shape, model.embed_tokens.weight.dtype)
    return QuantizedKVStore.bytes_per_block(*shape, kv_format)


def kv_staging_bytes(model: LlamaModel, max_num_seqs: int, kv_format) -> int:
    """Bytes of the exact copies a quantized cache keeps per running sequence (windows, filling key groups)."""
    if kv_format is None:
        return 0
    c = model.config
    return QuantizedKVStore.staging_bytes_for(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, kv_format,
                                             max_num_seqs, model.embed_tokens.weight.dtype)


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, kv_format=None, kv_scales=None,
                 max_num_seqs: int = 1, attention_backend: str = "torch"):
        c = model.config
        self.model, self.block_size = model, block_size
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        shape = (c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        if kv_format is None:
            self.kv = PlainKVStore(*shape, self.dtype, self.device)
        else:
            self.kv = QuantizedKVStore(*shape, kv_format, self.dtype, self.device, kv_scales, model.rope, max_num_seqs)
        # Staging lanes (exact K/V of each running sequence's last tokens), for windows and per-channel keys.
        self.stages = kv_format is not None and (self.kv.staging_length > 0 or kv_format.granularity == "per-channel")
        self.free_lanes = list(range(max_num_seqs))
        self.lanes: dict[int, tuple[Sequence, int]] = {}  # request id -> (sequence, lane)
        self.staged_from: dict[int, int] = {}  # request id -> first position its lane holds exactly
        self.next_position: dict[int, int] = {}
        self.attention_backend = attention_backend
        if attention_backend == "triton":  # imported here: lab.kernels imports Triton (and may set its interpreter)
            from .triton_attention import TritonPagedAttention, kernel_caches
            caches = kernel_caches(self.kv)
            self.attention = lambda meta: TritonPagedAttention(caches, meta)
        else:
            self.attention = lambda meta: TorchPagedAttention(self.kv, meta)

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
            decode_lens=lens,
            prefills=prefills,
            staging=self._staging(scheduled, row) if self.stages else None,
        )
        return torch.tensor(ids, dtype=torch.long, device=dev), positions, meta, sample_rows

    def _lane(self, seq: Sequence, start: int, end: int) -> int:
        """The sequence's staging lane; a sequence that restarts (preempted, then recomputed) holds nothing exact
        before where it restarts."""
        rid = seq.request_id
        if rid not in self.lanes:
            if not self.free_lanes:  # lanes of sequences no longer running
                for other, (owner, lane) in list(self.lanes.items()):
                    if owner.status is not Status.RUNNING:
                        self.free_lanes.append(lane)
                        del self.lanes[other], self.staged_from[other], self.next_position[other]
            self.lanes[rid] = (seq, self.free_lanes.pop())
        if self.next_position.get(rid) != start:
            self.staged_from[rid] = start
        self.next_position[rid] = end
        return self.lanes[rid][1]

    def _staging(self, scheduled: list[tuple[Sequence, int]], num_tokens: int) -> StagingMetadata:
        bs, ring, dev = self.block_size, self.kv.staging_length, self.device
        group = self.kv.fmt.token_group if self.kv.fmt.granularity == "per-channel" else 0
        read_slots, write_slots, write_rows, decode_spans, prefill_spans = [], [], [], [], []
        group_rows, group_slots, group_positions, group_meta = [], [], [], []
        row = 0
        for seq, n in scheduled:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            lane = self._lane(seq, start, end)
            first = max(self.staged_from[seq.request_id], start - ring)
            slot = [lane * ring + p % ring for p in range(first, end)] if ring else []
            # Source rows of positions first .. end - 1: the staged ones (after the step's tokens), then its own.
            span = list(range(num_tokens + len(read_slots), num_tokens + len(read_slots) + start - first))
            span += list(range(row, row + n))
            read_slots += slot[:start - first]
            keep = min(n, ring)
            write_slots += slot[len(slot) - keep:]
            write_rows += range(row + n - keep, row + n)
            if n == 1:
                decode_spans.append((span, first))
            else:
                prefill_spans.append((torch.tensor(span, dtype=torch.long, device=dev), first))
            for last in range(start, end) if group else ():
                if (last + 1) % group:
                    continue
                g = last + 1 - group  # a group of keys completes at `last`: quantize it from its exact copies
                if g < first:
                    raise RuntimeError(f"per-channel key group at {g} began before the exact copies ({first})")
                group_rows += span[g - first:g - first + group]
                group_positions += range(g, g + group)
                group_slots += [seq.block_table[p // bs] * bs + p % bs for p in range(g, g + group)]
                group_meta.append(seq.block_table[g // bs] * (bs // group) + g % bs // group)
            row += n
        width = max((len(r) for r, _ in decode_spans), default=0)
        decode_rows = [r + [0] * (width - len(r)) for r, _ in decode_spans]
        decode_positions = [list(range(f, f + len(r))) + [-1] * (width - len(r)) for r, f in decode_spans]

        def t(x):
            return torch.tensor(x, dtype=torch.long, device=dev)

        return StagingMetadata(t(read_slots), t(write_slots), t(write_rows),
                               t(decode_rows).view(len(decode_spans), width),
                               t(decode_positions).view(len(decode_spans), width), prefill_spans, t(group_rows),
                               t(group_slots), t(group_positions), t(group_meta))

    @torch.inference_mode()
    def last_logits(self, scheduled: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Logits [len(scheduled), vocab] at the last token of each scheduled chunk, nothing sampled: what a
        draft model's runner returns to its drafter (`lab.spec.drafters.ModelDrafter`)."""
        input_ids, positions, meta, _ = self.prepare(scheduled)
        hidden = self.model(input_ids, positions, self.attention(meta))
        ends = torch.tensor([n for _, n in scheduled], device=self.device).cumsum(0) - 1
        return self.model.compute_logits(hidden[ends])

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], drafts: dict[int, int] | None = None) -> list:
        """Run one step; returns, per scheduled sequence, its sampled token (None if mid-prompt), or for a
        sequence whose last `drafts[request id]` tokens are drafts, the logits [drafts + 1, vocab] of its last
        drafts + 1 positions, for speculative verification (`lab.spec`)."""
        drafts = drafts or {}
        input_ids, positions, meta, sample_rows = self.prepare(scheduled)
        hidden = self.model(input_ids, positions, self.attention(meta))
        ends = [seq.num_computed_tokens + n == len(seq) for seq, n in scheduled]
        sampling = [(seq, r) for (seq, _), end, r in zip(scheduled, ends, sample_rows) if end
                    and not drafts.get(seq.request_id)] if sample_rows else []
        tokens = iter(sample(self.model.compute_logits(hidden[[r for _, r in sampling]]),
                             [s.params for s, _ in sampling], [s.generator for s, _ in sampling]) if sampling else [])
        out, rows = [], iter(sample_rows)
        for (seq, n), end in zip(scheduled, ends):
            if not end:
                out.append(None)
                continue
            last, d = next(rows), drafts.get(seq.request_id, 0)
            out.append(self.model.compute_logits(hidden[last - d:last + 1]) if d else next(tokens))
        return out
