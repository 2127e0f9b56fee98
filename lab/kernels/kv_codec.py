"""The paged KV cache as the kernels see it: where a token's bytes are, and how they become numbers and back.

One layer's pool holds, for K and for V, `num_blocks` blocks of `block_size` slots of `n_kv` heads: either the
model's dtype ([num_blocks, block_size, n_kv, head_dim]) or the codes of a `lab.kv.format.KVCacheFormat` as the
stores of `lab.kv` lay them out (`kernel_view`): uint8 [num_blocks, block_size, n_kv, head_dim * bits / 8], integer
codes packed lowest bits first along the head dimension, fp8 as its raw byte. Scales are

- per-token (dynamic): fp16 [num_blocks, block_size, n_kv, 1], and an fp16 zero point beside it for integer
  grids (asymmetric, KIVI's choice): x = (code - zero) * scale, x = fp8(code) * scale;
- per-tensor / per-head (static, calibrated): fp32 [n_kv] (a per-tensor scale repeated), integer grids
  symmetric about 2^(bits-1).

Per-channel keys and full-precision windows need exact copies outside the pool (the torch backend's staging
lanes); the kernels do not read those formats (`check_supported`).

The `@triton.jit` helpers below are inlined into the attention and write kernels: `load_tile` dequantizes a
[tokens, head_dim] tile on read, `quantize_tile` computes a tile's codes and scales exactly as
`lab.kv.format.quantize` does (round half to even, scales rounded up to fp16), so kernel and reference agree
code for code. fp8 is encoded and decoded with integer arithmetic on its fields rather than casts: the
interpreter's fp32 -> fp8 cast does not round to nearest (an e4m3 code off by a binade was seen), and Ampere
(sm_80) has no e4m3 type at all (`lab.kernels.aot` compiles for it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lab.kv.format import FP8_TYPES, MIN_SCALE, KVCacheFormat, QuantizedKV, dequantize, fp8_max, unpack_codes

PLAIN, INT, FP8_E4M3, FP8_E5M2 = 0, 1, 2, 3
_KIND = {"fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}
# fp32 + 1.5 * 2^23 - 1.5 * 2^23 rounds |x| < 2^22 to the nearest integer, ties to even (as torch.round);
# the interpreter has no libdevice.rint.
_ROUND_MAGIC = tl.constexpr(12582912.0)
_MIN_SCALE = tl.constexpr(MIN_SCALE)


@dataclass(frozen=True)
class PagedKVCache:
    """One layer's K and V pools and how to read them (see the module docstring for the layouts)."""

    k: torch.Tensor
    v: torch.Tensor
    head_dim: int
    fmt: KVCacheFormat | None = None  # None: the model's dtype
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    k_zero: torch.Tensor | None = None
    v_zero: torch.Tensor | None = None

    def __post_init__(self):
        if self.fmt is not None:
            check_supported(self.fmt)

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    @property
    def n_kv(self) -> int:
        return self.k.shape[2]

    @property
    def flags(self) -> dict:
        return kernel_flags(self.fmt, self.k.element_size())

    def scale_strides(self) -> tuple[int, int]:
        """(slot, head) strides of a per-token scale; static scales are indexed by head alone."""
        return (self.n_kv, 1) if self.fmt is not None and not self.fmt.static else (0, 1)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's K and V take in the pool, scales included (what a read of the cache moves)."""
        per = 2 * self.n_kv * self.k.shape[3] * self.k.element_size()
        if self.fmt is not None and not self.fmt.static:
            per += 2 * self.n_kv * 2 * (2 if self.fmt.asymmetric else 1)
        return per

    @staticmethod
    def allocate(num_blocks: int, block_size: int, n_kv: int, head_dim: int, fmt: KVCacheFormat | None = None,
                 dtype: torch.dtype = torch.float32, device="cpu", static_scale: float = 1.0) -> "PagedKVCache":
        """An empty cache (tests and benchmarks; the engine wraps its own store's tensors)."""
        if fmt is None:
            data = [torch.zeros(num_blocks, block_size, n_kv, head_dim, dtype=dtype, device=device) for _ in "kv"]
            return PagedKVCache(*data, head_dim)
        check_supported(fmt)
        width = head_dim if fmt.is_fp8 else head_dim * fmt.bits // 8
        if width * 8 != head_dim * fmt.bits:
            raise ValueError(f"head_dim {head_dim} cannot be packed at {fmt.bits} bits")
        codes = [torch.zeros(num_blocks, block_size, n_kv, width, dtype=torch.uint8, device=device) for _ in "kv"]
        if fmt.static:
            scales = [torch.full((n_kv,), static_scale, dtype=torch.float32, device=device) for _ in "kv"]
            return PagedKVCache(*codes, head_dim, fmt, *scales)
        meta = (num_blocks, block_size, n_kv, 1)
        scales = [torch.ones(meta, dtype=torch.float16, device=device) for _ in "kv"]
        zeros = [torch.zeros(meta, dtype=torch.float16, device=device) for _ in "kv"] if fmt.asymmetric else [None] * 2
        return PagedKVCache(*codes, head_dim, fmt, *scales, *zeros)

    def read(self, role: str, slots: torch.Tensor) -> torch.Tensor:
        """PyTorch reference read: [len(slots), n_kv, head_dim] float32 values of `role` at flat `slots`."""
        data = getattr(self, role).view(-1, *self.k.shape[2:]).index_select(0, slots)
        if self.fmt is None:
            return data.float()
        codes = data.view(FP8_TYPES[self.fmt.dtype]) if self.fmt.is_fp8 else unpack_codes(data, self.fmt.bits)
        scale, zero = getattr(self, f"{role}_scale"), getattr(self, f"{role}_zero")
        if self.fmt.static:
            scale = scale.reshape(1, -1, 1)
        else:
            scale = scale.view(-1, self.n_kv, 1).index_select(0, slots).float()
            zero = None if zero is None else zero.view(-1, self.n_kv, 1).index_select(0, slots).float()
        return dequantize(QuantizedKV(codes, scale, zero, 0), self.fmt)


def kernel_flags(fmt: KVCacheFormat | None, element_size: int = 2) -> dict:
    """The constexpr arguments that pick a kernel's read/write path for a format (None: the model's dtype, of
    `element_size` bytes)."""
    if fmt is None:
        return dict(KIND=PLAIN, BITS=8 * element_size, PER_TOKEN=False, ASYM=False)
    return dict(KIND=_KIND.get(fmt.dtype, INT), BITS=fmt.bits, PER_TOKEN=not fmt.static, ASYM=fmt.asymmetric)


def check_supported(fmt: KVCacheFormat) -> None:
    """The kernels read formats whose every token is in the pool with its own or a static scale."""
    if fmt.granularity == "per-channel" or fmt.window or fmt.pre_rope:
        raise ValueError(f"the Triton kernels read per-token, per-head and per-tensor KV formats; {fmt} needs "
                         f"exact copies or a rotation outside the pool: use attention_backend='torch'")


def fp8_limits(fmt: KVCacheFormat | None) -> dict:
    """constexpr arguments of fp8 encoding: exponent and mantissa bits, the largest finite value."""
    if fmt is None or not fmt.is_fp8:
        return dict(EXP_BITS=0, MAN_BITS=0, FP8_MAX=0.0)
    exp_bits = 4 if fmt.dtype == "fp8_e4m3" else 5
    return dict(EXP_BITS=exp_bits, MAN_BITS=7 - exp_bits, FP8_MAX=fp8_max(fmt.dtype))


@triton.jit
def load_tile(ptr, scale_ptr, zero_ptr, slots, head, offs_d, mask, stride_slot, stride_head,
              scale_stride_slot, scale_stride_head,
              KIND: tl.constexpr, BITS: tl.constexpr, PER_TOKEN: tl.constexpr, ASYM: tl.constexpr):
    """K or V of `head` at flat `slots` [N] as float32 [N, D] (masked entries read 0)."""
    row = ptr + slots[:, None] * stride_slot + head * stride_head
    if KIND == 0:
        x = tl.load(row + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        PER: tl.constexpr = 8 // BITS
        byte = tl.load(row + (offs_d // PER)[None, :], mask=mask, other=0)
        if PER_TOKEN:
            meta = slots * scale_stride_slot + head * scale_stride_head
            token_mask = tl.max(mask.to(tl.int32), axis=1) > 0
            scale = tl.load(scale_ptr + meta, mask=token_mask, other=0.0).to(tl.float32)[:, None]
        else:
            scale = tl.load(scale_ptr + head)
        if KIND == 1:
            code = ((byte.to(tl.int32) >> ((offs_d % PER) * BITS)[None, :]) & ((1 << BITS) - 1)).to(tl.float32)
            if ASYM:
                zero = tl.load(zero_ptr + meta, mask=token_mask, other=0.0).to(tl.float32)[:, None]
            else:
                zero = 2.0 ** (BITS - 1)
            x = (code - zero) * scale
        else:
            EXP_BITS: tl.constexpr = 4 if KIND == 2 else 5
            x = _fp8_value(byte.to(tl.int32), EXP_BITS, 7 - EXP_BITS) * scale
    return x


@triton.jit
def _div(x, y):
    """x / y rounded to nearest as torch divides (a GPU's default fp32 division may be approximate)."""
    return tl.math.div_rn(x, y + tl.zeros_like(x))


@triton.jit
def _round(x):
    return (x + _ROUND_MAGIC) - _ROUND_MAGIC


@triton.jit
def _exponent(x):
    """floor(log2(x)) of positive normal fp32 x, read off its bits (-127 for 0)."""
    return ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _pow2(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp16_up(s):
    """s >= MIN_SCALE rounded up to an fp16 value (lab.kv.format._fp16): the scale read back is the one used."""
    h = s.to(tl.float16)
    up = (h.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
    return tl.where(h.to(tl.float32) < s, up, h).to(tl.float32)


@triton.jit
def _fp8_value(code, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """The float32 value of fp8 bytes (finite codes), assembled from the fields: Ampere has no e4m3 type."""
    BIAS: tl.constexpr = (1 << (EXP_BITS - 1)) - 1
    SUBNORMAL_STEP: tl.constexpr = 2.0 ** (1 - BIAS - MAN_BITS)
    field = (code >> MAN_BITS) & ((1 << EXP_BITS) - 1)
    man = code & ((1 << MAN_BITS) - 1)
    normal = (((field - BIAS + 127) << 23) | (man << (23 - MAN_BITS))).to(tl.float32, bitcast=True)
    value = tl.where(field == 0, man.to(tl.float32) * SUBNORMAL_STEP, normal)
    return tl.where((code & 0x80) != 0, -value, value)


@triton.jit
def _fp8_code(y, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """The fp8 byte nearest to y (|y| <= the format's max; ties to even), computed on the value: round |y| to
    the spacing of its binade (of the subnormals below the smallest normal), then assemble the fields."""
    BIAS: tl.constexpr = (1 << (EXP_BITS - 1)) - 1
    SUBNORMAL_STEP: tl.constexpr = 2.0 ** (1 - BIAS - MAN_BITS)
    a = tl.abs(y)
    e = tl.maximum(_exponent(a), 1 - BIAS)
    quantum = _pow2(e - MAN_BITS)
    r = _round(a / quantum) * quantum  # may carry into the next binade: re-read its exponent
    er = _exponent(r)
    normal = er >= 1 - BIAS
    man = tl.where(normal, (r / _pow2(tl.maximum(er, 1 - BIAS)) - 1.0) * (1 << MAN_BITS), r / SUBNORMAL_STEP)
    field = tl.where(normal, (er + BIAS) << MAN_BITS, 0) | man.to(tl.int32)
    sign = (y.to(tl.int32, bitcast=True) >> 31) & 1
    return field | (sign << 7)


@triton.jit
def quantize_tile(x, static_scale, mask, KIND: tl.constexpr, BITS: tl.constexpr, PER_TOKEN: tl.constexpr,
                  ASYM: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, FP8_MAX: tl.constexpr):
    """Codes (int32, one per element), scale and zero [N, 1] of a float32 tile [N, D] (masked entries 0) as
    `lab.kv.format.quantize` computes them; per-tensor/per-head use `static_scale` and a symmetric grid."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    if KIND == 1:
        if PER_TOKEN:
            # Asymmetric: [min, max] widened to include 0 (padding and masked rows read back as 0).
            lo = tl.minimum(tl.min(tl.where(mask, x, 0.0), axis=1), 0.0)[:, None]
            hi = tl.maximum(tl.max(tl.where(mask, x, 0.0), axis=1), 0.0)[:, None]
            scale = _fp16_up(tl.maximum(_div(hi - lo, LEVELS), _MIN_SCALE))
            zero = _round(_div(-lo, scale))
        else:
            scale = static_scale + tl.zeros([x.shape[0], 1], tl.float32)
            zero = 2.0 ** (BITS - 1) + tl.zeros([x.shape[0], 1], tl.float32)
        code = tl.minimum(tl.maximum(_round(_div(x, scale)) + zero, 0.0), LEVELS).to(tl.int32)
    else:
        if PER_TOKEN:
            absmax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)[:, None]
            scale = _fp16_up(tl.maximum(_div(absmax, FP8_MAX), _MIN_SCALE))
        else:
            scale = static_scale + tl.zeros([x.shape[0], 1], tl.float32)
        code = _fp8_code(tl.minimum(tl.maximum(_div(x, scale), -FP8_MAX), FP8_MAX), EXP_BITS, MAN_BITS)
        zero = tl.zeros([x.shape[0], 1], tl.float32)
    return code, scale, zero

