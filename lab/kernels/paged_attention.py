"""Paged attention kernels: decode (one query per sequence, split-KV) and prefill/extend (a chunk of new queries
over the cached prefix and themselves), reading K/V in place from the block pool and dequantizing on read.

Math (Vaswani et al., 2017; grouped-query attention, Ainslie et al., 2023): for query head h of a sequence with
L tokens, KV head g = h // G (G = n_heads / n_kv), and a query at position p,

    o = sum_{j <= p} softmax_j(q . k_j / sqrt(D)) v_j,   k_j at slot block_table[j // bs] * bs + j % bs.

Both kernels share one inner loop (`_attend`): the query rows of a program (several query heads of one KV
head, and in prefill several queries too) form one tile, so each K/V tile is loaded once per KV head, not once
per query head; keys are walked in tiles of BLOCK_N tokens with the online softmax of FlashAttention
(Dao, 2023, FlashAttention-2; the Triton fused-attention tutorial), in base 2 (exp2 with log2(e) folded into
the scale). Slots are computed per token from the block table, so any block size works with any tile.

Decode splits each sequence's context across `num_splits` programs (Flash-Decoding, Dao et al., 2023): program
s writes its normalized partial output o_s and log-sum-exp lse_s, and a merge kernel combines them,
o = sum_s 2^(lse_s - lse) o_s with lse = log2 sum_s 2^lse_s. With one split the kernel writes o directly.

Memory traffic, as DRAM would see it if every reuse hit a cache (`decode_traffic`, `prefill_traffic`; the
interpreter's count of distinct bytes touched, `lab.kernels.traffic`, equals them exactly, tested), for B
sequences of L_b tokens, T new queries, P = `PagedKVCache.bytes_per_token`, H query heads of D, b bytes per
q/o element, S decode splits:
    K/V     sum_b L_b P                      (each byte once: GQA rows share a KV head's tiles)
    q, o    2 B H D b (decode), 2 T H D b (prefill)
    tables  4 sum_b ceil(L_b / bs) + 4 B (lengths; prefill: + 8 B for query starts and lengths)
    scales  static: 4 n_kv per role
    split   S > 1: fp32 partials and log-sum-exps written then read by the merge, 2 B H S (D + 1) 4
The requested bytes are larger: a program loads its block-table entry once per token and a packed code byte
once per element it holds; prefill query tiles after the first re-read the prefix (they hit L2 on a GPU).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .kv_codec import PagedKVCache, load_tile

LOG2E = 1.4426950408889634


@triton.jit
def _attend(q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, table_ptr, lo, hi, kv_head, offs_d, dmask,
            qk_scale, block_size, cache_stride_slot, cache_stride_head, scale_stride_slot, scale_stride_head,
            BLOCK_N: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr, PER_TOKEN: tl.constexpr,
            ASYM: tl.constexpr, PRECISION: tl.constexpr):
    """Online softmax of the rows q [R, D] (at positions q_pos [R]) over key positions lo .. hi - 1 that they
    can see; returns the unnormalized output [R, D], the running max and the sum of exponentials (base 2)."""
    m_i = tl.full([q.shape[0]], float("-inf"), tl.float32)
    l_i = tl.zeros([q.shape[0]], tl.float32)
    acc = tl.zeros([q.shape[0], q.shape[1]], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < hi
        block = tl.load(table_ptr + pos // block_size, mask=pmask, other=0).to(tl.int64)
        slots = block * block_size + pos % block_size
        tile_mask = pmask[:, None] & dmask[None, :]
        k = load_tile(kc_ptr, ks_ptr, kz_ptr, slots, kv_head, offs_d, tile_mask, cache_stride_slot,
                      cache_stride_head, scale_stride_slot, scale_stride_head, KIND, BITS, PER_TOKEN, ASYM)
        v = load_tile(vc_ptr, vs_ptr, vz_ptr, slots, kv_head, offs_d, tile_mask, cache_stride_slot,
                      cache_stride_head, scale_stride_slot, scale_stride_head, KIND, BITS, PER_TOKEN, ASYM)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * qk_scale
        s = tl.where(pmask[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet stay at zero
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _decode_kernel(q_ptr, out_ptr, lse_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, tables_ptr, lens_ptr,
                   stride_qb, stride_qh, stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_table, qk_scale,
                   D, split_len,
                   block_size, cache_stride_slot, cache_stride_head, scale_stride_slot, scale_stride_head,
                   GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   KIND: tl.constexpr, BITS: tl.constexpr, PER_TOKEN: tl.constexpr, ASYM: tl.constexpr,
                   PRECISION: tl.constexpr, WRITE_LSE: tl.constexpr):
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + b)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, length)
    offs_h, offs_d = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_D)
    hmask, dmask = offs_h < GROUP, offs_d < D
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)
    q_pos = tl.zeros([BLOCK_H], tl.int32) + length - 1
    acc, m_i, l_i = _attend(q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, tables_ptr + b * stride_table,
                            lo, hi, kv_head, offs_d, dmask, qk_scale, block_size, cache_stride_slot,
                            cache_stride_head, scale_stride_slot, scale_stride_head, BLOCK_N, KIND, BITS, PER_TOKEN,
                            ASYM, PRECISION)
    o = acc / tl.maximum(l_i, 1e-30)[:, None]  # an empty split (past the end) writes 0 with lse -inf
    ptr = out_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(ptr, o.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])
    if WRITE_LSE:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=hmask)


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, out_ptr, S, D, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob,
                  stride_oh, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    smask, dmask = offs_s < S, offs_d < D
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, axis=0))  # split 0 always holds a token, so the max is finite
    part = tl.load(part_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                   mask=smask[:, None] & dmask[None, :], other=0.0)
    o = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _prefill_kernel(q_ptr, out_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, tables_ptr, starts_ptr, qlens_ptr,
                    lens_ptr,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_table, qk_scale, D, block_size,
                    cache_stride_slot, cache_stride_head, scale_stride_slot, scale_stride_head,
                    GROUP: tl.constexpr, QUERIES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr, PER_TOKEN: tl.constexpr,
                    ASYM: tl.constexpr, PRECISION: tl.constexpr):
    b, kv_head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(starts_ptr + b)
    qlen = tl.load(qlens_ptr + b)
    length = tl.load(lens_ptr + b)
    # Row r is query tile * QUERIES + r // GROUP of query head kv_head * GROUP + r % GROUP.
    offs_r, offs_d = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_D)
    i = tile * QUERIES + offs_r // GROUP
    rmask = (offs_r < QUERIES * GROUP) & (i < qlen)
    heads = kv_head * GROUP + offs_r % GROUP
    dmask = offs_d < D
    mask = rmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + (start + i)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask, other=0.0)
    q_pos = length - qlen + i
    hi = tl.minimum(length, length - qlen + (tile + 1) * QUERIES)  # past the tile's last query: invisible
    hi = tl.where(tile * QUERIES < qlen, hi, 0)  # a tile past this sequence's queries: no keys, no stores
    acc, m_i, l_i = _attend(q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, tables_ptr + b * stride_table,
                            0, hi, kv_head, offs_d, dmask, qk_scale, block_size, cache_stride_slot,
                            cache_stride_head, scale_stride_slot, scale_stride_head, BLOCK_N, KIND, BITS, PER_TOKEN,
                            ASYM, PRECISION)
    o = acc / tl.maximum(l_i, 1e-30)[:, None]
    tl.store(out_ptr + (start + i)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=mask)


def _cache_args(cache: PagedKVCache) -> tuple:
    dummy = cache.k  # pointer arguments a format does not read
    return tuple(t if t is not None else dummy for t in (cache.k_scale, cache.v_scale, cache.k_zero, cache.v_zero))


def _check(q: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor, context_lens: torch.Tensor,
           values: bool = True) -> int:
    """Shapes, and (`values`: reading them back from the device) every context within its block table and
    every block in the pool; returns the GQA group size."""
    if q.dim() != 3 or q.shape[2] != cache.head_dim:
        raise ValueError(f"q must be [tokens, heads, {cache.head_dim}], got {tuple(q.shape)}")
    if q.shape[1] % cache.n_kv:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of the cache's {cache.n_kv} KV heads")
    if block_tables.dim() != 2 or context_lens.shape != (block_tables.shape[0],):
        raise ValueError(f"block_tables must be [sequences, max_blocks] and context_lens [sequences], got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if values and context_lens.numel():
        capacity = block_tables.shape[1] * cache.block_size
        if int(context_lens.min()) < 1 or int(context_lens.max()) > capacity:
            raise ValueError(f"context lengths must be in [1, {capacity}] (block tables of {block_tables.shape[1]} "
                             f"blocks of {cache.block_size}), got {context_lens.tolist()}")
        if int(block_tables.max()) >= cache.k.shape[0] or int(block_tables.min()) < 0:
            raise ValueError(f"block ids must be in [0, {cache.k.shape[0]}), got {int(block_tables.min())}.."
                             f"{int(block_tables.max())}")
    return q.shape[1] // cache.n_kv


def _check_queries(starts: torch.Tensor, lens: torch.Tensor, context_lens: torch.Tensor, rows: int,
                   values: bool = True) -> None:
    if starts.shape != context_lens.shape or lens.shape != context_lens.shape:
        raise ValueError(f"query_starts and query_lens need one entry per sequence ({context_lens.numel()}), got "
                         f"{tuple(starts.shape)} and {tuple(lens.shape)}")
    if values and starts.numel() and (int(lens.min()) < 1 or bool((lens > context_lens).any()) or int(starts.min()) < 0
                           or int((starts + lens).max()) > rows):
        raise ValueError(f"query lengths {lens.tolist()} must be >= 1 and within the context lengths "
                         f"{context_lens.tolist()}, rows starting at {starts.tolist()} within the {rows} query rows")


def _precision(q: torch.Tensor) -> str:
    """fp32 inputs multiply in full precision ("ieee"); a GPU would otherwise use TF32."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


# Warps per program and the prefill's query rows per program, chosen so that ptxas gives every launch the lab
# makes a stack-free register allocation (registers that do not fit spill to the stack, in local memory) for
# bf16 on sm_90 and sm_80; `python -m lab.kernels.aot` compiles each launch with these and fails on any spill.
# Measured there (registers / stack bytes per thread, sm_90 and sm_80), head_dim 128 unless said:
#   decode, bf16 cache, 4 warps: 168/0, 225/0 (8 warps spilled 8 bytes on sm_90); 254/0 at head_dim 256
#   decode, per-token int8/int4/int2/fp8 (scales dequantized per token in the loop), 4 warps: 255 with 120 to
#   336 stack bytes; 8 warps: 208-252/0
#   prefill, bf16, 64 rows: 4 warps (Triton's default) 255/32, 255/344 at head_dim 256; 8 warps 184/0; 32 rows
#   on 8 warps at head_dim 256 255/0; per-token int4/int2 on sm_80 (codes unpacked in the loop), 64 rows on 8
#   warps 255/40, 32 rows 214/0; per-token int8 on sm_80, 64 rows 0 stack bytes, 32 rows 8.
# Their speed needs a GPU (gpu/kernels_gpu.py): none has been lent yet.
PREFILL_WARPS = 8


def decode_warps(per_token: bool) -> int:
    """Warps per decode program: 8 where per-token scales are dequantized in the loop, else 4."""
    return 8 if per_token else 4


def prefill_block_rows(head_dim: int, flags: dict) -> int:
    """Query rows (heads x queries) per prefill program for a cache of `flags` (`PagedKVCache.flags`): the fp32
    accumulator is rows x head_dim per program, so wider heads, and sub-byte codes unpacked beside per-token
    scales, get 32 rows instead of 64."""
    return 32 if head_dim > 128 or (flags["PER_TOKEN"] and flags["BITS"] < 8) else 64


def default_num_splits(batch: int, n_kv: int, max_len: int, device: torch.device) -> int:
    """Enough programs to fill a GPU's SMs twice, each split at least 256 tokens; 1 on the CPU interpreter."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(max_len, 256), triton.cdiv(2 * sms, batch * n_kv)))


def split_plan(max_len: int, num_splits: int, block_n: int) -> tuple[int, int]:
    """(tokens per split, splits): splits are whole key tiles, so fewer than asked may cover the context."""
    split_len = triton.cdiv(triton.cdiv(max_len, num_splits), block_n) * block_n
    return split_len, triton.cdiv(max_len, split_len)


def paged_decode_attention(q: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, num_splits: int | None = None, block_n: int = 32,
                           max_context: int | None = None, validate: bool = True) -> torch.Tensor:
    """q [B, n_heads, D], one query per sequence at position context_lens[b] - 1 (its own K/V already in the
    cache); returns [B, n_heads, D]. `max_context` (the largest context length) saves reading it back;
    validate=False skips the checks that read lengths and block ids back from the device (for callers that
    built them, like the engine, and for timing the kernels alone)."""
    group = _check(q, cache, block_tables, context_lens, validate)
    B, H, D = q.shape
    out = torch.empty_like(q)
    if not B:
        return out
    max_len = max_context or int(context_lens.max())
    split_len, splits = split_plan(max_len, num_splits or default_num_splits(B, cache.n_kv, max_len, q.device),
                                   block_n)
    block_d = max(16, triton.next_power_of_2(D))
    if splits == 1:
        part, lse, strides, lse_strides = out, out, (out.stride(0), out.stride(1), 0), (0, 0)
    else:
        part = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
        strides, lse_strides = (part.stride(0), part.stride(1), part.stride(2)), (lse.stride(0), lse.stride(1))
    _decode_kernel[(B, cache.n_kv, splits)](
        q, part, lse, cache.k, cache.v, *_cache_args(cache), block_tables, context_lens,
        q.stride(0), q.stride(1), *strides, *lse_strides, block_tables.stride(0), LOG2E / math.sqrt(D), D, split_len,
        cache.block_size, cache.k.stride(1), cache.k.stride(2), *cache.scale_strides(),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        **cache.flags, PRECISION=_precision(q), WRITE_LSE=splits > 1,
        num_warps=decode_warps(cache.flags["PER_TOKEN"]))
    if splits > 1:
        _merge_kernel[(B, H)](part, lse, out, splits, D, *strides, *lse_strides, out.stride(0), out.stride(1),
                              BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d)
    return out


def paged_prefill_attention(q: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor,
                            query_starts: torch.Tensor, query_lens: torch.Tensor, context_lens: torch.Tensor,
                            out: torch.Tensor | None = None, block_rows: int | None = None, block_n: int = 32,
                            max_query_len: int | None = None, validate: bool = True) -> torch.Tensor:
    """q [T, n_heads, D]: sequence b's new queries are rows query_starts[b] .. + query_lens[b] - 1, the last of
    its context_lens[b] positions (their K/V already in the cache). Writes those rows of `out` (default: a new
    [T, n_heads, D]; rows of no sequence are left as they are) and returns it. `validate` as for decode.
    `block_rows` defaults to `prefill_block_rows` for D and the cache's format."""
    group = _check(q, cache, block_tables, context_lens, validate)
    B = block_tables.shape[0]
    _check_queries(query_starts, query_lens, context_lens, q.shape[0], validate)
    out = torch.empty_like(q) if out is None else out
    if not B:
        return out
    rows = block_rows or prefill_block_rows(q.shape[2], cache.flags)
    block_r = max(rows, triton.next_power_of_2(group))
    queries = block_r // group
    max_q = max_query_len or int(query_lens.max())
    _prefill_kernel[(B, cache.n_kv, triton.cdiv(max_q, queries))](
        q, out, cache.k, cache.v, *_cache_args(cache), block_tables, query_starts, query_lens, context_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), LOG2E / math.sqrt(q.shape[2]),
        q.shape[2], cache.block_size, cache.k.stride(1), cache.k.stride(2), *cache.scale_strides(),
        GROUP=group, QUERIES=queries, BLOCK_R=block_r, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(q.shape[2])), **cache.flags, PRECISION=_precision(q),
        num_warps=PREFILL_WARPS)
    return out


def _context(cache: PagedKVCache, table: torch.Tensor, length: int, dtype: torch.dtype):
    pos = torch.arange(length, device=table.device)
    slots = table[pos // cache.block_size] * cache.block_size + pos % cache.block_size
    return cache.read("k", slots).to(dtype), cache.read("v", slots).to(dtype)


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The references' math, written out: softmax(q k^T / sqrt(d)) v in float32, q [T, n_heads, d] the last T of
    the S positions of k, v [S, n_kv_heads, d] (query i sees keys 0 .. S - T + i), each KV head repeated for the
    query heads of its group."""
    T, S, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) / math.sqrt(q.shape[-1])
    future = torch.arange(S, device=q.device)[None, :] > torch.arange(S - T, S, device=q.device)[:, None]
    return torch.einsum("hts,shd->thd", scores.masked_fill(future, float("-inf")).softmax(-1), v).to(q.dtype)


def paged_decode_attention_ref(q: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor,
                               context_lens: torch.Tensor) -> torch.Tensor:
    """Decode attention in PyTorch: gather each sequence's context, dequantized to q's dtype, then attend."""
    _check(q, cache, block_tables, context_lens)
    return torch.stack([_reference_attention(q[b:b + 1], *_context(cache, block_tables[b], int(n), q.dtype))[0]
                        for b, n in enumerate(context_lens.tolist())]) if q.shape[0] else torch.empty_like(q)


def paged_prefill_attention_ref(q: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor,
                                query_starts: torch.Tensor, query_lens: torch.Tensor,
                                context_lens: torch.Tensor) -> torch.Tensor:
    _check(q, cache, block_tables, context_lens)
    _check_queries(query_starts, query_lens, context_lens, q.shape[0])
    out = torch.zeros_like(q)
    for b, n in enumerate(context_lens.tolist()):
        a, e = int(query_starts[b]), int(query_starts[b]) + int(query_lens[b])
        out[a:e] = _reference_attention(q[a:e], *_context(cache, block_tables[b], n, q.dtype))
    return out


def _context_traffic(context_lens: list[int], cache: PagedKVCache) -> int:
    """K/V of every context once, its block-table entries and length, static scales."""
    static = 2 * 4 * cache.n_kv if cache.fmt is not None and cache.fmt.static else 0
    return (sum(context_lens) * cache.bytes_per_token + 4 * sum(-(-n // cache.block_size) for n in context_lens)
            + 4 * len(context_lens) + static)


def decode_traffic(context_lens: list[int], cache: PagedKVCache, n_heads: int, q_bytes: int,
                   num_splits: int = 1, block_n: int = 32) -> int:
    """Bytes decode attention moves (module docstring): the context's K/V once, q in, o out, the block tables,
    and with several splits (as `split_plan` makes them) the fp32 partials written and read back."""
    B, D = len(context_lens), cache.head_dim
    total = _context_traffic(context_lens, cache) + 2 * B * n_heads * D * q_bytes
    num_splits = split_plan(max(context_lens), num_splits, block_n)[1]
    if num_splits > 1:
        total += 2 * B * n_heads * num_splits * (D + 1) * 4
    return total


def prefill_traffic(query_lens: list[int], context_lens: list[int], cache: PagedKVCache, n_heads: int,
                    q_bytes: int) -> int:
    """Bytes prefill attention moves with every reuse cached: each context's K/V once, q in, o out."""
    return (_context_traffic(context_lens, cache) + 8 * len(query_lens)
            + 2 * sum(query_lens) * n_heads * cache.head_dim * q_bytes)


def prefill_flops(query_lens: list[int], context_lens: list[int], n_heads: int, head_dim: int) -> int:
    """Multiply-adds x 2 of causal attention: a query at position p scores p + 1 keys and sums as many values."""
    total = 0
    for qlen, n in zip(query_lens, context_lens):
        # positions n - qlen .. n - 1 see n - qlen + 1 .. n keys
        total += qlen * (n - qlen) + qlen * (qlen + 1) // 2
    return 4 * n_heads * head_dim * total
