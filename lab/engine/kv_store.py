"""Where the paged KV cache lives, and how big it is: plain tensors in the model's dtype
(`lab.models.attention.PlainKVStore`, beside the attention that reads it), or quantized codes with their scales.

Both stores hold, per layer, `num_blocks` blocks of `block_size` token slots for K and V, and offer the two
operations paged attention needs: `write` this step's keys and values to their slots, and `gather` whole
blocks back as [n, block_size, n_kv_heads, head_dim] in the compute dtype. `build_kv_store` makes either, and
`default_num_blocks` sizes the pool from free memory.

`QuantizedKVStore` keeps the codes of a `lab.quant.kv.KVCacheFormat` in the pool (integers packed along the
head dimension, fp8 as torch's float8 types) and, for per-token formats, an fp16 scale (and an fp16 zero point
on asymmetric integer grids) per token and KV head; static formats keep one calibrated scale per layer (and
head) outside the pool. Reads dequantize the gathered blocks. With `pre_rope`, keys are un-rotated before
they are quantized and rotated back on read, at their positions in the sequence. The bytes of the pool are
what `lab.memory.kv_bytes_per_token` predicts for the format (tested).

Per-channel keys (KIVI) keep one fp16 scale (and zero) per channel for each group of `token_group` tokens of
a block; a group is quantized when its last token is written, so until then its keys are read exactly. Those,
and a full-precision window, come from the staging area: per running sequence (a lane), its last
`staging_length(fmt)` tokens' exact K/V in the model's dtype, a ring indexed by position. The staging area is
outside the pool and sized by `max_num_seqs`, not by tokens. Exact copies live only in the lane of the
sequence that computed them: a sequence that starts from cached prefix blocks (a prefix hit, or a recompute
after preemption) reads the cached tokens inside its window quantized, since their exact copies are gone.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch

from lab.models.attention import PlainKVStore
from lab.models.llama import apply_rope
from lab.quant.kv import (FP8_TYPES, KVCacheFormat, QuantizedKV, dequantize, exact_mask, pack_codes, quantize,
                         staging_length, unpack_codes)

from .request import Sequence, Status

log = logging.getLogger(__name__)

# Share of the free memory the KV pool may take when the engine is not given a number of blocks.
KV_CACHE_MEMORY_FRACTION = 0.4


def pool_dims(model) -> tuple[int, int]:
    """(layers, KV heads) the pool holds: the model's, or a tensor-parallel shard's or a pipeline stage's own
    (`lab.parallel`), whose config is the whole model's."""
    return len(model.layers), model.layers[0].self_attn.n_kv


def kv_cache_bytes_per_block(model, block_size: int, kv_format: KVCacheFormat | None) -> int:
    """Pool bytes of one block: `kv_format` None stores K/V in the model's dtype."""
    layers, heads = pool_dims(model)
    shape = (layers, block_size, heads, model.config.head_dim)
    if kv_format is None:
        return PlainKVStore.bytes_per_block(*shape, model.embed_tokens.weight.dtype)
    return QuantizedKVStore.bytes_per_block(*shape, kv_format)


def kv_staging_bytes(model, max_num_seqs: int, kv_format: KVCacheFormat | None) -> int:
    """Bytes of the exact copies a quantized cache keeps per running sequence (windows, filling key groups)."""
    if kv_format is None:
        return 0
    c = model.config
    return QuantizedKVStore.staging_bytes_for(*pool_dims(model), c.head_dim, kv_format,
                                             max_num_seqs, model.embed_tokens.weight.dtype)


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_num_blocks(model, block_size: int, max_model_len: int, max_num_seqs: int,
                       kv_format: KVCacheFormat | None, sharers: int = 1) -> int:
    """Enough blocks for max_num_seqs sequences of max_model_len, within a share of free memory (less the
    staging area of a quantized cache's exact windows). `sharers`: pools of this size that the same memory
    holds (the ranks of a parallel group on one CPU)."""
    per_block = kv_cache_bytes_per_block(model, block_size, kv_format)
    staging = kv_staging_bytes(model, max_num_seqs, kv_format)
    per_seq = -(-max_model_len // block_size)
    device = model.embed_tokens.weight.device
    affordable = max(int(available_memory(device) * KV_CACHE_MEMORY_FRACTION / sharers) - staging, 0) // per_block
    num = min(max_num_seqs * per_seq, affordable)
    if num < per_seq:
        raise ValueError(f"the KV pool that fits in memory ({num} blocks of {block_size} tokens) cannot hold "
                         f"one sequence of max_model_len {max_model_len}; lower max_model_len")
    return num


def build_kv_store(model, num_blocks: int, block_size: int, kv_format: KVCacheFormat | None = None,
                   kv_scales=None, max_num_seqs: int = 1):
    """The pool for `model`: plain in its dtype, or quantized (with `max_num_seqs` staging lanes if it stages)."""
    # A pipeline stage may hold no embedding; every norm layout has post_attention_layernorm (OLMo 2 has no input norm).
    c, w = model.config, model.layers[0].post_attention_layernorm.weight
    layers, heads = pool_dims(model)
    shape = (layers, num_blocks, block_size, heads, c.head_dim)
    if kv_format is None:
        return PlainKVStore(*shape, w.dtype, w.device)
    if kv_format.static and kv_format.is_fp8 and kv_scales is None:
        from lab.quant.kv_calibration import KVScales

        # vLLM's behaviour: fp8 without k_scale/v_scale runs at a scale of 1.0.
        log.warning("kv_cache_dtype %s without kv_scales: a static scale of 1.0 (vLLM's default); calibrate with "
                    "lab.quant.kv_calibration.calibrate_kv_absmax for real scales", kv_format.dtype)
        kv_scales = KVScales.unit(model, kv_format)
    return QuantizedKVStore(*shape, kv_format, w.dtype, w.device, kv_scales, model.rope, max_num_seqs)


class QuantizedKVStore:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv: int, head_dim: int,
                 fmt: KVCacheFormat, dtype: torch.dtype, device: torch.device, static_scales=None, rope=None,
                 num_lanes: int = 1):
        check_servable(fmt, head_dim, block_size)
        if fmt.static and static_scales is None:
            raise ValueError(f"kv_cache_dtype {fmt.dtype} at {fmt.granularity} needs static scales: calibrate them "
                             f"with lab.quant.kv_calibration.calibrate_kv_absmax, or pass KVScales.unit(...) for "
                             f"vLLM's default scale of 1.0")
        self.fmt, self.dtype, self.block_size, self.head_dim, self.rope = fmt, dtype, block_size, head_dim, rope
        code_shape = (n_layers, num_blocks, block_size, n_kv, _code_width(fmt, head_dim))
        # Bytes in the pool; fp8 codes are viewed as float8 only to compute (index_copy_ wants plain types).
        self.codes = {r: torch.zeros(code_shape, dtype=torch.uint8, device=device) for r in "kv"}
        self.scale, self.zero = {}, {}
        if fmt.static:
            self.static = {r: [static_scales.scale(fmt, i, r).to(device).reshape(1, 1, -1, 1) for i in range(n_layers)]
                           for r in "kv"}
        for role in "kv":
            shape = _meta_shape(fmt, role, block_size, n_kv, head_dim)
            if shape is not None:
                self.scale[role] = torch.ones((n_layers, num_blocks, *shape), dtype=torch.float16, device=device)
                if fmt.asymmetric:
                    self.zero[role] = torch.zeros((n_layers, num_blocks, *shape), dtype=torch.float16, device=device)
        self.staging_length = staging_length(fmt)
        stage_shape = (n_layers, num_lanes * self.staging_length, n_kv, head_dim)
        self.staged = {r: torch.zeros(stage_shape, dtype=dtype, device=device) for r in "kv"} \
            if self.staging_length else {}
        # Staging lanes (exact K/V of each running sequence's last tokens), for windows and per-channel keys.
        self.stages = self.staging_length > 0 or fmt.granularity == "per-channel"
        self.lanes = StagingLanes(num_lanes, block_size, self.staging_length,
                                  fmt.token_group if fmt.granularity == "per-channel" else 0, device)

    def staging_metadata(self, scheduled: list[tuple[Sequence, int]], num_tokens: int) -> StagingMetadata | None:
        """Where this step's exact K/V come from and go to (None for a format without exact copies)."""
        return self.lanes.metadata(scheduled, num_tokens) if self.stages else None

    @staticmethod
    def bytes_per_block(n_layers, block_size, n_kv, head_dim, fmt: KVCacheFormat) -> int:
        check_servable(fmt, head_dim, block_size)
        meta_bytes = 2 * (2 if fmt.asymmetric else 1)
        total = 0
        for role in "kv":
            shape = _meta_shape(fmt, role, block_size, n_kv, head_dim)
            total += block_size * n_kv * _code_width(fmt, head_dim) + (math.prod(shape) * meta_bytes if shape else 0)
        return n_layers * total

    @staticmethod
    def staging_bytes_for(n_layers, n_kv, head_dim, fmt: KVCacheFormat, num_lanes: int, dtype: torch.dtype) -> int:
        return 2 * n_layers * num_lanes * staging_length(fmt) * n_kv * head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the block pool (codes and scales)."""
        return sum(t.nbytes for d in (self.codes, self.scale, self.zero) for t in d.values())

    @property
    def staging_bytes(self) -> int:
        return sum(t.nbytes for t in self.staged.values())

    def exact_mask(self, role: str, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Where a query at q_pos reads the key (or value) at k_pos exactly (`lab.quant.kv.exact_mask`)."""
        return exact_mask(self.fmt, role, q_pos, k_pos)

    def exact_source(self, layer: int, staging, k: torch.Tensor, v: torch.Tensor):
        """The exact K and V this step can read: its own tokens' rows, then the staged rows it reads."""
        return tuple(torch.cat([x, self.staged[r][layer].index_select(0, staging.read_slots)])
                     for r, x in (("k", k), ("v", v)))

    def stage(self, layer: int, staging, k: torch.Tensor, v: torch.Tensor) -> None:
        for role, x in (("k", k), ("v", v)):
            self.staged[role][layer].index_copy_(0, staging.write_slots, x.index_select(0, staging.write_rows))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor | None = None, staging=None, exact_k: torch.Tensor | None = None) -> None:
        """Quantize this step's tokens into their slots; per-channel keys instead quantize the groups this step
        completes, from `exact_k` (`exact_source`) at the rows `staging` names."""
        if self.fmt.granularity_of("k") == "per-channel":
            groups = exact_k.index_select(0, staging.group_rows)
            self._write(layer, "k", staging.group_meta, staging.group_slots,
                        self._unrotate(groups, staging.group_positions))
        else:
            self._write(layer, "k", slots, slots, self._unrotate(k, positions))
        self._write(layer, "v", slots, slots, v)

    def _unrotate(self, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self.fmt.pre_rope or not k.shape[0]:
            return k
        cos, signed_sin = self.rope(positions)
        return apply_rope(k, cos, -signed_sin)

    def _write(self, layer: int, role: str, meta_slots: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
        if not x.shape[0]:
            return
        scale = self.static[role][layer].reshape(-1) if self.fmt.static else None
        q = quantize(x, self.fmt, role, scale)
        codes = q.codes.view(torch.uint8) if self.fmt.is_fp8 else pack_codes(q.codes, self.fmt.bits)
        flat = self.codes[role][layer].view(-1, *self.codes[role].shape[-2:])
        flat.index_copy_(0, slots, codes)
        if role in self.scale:
            # Per-channel groups: one row of scales per group (all tokens of a group share it).
            step = self.fmt.token_group if self.fmt.granularity_of(role) == "per-channel" else 1
            for store, value in ((self.scale, q.scale), (self.zero, q.zero)):
                if role in store:
                    store[role][layer].view(-1, *store[role].shape[-2:]).index_copy_(0, meta_slots, value[::step].half())

    def gather(self, layer: int, blocks: torch.Tensor, per_sequence: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`blocks` holds the block tables of one or more sequences, `per_sequence` blocks each (default: one
        sequence); keys stored before RoPE are rotated to their positions in their sequence."""
        out = []
        for role in "kv":
            codes = self.codes[role][layer].index_select(0, blocks)
            codes = codes.view(FP8_TYPES[self.fmt.dtype]) if self.fmt.is_fp8 else unpack_codes(codes, self.fmt.bits)
            scale = zero = None
            if self.fmt.static:
                scale = self.static[role][layer]
            else:
                scale = self._read_meta(self.scale[role][layer], blocks, role)
                zero = self._read_meta(self.zero[role][layer], blocks, role) if self.fmt.asymmetric else None
            x = dequantize(QuantizedKV(codes, scale, zero, 0), self.fmt)
            if role == "k" and self.fmt.pre_rope:
                n = x.shape[0] * x.shape[1]
                span = (per_sequence or x.shape[0]) * self.block_size  # slots of one sequence's table
                cos, signed_sin = self.rope(torch.arange(n, device=x.device) % span)
                x = apply_rope(x.reshape(n, *x.shape[2:]), cos, signed_sin).reshape(x.shape)
            out.append(x.to(self.dtype))
        return out[0], out[1]

    def _read_meta(self, meta: torch.Tensor, blocks: torch.Tensor, role: str) -> torch.Tensor:
        m = meta.index_select(0, blocks).float()
        return m.repeat_interleave(self.fmt.token_group, dim=1) if self.fmt.granularity_of(role) == "per-channel" else m


def check_servable(fmt: KVCacheFormat, head_dim: int, block_size: int) -> None:
    if fmt.granularity == "per-channel" and block_size % fmt.token_group:
        raise ValueError(f"per-channel keys group {fmt.token_group} tokens, which must divide block_size "
                         f"{block_size} (a group's scales live in its block)")
    if not fmt.is_fp8 and head_dim * fmt.bits % 8:
        raise ValueError(f"head_dim {head_dim} cannot be packed at {fmt.bits} bits")


def _meta_shape(fmt: KVCacheFormat, role: str, block_size: int, n_kv: int, head_dim: int) -> tuple | None:
    """Per-block shape of the dynamic scales (and zeros) of `role`: None for static scales."""
    gran = fmt.granularity_of(role)
    if gran == "per-token":
        return (block_size, n_kv, 1)
    if gran == "per-channel":
        return (block_size // fmt.token_group, n_kv, head_dim)
    return None


def _code_width(fmt: KVCacheFormat, head_dim: int) -> int:
    return head_dim if fmt.is_fp8 else head_dim * fmt.bits // 8


@dataclass
class StagingMetadata:
    """Where this step's exact K/V come from and go to. Rows index the step's exact source: its own tokens
    (rows 0 .. T-1), then the staged tokens it reads (`read_slots`, rows T ...)."""

    read_slots: torch.Tensor  # [R] staging slots of each sequence's exact tokens before this step
    write_slots: torch.Tensor  # [W] staging slots this step's tokens go to (each sequence's last ones)
    write_rows: torch.Tensor  # [W] their rows among the step's tokens
    decode_rows: torch.Tensor  # [Bd, S] source rows of each decode's exact span (0 where unused)
    decode_positions: torch.Tensor  # [Bd, S] their positions (-1 where unused)
    prefill_spans: list[tuple[torch.Tensor, int]]  # per prefill: source rows of its exact span, first position
    group_rows: torch.Tensor  # [G * groups] per-channel key groups completed this step: their tokens' rows,
    group_slots: torch.Tensor  # pool slots,
    group_positions: torch.Tensor  # positions,
    group_meta: torch.Tensor  # [groups] and the slot of each group's scales


class StagingLanes:
    """One lane per running sequence: a ring of its last `ring` positions' exact K/V. A sequence that restarts
    (preempted then recomputed, or rewound) holds nothing exact before where it restarts."""

    def __init__(self, num_lanes: int, block_size: int, ring: int, key_group: int, device: torch.device):
        self.block_size, self.ring, self.group, self.device = block_size, ring, key_group, device
        self.free = list(range(num_lanes))
        self.lanes: dict[int, tuple[Sequence, int]] = {}  # request id -> (sequence, lane)
        self.staged_from: dict[int, int] = {}  # request id -> first position its lane holds exactly
        self.next_position: dict[int, int] = {}

    def _lane(self, seq: Sequence, start: int, end: int) -> int:
        rid = seq.request_id
        if rid not in self.lanes:
            if not self.free:  # lanes of sequences no longer running
                for other, (owner, lane) in list(self.lanes.items()):
                    if owner.status is not Status.RUNNING:
                        self.free.append(lane)
                        del self.lanes[other], self.staged_from[other], self.next_position[other]
            self.lanes[rid] = (seq, self.free.pop())
        if self.next_position.get(rid) != start:
            self.staged_from[rid] = start
        self.next_position[rid] = end
        return self.lanes[rid][1]

    def metadata(self, scheduled: list[tuple[Sequence, int]], num_tokens: int) -> StagingMetadata:
        ring, dev = self.ring, self.device
        read_slots, write_slots, write_rows, decode_spans, prefill_spans = [], [], [], [], []
        groups = ([], [], [], [])  # rows, slots, positions, scale slot of each completed key group
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
            self._completed_key_groups(seq, start, end, first, span, groups)
            row += n
        width = max((len(r) for r, _ in decode_spans), default=0)
        decode_rows = [r + [0] * (width - len(r)) for r, _ in decode_spans]
        decode_positions = [list(range(f, f + len(r))) + [-1] * (width - len(r)) for r, f in decode_spans]

        def t(x):
            return torch.tensor(x, dtype=torch.long, device=dev)

        return StagingMetadata(t(read_slots), t(write_slots), t(write_rows),
                               t(decode_rows).view(len(decode_spans), width),
                               t(decode_positions).view(len(decode_spans), width), prefill_spans, *map(t, groups))

    def _completed_key_groups(self, seq: Sequence, start: int, end: int, first: int, span: list[int],
                              groups: tuple[list, list, list, list]) -> None:
        """Per-channel keys: each group of `group` keys that completes in this step is quantized from its exact
        copies (its rows in the step's exact source)."""
        bs, group = self.block_size, self.group
        for last in range(start, end) if group else ():
            if (last + 1) % group:
                continue
            g = last + 1 - group
            if g < first:
                raise RuntimeError(f"per-channel key group at {g} began before the exact copies ({first})")
            groups[0].extend(span[g - first:g - first + group])
            groups[1].extend(seq.block_table[p // bs] * bs + p % bs for p in range(g, g + group))
            groups[2].extend(range(g, g + group))
            groups[3].append(seq.block_table[g // bs] * (bs // group) + g % bs // group)
