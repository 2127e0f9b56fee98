"""Where the paged KV cache lives: plain tensors in the model's dtype, or quantized codes with their scales.

Both stores hold, per layer, `num_blocks` blocks of `block_size` token slots for K and V, and offer the two
operations paged attention needs: `write` this step's keys and values to their slots, and `gather` whole
blocks back as [n, block_size, n_kv_heads, head_dim] in the compute dtype.

`QuantizedKVStore` keeps the codes of a `lab.quant.kv.KVCacheFormat` in the pool (integers packed along the
head dimension, fp8 as torch's float8 types) and, for per-token formats, an fp16 scale (and an fp16 zero point
on asymmetric integer grids) per token and KV head; static formats keep one calibrated scale per layer (and
head) outside the pool. Reads dequantize the gathered blocks. With `pre_rope`, keys are un-rotated before
they are quantized and rotated back on read, at their positions in the sequence. The bytes of the pool are
what `lab.memory.kv_bytes_per_token` predicts for the format (tested).

Served here: every dtype at per-tensor, per-head and per-token granularity, pre- or post-RoPE. Not served by
the paged engine: per-channel keys and a full-precision window, which need a staging area for the tokens of
a block still filling (KIVI's residual); `lab.quant.kv_calibration.QuantizedContiguousKVCache` has them.
"""

from __future__ import annotations

import torch

from lab.models.llama import apply_rope
from lab.quant.kv import FP8_TYPES, KVCacheFormat, QuantizedKV, dequantize, pack_codes, quantize, unpack_codes


class PlainKVStore:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (n_layers, num_blocks, block_size, n_kv, head_dim)
        # Zero-filled: masked positions are multiplied by zero probabilities, and 0 * NaN would not be 0.
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(n_layers, block_size, n_kv, head_dim, dtype: torch.dtype) -> int:
        return 2 * n_layers * block_size * n_kv * head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions=None) -> None:
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        kc.view(-1, *kc.shape[-2:]).index_copy_(0, slots, k)
        vc.view(-1, *vc.shape[-2:]).index_copy_(0, slots, v)

    def gather(self, layer: int, blocks: torch.Tensor, per_sequence: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # index_select copies whole blocks (~2x faster than advanced indexing here).
        return self.k_cache[layer].index_select(0, blocks), self.v_cache[layer].index_select(0, blocks)


class QuantizedKVStore:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv: int, head_dim: int,
                 fmt: KVCacheFormat, dtype: torch.dtype, device: torch.device, static_scales=None, rope=None):
        check_servable(fmt, head_dim)
        if fmt.static and static_scales is None:
            raise ValueError(f"kv_cache_dtype {fmt.dtype} at {fmt.granularity} needs static scales: calibrate them "
                             f"with lab.quant.kv_calibration.calibrate_kv_absmax, or pass KVScales.unit(...) for "
                             f"vLLM's default scale of 1.0")
        self.fmt, self.dtype, self.block_size, self.rope = fmt, dtype, block_size, rope
        code_shape = (n_layers, num_blocks, block_size, n_kv, _code_width(fmt, head_dim))
        # Bytes in the pool; fp8 codes are viewed as float8 only to compute (index_copy_ wants plain types).
        self.codes = {r: torch.zeros(code_shape, dtype=torch.uint8, device=device) for r in "kv"}
        self.scale, self.zero = {}, {}
        if fmt.static:
            self.static = {r: [static_scales.scale(fmt, i, r).to(device).reshape(1, 1, -1, 1) for i in range(n_layers)]
                           for r in "kv"}
        else:
            meta_shape = (n_layers, num_blocks, block_size, n_kv, 1)
            self.scale = {r: torch.ones(meta_shape, dtype=torch.float16, device=device) for r in "kv"}
            if fmt.asymmetric:
                self.zero = {r: torch.zeros(meta_shape, dtype=torch.float16, device=device) for r in "kv"}

    @staticmethod
    def bytes_per_block(n_layers, block_size, n_kv, head_dim, fmt: KVCacheFormat) -> int:
        check_servable(fmt, head_dim)
        per_token_head = _code_width(fmt, head_dim) + (0 if fmt.static else 2 * (2 if fmt.asymmetric else 1))
        return 2 * n_layers * block_size * n_kv * per_token_head

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for d in (self.codes, self.scale, self.zero) for t in d.values())

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor | None = None) -> None:
        if self.fmt.pre_rope:
            cos, signed_sin = self.rope(positions)
            k = apply_rope(k, cos, -signed_sin)
        for role, x in (("k", k), ("v", v)):
            scale = self.static[role][layer].reshape(-1) if self.fmt.static else None
            q = quantize(x, self.fmt, role, scale)
            codes = q.codes.view(torch.uint8) if self.fmt.is_fp8 else pack_codes(q.codes, self.fmt.bits)
            flat = self.codes[role][layer].view(-1, *self.codes[role].shape[-2:])
            flat.index_copy_(0, slots, codes)
            if not self.fmt.static:
                self.scale[role][layer].view(-1, *q.scale.shape[1:]).index_copy_(0, slots, q.scale.half())
                if self.fmt.asymmetric:
                    self.zero[role][layer].view(-1, *q.zero.shape[1:]).index_copy_(0, slots, q.zero.half())

    def gather(self, layer: int, blocks: torch.Tensor, per_sequence: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`blocks` holds the block tables of one or more sequences, `per_sequence` blocks each (default: one
        sequence); keys stored before RoPE are rotated to their positions in their sequence."""
        out = []
        for role in "kv":
            codes = self.codes[role][layer].index_select(0, blocks)
            codes = codes.view(FP8_TYPES[self.fmt.dtype]) if self.fmt.is_fp8 else unpack_codes(codes, self.fmt.bits)
            if self.fmt.static:
                scale, zero = self.static[role][layer], None
            else:
                scale = self.scale[role][layer].index_select(0, blocks).float()
                zero = self.zero[role][layer].index_select(0, blocks).float() if self.fmt.asymmetric else None
            x = dequantize(QuantizedKV(codes, scale, zero, 0), self.fmt)
            if role == "k" and self.fmt.pre_rope:
                n = x.shape[0] * x.shape[1]
                span = (per_sequence or x.shape[0]) * self.block_size  # slots of one sequence's table
                cos, signed_sin = self.rope(torch.arange(n, device=x.device) % span)
                x = apply_rope(x.reshape(n, *x.shape[2:]), cos, signed_sin).reshape(x.shape)
            out.append(x.to(self.dtype))
        return out[0], out[1]


def check_servable(fmt: KVCacheFormat, head_dim: int) -> None:
    missing = [name for name, on in (("per-channel keys", fmt.granularity == "per-channel"),
                                      (f"a full-precision window (window={fmt.window})", fmt.window > 0)) if on]
    if missing:
        raise ValueError(f"the paged engine does not serve {' or '.join(missing)} yet: they need a full-precision "
                         f"staging area for a block still filling; use per-tensor, per-head or per-token here, and "
                         f"lab.quant.kv_calibration.QuantizedContiguousKVCache for the offline study")
    if not fmt.is_fp8 and head_dim * fmt.bits % 8:
        raise ValueError(f"head_dim {head_dim} cannot be packed at {fmt.bits} bits")


def _code_width(fmt: KVCacheFormat, head_dim: int) -> int:
    return head_dim if fmt.is_fp8 else head_dim * fmt.bits // 8
