"""KV-cache quantization formats: which numbers are stored for each key and value, and how they are read back.

A format is a storage type and a granularity (which elements share one scale):

- dtypes: `fp8_e4m3`, `fp8_e5m2` (torch's float8 types: 3 or 2 mantissa bits; x is divided by its scale, cast,
  and multiplied back), and `int8`, `int4`, `int2` (uniform grids; codes packed along the head dimension);
- granularities, named as in `lab.memory`:
  - `per-tensor`: one static scale per layer for K and one for V (vLLM's FP8 KV cache with `k_scale`/`v_scale`;
    its documentation warns that the default of 1.0 can hurt quality: `static_scales` come from calibration);
  - `per-head`: one static scale per layer and KV head;
  - `per-token`: one dynamic scale per token and KV head, computed when the token is written;
  - `per-channel`: KIVI's layout (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
    Cache", arXiv:2402.02750): keys get one scale per channel over groups of `token_group` consecutive tokens
    (key outliers sit in fixed channels), values one per token;
- `window`: the most recent `window` tokens are read unquantized (KIVI's full-precision residual). The window
  is relative to the query: query i reads keys and values i - window < j <= i exactly, as they are read when
  token i is decoded (`exact_mask`). Per-channel keys are also read exactly while their group of
  `token_group` tokens is still filling (a group's scale needs all its tokens; quantizing it early would
  need the future);
- `pre_rope`: keys are quantized before the rotary embedding and rotated on read (KVQuant, Hooper et al.,
  2024, arXiv:2401.18079: pre-RoPE keys keep their per-channel outlier structure, which rotation smears).

Dynamic scales are rounded up to fp16, the type the paged cache stores them in.

Integer grids: static granularities are symmetric (zero point 2^(b-1), scale absmax / (2^(b-1) - 1)), the
dynamic ones asymmetric (scale (max - min) / (2^b - 1) and an integer zero point, as KIVI), because a
per-token or per-group minimum costs one more stored number and buys a whole level at 2 bits. Values outside
a static scale's range saturate; `QuantizedKV.clipped` counts them, so saturation is reported, never hidden.

This module is the arithmetic on [tokens, heads, head_dim] tensors, shared by the stores of `lab.kv` (which keep
the codes and scales in the engine's paged pool) and the Triton kernels (`lab.kernels.kv_codec`, which compute the
same codes); `lab.memory.kv_bytes_per_token` accounts for them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

# The code grids this arithmetic computes: a torch float8 type, or an integer width. Each name is a kv_cache_dtype
# once `lab.kv.registry.STORES` names its store.
FP8_TYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
INT_BITS = {"int8": 8, "int4": 4, "int2": 2}
KV_CACHE_DTYPES = (*FP8_TYPES, *INT_BITS)
GRANULARITIES = ("per-tensor", "per-head", "per-token", "per-channel")
STATIC = ("per-tensor", "per-head")
# An all-zero group gets this scale, so 0 reads back as 0 and nothing divides by 0; 2^-20 is exact in fp16.
MIN_SCALE = 2.0 ** -20


@dataclass(frozen=True)
class KVCacheFormat:
    dtype: str = "fp8_e4m3"
    granularity: str | None = None  # None: per-tensor for fp8, per-token for integers (lab.memory's default)
    token_group: int = 16  # per-channel keys: consecutive tokens sharing one scale per channel
    window: int = 0  # most recent tokens kept unquantized
    pre_rope: bool = False

    def __post_init__(self):
        if self.dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"KV cache dtype {self.dtype!r} is not one of {KV_CACHE_DTYPES}")
        if self.granularity is None:
            object.__setattr__(self, "granularity", "per-tensor" if self.is_fp8 else "per-token")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity {self.granularity!r} is not one of {GRANULARITIES}")
        for name, lo in (("token_group", 1), ("window", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name}={value!r} must be an int >= {lo}")

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_TYPES

    @property
    def bits(self) -> int:
        return 8 if self.is_fp8 else INT_BITS[self.dtype]

    @property
    def static(self) -> bool:
        return self.granularity in STATIC

    @property
    def asymmetric(self) -> bool:
        return not self.is_fp8 and not self.static

    def granularity_of(self, role: str) -> str:
        """Per-channel applies to keys; values then use per-token scales (KIVI)."""
        if role not in ("k", "v"):
            raise ValueError(f"role must be 'k' or 'v', not {role!r}")
        return "per-token" if (self.granularity == "per-channel" and role == "v") else self.granularity


@dataclass
class QuantizedKV:
    """codes: float8 values, or integer codes as uint8 [T, H, D] (unpacked); scale and zero broadcast against
    them (zero None for fp8 and symmetric grids, where it is implied); clipped: elements saturated, counted on
    the codes' device and read only when asked (reading it at every write would stall a GPU step per layer)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    saturated: torch.Tensor | int

    @property
    def clipped(self) -> int:
        return int(self.saturated)


def fp8_max(dtype: str) -> float:
    return float(torch.finfo(FP8_TYPES[dtype]).max)


def _absmax_over(x: torch.Tensor, granularity: str, token_group: int) -> torch.Tensor:
    """|x| max over the elements sharing a scale, shaped to broadcast against x [T, H, D]."""
    a = x.abs()
    if granularity == "per-tensor":
        return a.amax().reshape(1, 1, 1)
    if granularity == "per-head":
        return a.amax(dim=(0, 2)).reshape(1, -1, 1)
    if granularity == "per-token":
        return a.amax(dim=2, keepdim=True)
    return _per_channel(a, token_group, torch.amax)


def _per_channel(x: torch.Tensor, token_group: int, reduce) -> torch.Tensor:
    """reduce over groups of `token_group` consecutive tokens, expanded back to [T, H, D] (a ragged last
    group is reduced over the tokens it has)."""
    parts = [reduce(blk, dim=0, keepdim=True).expand_as(blk) for blk in x.split(token_group, dim=0)]
    return torch.cat(parts)


def _fp16(scale: torch.Tensor) -> torch.Tensor:
    """Dynamic scales are stored as fp16 beside the codes (2 bytes, as `lab.memory` counts them), so they are
    rounded to fp16 before use: the codes are then exact for the scale that is read back. Rounding up keeps
    the largest |x| inside the grid."""
    s = scale.clamp_min(MIN_SCALE)
    h = s.half().float()
    return torch.where(h < s, torch.nextafter(h.half(), torch.full_like(h, float("inf"), dtype=torch.half)).float(), h)


def static_scale(absmax: torch.Tensor, fmt: KVCacheFormat) -> torch.Tensor:
    """The static scale that maps `absmax` (calibrated) to the top of the format's range."""
    top = fp8_max(fmt.dtype) if fmt.is_fp8 else 2 ** (fmt.bits - 1) - 1
    return (absmax.float() / top).clamp_min(MIN_SCALE)


def quantize(x: torch.Tensor, fmt: KVCacheFormat, role: str, scale: torch.Tensor | None = None) -> QuantizedKV:
    """Quantize keys or values `x` [T, heads, head_dim] (the `window` is the caller's business: this quantizes
    everything it is given). Static granularities need `scale` (per-tensor: [1] or scalar; per-head: [heads]);
    the dynamic ones compute their own and refuse one."""
    if x.dim() != 3:
        raise ValueError(f"expected keys or values as [tokens, heads, head_dim], got shape {tuple(x.shape)}")
    gran = fmt.granularity_of(role)
    x = x.float()
    if fmt.static:
        if scale is None:
            raise ValueError(f"{gran} is a static granularity: pass the calibrated scale (or 1.0, vLLM's default)")
        scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
        expected = 1 if gran == "per-tensor" else x.shape[1]
        if scale.numel() != expected:
            raise ValueError(f"{gran} needs {expected} scale(s), got {scale.numel()}")
        scale = scale.reshape(1, -1, 1)
    elif scale is not None:
        raise ValueError(f"{gran} scales are dynamic (computed per write); a static scale was given")

    if fmt.is_fp8:
        top = fp8_max(fmt.dtype)
        if scale is None:
            scale = _fp16((_absmax_over(x, gran, fmt.token_group) / top))
        y = x / scale
        # A dynamic scale maps the largest |x| to the top by construction (beyond it only by rounding).
        clipped = (y.abs() > top).sum() if fmt.static else 0
        codes = y.clamp(-top, top).to(FP8_TYPES[fmt.dtype])
        return QuantizedKV(codes, scale, None, clipped)

    levels = 2 ** fmt.bits - 1
    if not fmt.asymmetric:
        zero = torch.full_like(scale, 2 ** (fmt.bits - 1))
        q = torch.round(x / scale) + zero
        clipped = ((q < 0) | (q > levels)).sum()
        return QuantizedKV(q.clamp(0, levels).to(torch.uint8), scale, None, clipped)
    if gran == "per-token":
        lo, hi = x.amin(dim=2, keepdim=True), x.amax(dim=2, keepdim=True)
    else:
        lo, hi = _per_channel(x, fmt.token_group, torch.amin), _per_channel(x, fmt.token_group, torch.amax)
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)  # 0 stays exact (padding and masked rows read back as 0)
    scale = _fp16((hi - lo) / levels)
    zero = torch.round(-lo / scale)
    q = torch.round(x / scale) + zero
    return QuantizedKV(q.clamp(0, levels).to(torch.uint8), scale, zero, 0)


def dequantize(qkv: QuantizedKV, fmt: KVCacheFormat) -> torch.Tensor:
    if fmt.is_fp8:
        return qkv.codes.float() * qkv.scale
    zero = qkv.zero if qkv.zero is not None else 2 ** (fmt.bits - 1)
    return (qkv.codes.float() - zero) * qkv.scale


def fake_quantize(x: torch.Tensor, fmt: KVCacheFormat, role: str, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x read back after a round trip through `fmt` (every token; which ones a query reads exactly instead is
    `exact_mask`'s business)."""
    return dequantize(quantize(x, fmt, role, scale), fmt).to(x.dtype)


def staging_length(fmt: KVCacheFormat) -> int:
    """Full-precision tokens a sequence keeps beside its quantized cache: the window, and for per-channel keys
    the up to token_group - 1 tokens of a group still filling."""
    return max(fmt.window, fmt.token_group - 1 if fmt.granularity == "per-channel" else 0)


def exact_mask(fmt: KVCacheFormat, role: str, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
    """True where the query at q_pos reads the key (role "k") or value ("v") at k_pos exactly (q_pos and k_pos
    broadcast: [Q, 1] and [1, K] give [Q, K]); None when `fmt` reads nothing exactly. Exact: k_pos among the
    last `window` positions up to q_pos, or, for per-channel keys, in q_pos's own group (multiples of
    `token_group` from position 0), which is still filling when q_pos is decoded."""
    per_channel_key = role == "k" and fmt.granularity == "per-channel"
    if not fmt.window and not per_channel_key:
        return None
    mask = k_pos > q_pos - fmt.window
    if per_channel_key:
        mask = mask | (k_pos >= q_pos // fmt.token_group * fmt.token_group)
    return mask


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., D] of `bits` < 8 -> uint8 [..., D * bits / 8], lowest bits first."""
    per = 8 // bits
    if bits not in (2, 4, 8) or codes.shape[-1] % per:
        raise ValueError(f"cannot pack {bits}-bit codes along a last dimension of {codes.shape[-1]}")
    if bits == 8:
        return codes
    c = codes.reshape(*codes.shape[:-1], -1, per).to(torch.int32)
    shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=codes.device)
    return (c << shifts).sum(-1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    if bits not in (2, 4, 8):
        raise ValueError(f"cannot unpack {bits}-bit codes")
    if bits == 8:
        return packed
    shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=packed.device)
    c = (packed.to(torch.int32)[..., None] >> shifts) & (2 ** bits - 1)
    return c.reshape(*packed.shape[:-1], -1).to(torch.uint8)


def relative_error(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||x||, the attention-output error measure of the KV study."""
    denom = float(x.float().norm())
    return float((x.float() - y.float()).norm()) / denom if denom else math.nan


# vLLM's spellings of the same formats: its "fp8" is e4m3 (the CUDA default).
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}


def parse_format(name: str) -> tuple[KVCacheFormat, str]:
    """"int4/per-channel", "fp8_e4m3/per-tensor/pre-rope", "int2/per-channel/group32/window128" (or
    "group=32/window=128"; the parameters cell of a notebook cannot hold "=" in strings), "int4/per-token/k-only"
    -> (format, roles) where roles is "kv", "k" or "v". The dtype may be spelled as vLLM spells it ("fp8")."""
    parts = name.split("/") if isinstance(name, str) else []
    if parts:
        parts[0] = KV_CACHE_DTYPE_ALIASES.get(parts[0], parts[0])
    if not parts or parts[0] not in KV_CACHE_DTYPES:
        raise ValueError(f"KV format {name!r} must start with one of {KV_CACHE_DTYPES} "
                         f"(or {tuple(KV_CACHE_DTYPE_ALIASES)}), e.g. 'int4/per-channel'")
    kwargs, roles = {}, "kv"
    for part in parts[1:]:
        if part in GRANULARITIES:
            kwargs["granularity"] = part
        elif part == "pre-rope":
            kwargs["pre_rope"] = True
        elif m := re.fullmatch(r"(window|group)=?(\d+)", part):
            kwargs["window" if m[1] == "window" else "token_group"] = int(m[2])
        elif part in ("k-only", "v-only"):
            roles = part[0]
        else:
            raise ValueError(f"KV format {name!r}: unknown part {part!r}; parts are a granularity {GRANULARITIES}, "
                             f"'pre-rope', 'windowN', 'groupN' (per-channel key groups; 'window=N' too), 'k-only' or 'v-only'")
    return KVCacheFormat(parts[0], **kwargs), roles


def parse_kv_cache_dtype(spec: str | KVCacheFormat | None) -> KVCacheFormat | None:
    """The one reading of a `kv_cache_dtype` (the engine, `lab serve`, `lab eval`, the studies): None or "auto" ->
    None (the model's own dtype), a `KVCacheFormat` as it is, a string as `parse_format` reads it. Caches that
    quantize keys or values alone exist only in the contiguous study cache, so "k-only"/"v-only" are refused."""
    if spec is None or spec == "auto" or isinstance(spec, KVCacheFormat):
        return spec if isinstance(spec, KVCacheFormat) else None
    if not isinstance(spec, str):
        raise ValueError(f"kv_cache_dtype {spec!r} is neither a string nor a KVCacheFormat")
    try:
        fmt, roles = parse_format(spec)
    except ValueError as e:
        raise ValueError(f"kv_cache_dtype {spec!r}: {e}") from None
    if roles != "kv":
        raise ValueError(f"kv_cache_dtype {spec!r}: a paged cache quantizes keys and values together; "
                         f"'k-only'/'v-only' are for the perplexity suite of lab eval")
    return fmt
