"""Replay recompute: rebuild a window of tokens' keys and values from their stored layer inputs, into the cache.

Instead of keeping K and V of every layer, a cache can keep each token's attention input x (the layer's input
after its RMSNorm, `hidden` numbers for both K and V, against 2 n_kv D for the pair) and recompute

    k = RoPE(x W_k^T + b_k, position),   v = x W_v^T + b_v

when attention needs them. Whether that pays is a trade of arithmetic for memory traffic (the replay study).
RoPE rotates pairs (i, i + D/2) (the Hugging Face layout): with a = x W_k[:D/2]^T and c = x W_k[D/2:]^T,
k = [a cos - c sin, c cos + a sin], so the kernel computes the two halves as separate products and rotates
them in registers: no shuffle of the head dimension.

One program computes BLOCK_M tokens of one KV head's K or V (grid: token tiles x n_kv x 2), looping over the
hidden dimension in tiles of BLOCK_K, and writes them to their slots. A quantized cache gets the K/V through
`reshape_and_cache` (quantized on the way).

Memory traffic and work for N tokens, hidden size E, n_kv heads of D, b bytes per element:
    read   N E b (x) + 2 n_kv D E b (W_k, W_v; each token tile reads them: ceil(N / BLOCK_M) times, from L2
           after the first) + N D 4 (cos, sin) + 16 N (positions, slots)
    written N P (P = `PagedKVCache.bytes_per_token`; a quantized cache also writes and reads back N 2 n_kv D b
           of dense K/V and quantizes them with `reshape_and_cache`)
    FLOPs  2 N E (2 n_kv D)
(`replay_traffic` for a plain cache, `replay_flops`; the traffic equals the interpreter's count, tested.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .kv_codec import PagedKVCache
from .kv_write import reshape_and_cache, reshape_and_cache_ref


def replay_traffic(num_tokens: int, hidden: int, cache: PagedKVCache, in_bytes: int) -> int:
    """Bytes replay moves into a plain cache, each weight read once (module docstring)."""
    kv = 2 * cache.n_kv * cache.head_dim
    return (num_tokens * hidden * in_bytes + kv * hidden * in_bytes + num_tokens * cache.head_dim * 4
            + 16 * num_tokens + num_tokens * cache.bytes_per_token)


def replay_flops(num_tokens: int, hidden: int, cache: PagedKVCache) -> int:
    return 2 * num_tokens * hidden * 2 * cache.n_kv * cache.head_dim


@triton.jit
def _replay_kernel(x_ptr, w_ptr, b_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, k_out, v_out, N, E, D, kv_size,
                   stride_xm, stride_wn, stride_wk, stride_cos, stride_slot, stride_head,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HALF: tl.constexpr,
                   PRECISION: tl.constexpr):
    tile, head, role = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # role 0: K, 1: V
    half = D // 2
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, BLOCK_HALF)
    mmask, jmask = offs_m < N, offs_j < half
    rows = role * kv_size + head * D + offs_j  # output features of the first half; the second is + half
    acc1 = tl.zeros([BLOCK_M, BLOCK_HALF], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_HALF], tl.float32)
    for k0 in range(0, E, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < E
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mmask[:, None] & kmask[None, :],
                    other=0.0)
        wmask = kmask[:, None] & jmask[None, :]
        w1 = tl.load(w_ptr + rows[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=wmask, other=0.0)
        w2 = tl.load(w_ptr + (rows + half)[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=wmask, other=0.0)
        acc1 = tl.dot(x, w1, acc1, input_precision=PRECISION)
        acc2 = tl.dot(x, w2, acc2, input_precision=PRECISION)
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + rows, mask=jmask, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + rows + half, mask=jmask, other=0.0).to(tl.float32)[None, :]
    # Keys are rotated to their positions; values are not (rotate by angle 0).
    pos = tl.load(pos_ptr + offs_m, mask=mmask, other=0)
    tmask = mmask[:, None] & jmask[None, :]
    cos = tl.load(cos_ptr + pos[:, None] * stride_cos + offs_j[None, :], mask=tmask, other=1.0)
    sin = tl.load(sin_ptr + pos[:, None] * stride_cos + offs_j[None, :], mask=tmask, other=0.0)
    is_key = role == 0
    cos = tl.where(is_key, cos, 1.0)
    sin = tl.where(is_key, sin, 0.0)
    out1 = acc1 * cos - acc2 * sin
    out2 = acc2 * cos + acc1 * sin
    slots = tl.load(slot_ptr + offs_m, mask=mmask, other=0).to(tl.int64)
    base = tl.where(is_key, k_out, v_out) + slots[:, None] * stride_slot + head * stride_head + offs_j[None, :]
    tl.store(base, out1.to(k_out.dtype.element_ty), mask=tmask)
    tl.store(base + half, out2.to(k_out.dtype.element_ty), mask=tmask)


def _check(x, w_kv, positions, slot_mapping, cache: PagedKVCache, cos) -> None:
    kv = 2 * cache.n_kv * cache.head_dim
    if x.dim() != 2 or w_kv.shape != (kv, x.shape[1]):
        raise ValueError(f"x must be [tokens, hidden] and w_kv [{kv}, hidden] (K rows, then V rows), got "
                         f"{tuple(x.shape)} and {tuple(w_kv.shape)}")
    if positions.shape != (x.shape[0],) or slot_mapping.shape != (x.shape[0],):
        raise ValueError(f"positions and slot_mapping must have one entry per token ({x.shape[0]}), got "
                         f"{tuple(positions.shape)} and {tuple(slot_mapping.shape)}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= cos.shape[0]):
        raise ValueError(f"positions must be in [0, {cos.shape[0]}) (the rotary table), got "
                         f"{int(positions.min())}..{int(positions.max())}")
    num_slots = cache.k.shape[0] * cache.block_size
    if slot_mapping.numel() and (int(slot_mapping.min()) < 0 or int(slot_mapping.max()) >= num_slots):
        raise ValueError(f"slots must be in [0, {num_slots}), got {int(slot_mapping.min())}..{int(slot_mapping.max())}")


def replay_kv(x: torch.Tensor, w_kv: torch.Tensor, b_kv: torch.Tensor | None, positions: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, cache: PagedKVCache, slot_mapping: torch.Tensor,
              block_m: int = 32, block_k: int = 64) -> None:
    """Recompute K and V of tokens x [N, hidden] at `positions` [N] and write them to `slot_mapping` [N].

    w_kv [2 n_kv D, hidden] are the K rows then the V rows of the layer's projection (any strides: the engine
    keeps its weights transposed), b_kv their bias or None; cos, sin [max_positions, D/2] the rotary tables
    (`LlamaModel.rope.cos`, `.sin`)."""
    _check(x, w_kv, positions, slot_mapping, cache, cos)
    N, D = x.shape[0], cache.head_dim
    if not N:
        return
    if cache.fmt is None:
        out_k, out_v, slots = cache.k, cache.v, slot_mapping
        stride_slot, stride_head = cache.k.stride(1), cache.k.stride(2)
    else:  # computed densely, then quantized into the pool
        out_k, out_v = (torch.empty(N, cache.n_kv, D, dtype=x.dtype, device=x.device) for _ in "kv")
        slots = torch.arange(N, device=x.device)
        stride_slot, stride_head = out_k.stride(0), out_k.stride(1)
    _replay_kernel[(triton.cdiv(N, block_m), cache.n_kv, 2)](
        x, w_kv, b_kv if b_kv is not None else w_kv, positions, cos, sin, slots, out_k, out_v, N, x.shape[1], D,
        cache.n_kv * D, x.stride(0), w_kv.stride(0), w_kv.stride(1), cos.stride(0), stride_slot, stride_head,
        HAS_BIAS=b_kv is not None, BLOCK_M=block_m, BLOCK_K=block_k,
        BLOCK_HALF=max(16, triton.next_power_of_2(D // 2)), PRECISION="ieee" if x.dtype == torch.float32 else "tf32")
    if cache.fmt is not None:
        reshape_and_cache(out_k, out_v, cache, slot_mapping)


def replay_kv_ref(x: torch.Tensor, w_kv: torch.Tensor, b_kv: torch.Tensor | None, positions: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, cache: PagedKVCache, slot_mapping: torch.Tensor) -> None:
    """The same in PyTorch: the projection, the rotation of each key's halves [k1, k2] by the position's angles
    to [k1 cos - k2 sin, k2 cos + k1 sin] (in float32), and the reference write."""
    _check(x, w_kv, positions, slot_mapping, cache, cos)
    k, v = F.linear(x, w_kv, b_kv).view(x.shape[0], 2, cache.n_kv, cache.head_dim).unbind(1)
    c, s = cos[positions].unsqueeze(1).float(), sin[positions].unsqueeze(1).float()
    k1, k2 = k.float().chunk(2, dim=-1)
    k = torch.cat((k1 * c - k2 * s, k2 * c + k1 * s), -1).to(v.dtype)
    reshape_and_cache_ref(k, v, cache, slot_mapping)
