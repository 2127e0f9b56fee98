"""KV write (vLLM's `reshape_and_cache`): scatter a step's new keys and values into the paged pool.

For new token t and KV head h, with s = slot_mapping[t] (block s // block_size, offset s % block_size):

    cache_k[s, h, :] = Q(k[t, h, :]),   cache_v[s, h, :] = Q(v[t, h, :])

where Q is the identity (a cast) for a plain cache and `lab.kv.format.quantize` for a quantized one: a per-token
scale (and zero point) computed from the token's own head_dim values and stored beside its codes, or the
layer's static scale. Slots < 0 are skipped (padding). One program writes BLOCK_T tokens of one KV head, K and V.

Memory traffic, T tokens, n_kv heads of D, inputs of b bytes per element, codes of c bits:
    read   2 T n_kv D b  (k, v)  + 8 T  (slot mapping)  + 8 n_kv (static scales)
    written 2 T n_kv (D c / 8 + m)  where m is 0 (static or plain, c = 8 b), 2 (fp8 per-token scale) or 4 (int
    per-token scale and zero).
(`write_traffic`; equal to the bytes the interpreter's programs touch, `lab.kernels.traffic`, tested.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kv.format import pack_codes, quantize

from .kv_codec import PagedKVCache, fp8_limits, quantize_tile


def write_traffic(num_tokens: int, cache: PagedKVCache, in_bytes: int) -> int:
    """Bytes the write moves (module docstring): k, v and the slots read, codes and scales written."""
    static = 2 * 4 * cache.n_kv if cache.fmt is not None and cache.fmt.static else 0
    return 2 * num_tokens * cache.n_kv * cache.head_dim * in_bytes + 8 * num_tokens + static \
        + num_tokens * cache.bytes_per_token


@triton.jit
def _write_role(x_ptr, stride_xt, stride_xh, cache_ptr, scale_ptr, zero_ptr, offs_t, slots, head, offs_d, tmask,
                D, cache_stride_slot, cache_stride_head, scale_stride_slot, scale_stride_head,
                BLOCK_D: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr, PER_TOKEN: tl.constexpr,
                ASYM: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, FP8_MAX: tl.constexpr):
    mask = tmask[:, None] & (offs_d < D)[None, :]
    x = tl.load(x_ptr + offs_t[:, None] * stride_xt + head * stride_xh + offs_d[None, :], mask=mask, other=0.0)
    row = cache_ptr + slots[:, None] * cache_stride_slot + head * cache_stride_head
    if KIND == 0:
        tl.store(row + offs_d[None, :], x.to(cache_ptr.dtype.element_ty), mask=mask)
    else:
        static = 0.0
        if not PER_TOKEN:
            static = tl.load(scale_ptr + head)
        code, scale, zero = quantize_tile(x.to(tl.float32), static, mask, KIND, BITS, PER_TOKEN, ASYM,
                                          EXP_BITS, MAN_BITS, FP8_MAX)
        PER: tl.constexpr = 8 // BITS
        if PER == 1:
            packed = code
            offs_b = offs_d
        else:
            # Element d = b * PER + j goes to bits j * BITS of byte b (lab.kv.format.pack_codes).
            shifts = tl.arange(0, PER) * BITS
            packed = tl.sum(tl.reshape(code, [code.shape[0], BLOCK_D // PER, PER]) << shifts[None, None, :], axis=2)
            offs_b = tl.arange(0, BLOCK_D // PER)
        bmask = tmask[:, None] & (offs_b < D // PER)[None, :]
        tl.store(row + offs_b[None, :], packed.to(tl.uint8), mask=bmask)
        if PER_TOKEN:
            meta = slots[:, None] * scale_stride_slot + head * scale_stride_head
            tl.store(scale_ptr + meta, scale.to(tl.float16), mask=tmask[:, None])
            if ASYM:
                tl.store(zero_ptr + meta, zero.to(tl.float16), mask=tmask[:, None])


@triton.jit
def _reshape_and_cache_kernel(k_ptr, v_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, T, D,
                              stride_kt, stride_kh, stride_vt, stride_vh, cache_stride_slot, cache_stride_head,
                              scale_stride_slot, scale_stride_head,
                              BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr,
                              PER_TOKEN: tl.constexpr, ASYM: tl.constexpr, EXP_BITS: tl.constexpr,
                              MAN_BITS: tl.constexpr, FP8_MAX: tl.constexpr):
    head = tl.program_id(1)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    slots = tl.load(slot_ptr + offs_t, mask=offs_t < T, other=-1).to(tl.int64)
    tmask = (offs_t < T) & (slots >= 0)
    _write_role(k_ptr, stride_kt, stride_kh, kc_ptr, ks_ptr, kz_ptr, offs_t, slots, head, offs_d, tmask, D,
                cache_stride_slot, cache_stride_head, scale_stride_slot, scale_stride_head,
                BLOCK_D, KIND, BITS, PER_TOKEN, ASYM, EXP_BITS, MAN_BITS, FP8_MAX)
    _write_role(v_ptr, stride_vt, stride_vh, vc_ptr, vs_ptr, vz_ptr, offs_t, slots, head, offs_d, tmask, D,
                cache_stride_slot, cache_stride_head, scale_stride_slot, scale_stride_head,
                BLOCK_D, KIND, BITS, PER_TOKEN, ASYM, EXP_BITS, MAN_BITS, FP8_MAX)


def _check(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, slot_mapping: torch.Tensor,
           values: bool = True) -> None:
    if k.dim() != 3 or k.shape != v.shape or k.shape[1:] != (cache.n_kv, cache.head_dim):
        raise ValueError(f"k and v must both be [tokens, {cache.n_kv}, {cache.head_dim}] for this cache, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({k.shape[0]},)")
    num_slots = cache.k.shape[0] * cache.block_size
    if values and slot_mapping.numel() and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot {int(slot_mapping.max())} is outside the pool of {num_slots} slots")


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, slot_mapping: torch.Tensor,
                      block_t: int = 16, validate: bool = True) -> None:
    """Write k, v [T, n_kv, D] to `cache` at `slot_mapping` [T] (flat slots; < 0: skip). validate=False skips
    reading the slots back to check them (the engine built them)."""
    _check(k, v, cache, slot_mapping, validate)
    T = k.shape[0]
    if not T:
        return
    flags = cache.flags
    block_d = max(16, triton.next_power_of_2(cache.head_dim))
    dummy = cache.k  # pointer arguments a format does not read
    ks, vs = cache.k_scale if cache.k_scale is not None else dummy, cache.v_scale if cache.v_scale is not None else dummy
    kz, vz = cache.k_zero if cache.k_zero is not None else dummy, cache.v_zero if cache.v_zero is not None else dummy
    _reshape_and_cache_kernel[(triton.cdiv(T, block_t), cache.n_kv)](
        k, v, slot_mapping, cache.k, cache.v, ks, vs, kz, vz, T, cache.head_dim,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), cache.k.stride(1), cache.k.stride(2),
        *cache.scale_strides(), BLOCK_T=block_t, BLOCK_D=block_d, **flags, **fp8_limits(cache.fmt))


def reshape_and_cache_ref(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, slot_mapping: torch.Tensor) -> None:
    """The same write in PyTorch, with `lab.kv.format.quantize` (what the engine's torch backend stores)."""
    _check(k, v, cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for role, x in (("k", k[keep]), ("v", v[keep])):
        pool = getattr(cache, role).view(-1, *cache.k.shape[2:])
        fmt = cache.fmt
        if fmt is None:
            pool.index_copy_(0, slots, x.to(pool.dtype))
            continue
        scale = getattr(cache, f"{role}_scale")
        static = (scale[:1] if fmt.granularity == "per-tensor" else scale) if fmt.static else None
        q = quantize(x, fmt, role, static)
        codes = q.codes.view(torch.uint8) if fmt.is_fp8 else pack_codes(q.codes, fmt.bits)
        pool.index_copy_(0, slots, codes)
        if not fmt.static:
            scale.view(-1, cache.n_kv, 1).index_copy_(0, slots, q.scale.half())
            if fmt.asymmetric:
                getattr(cache, f"{role}_zero").view(-1, cache.n_kv, 1).index_copy_(0, slots, q.zero.half())
