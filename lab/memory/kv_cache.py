"""KV-cache bytes per token, by dtype and quantization granularity.

2 x layers x kv_heads x head_dim x bytes for MHA/GQA, and one latent of kv_lora_rank + qk_rope_head_dim per
layer for MLA (DeepSeek-V2 paper, section 2.1: no factor 2), plus the scales each quantization granularity
stores, capped by sliding windows.
"""

from __future__ import annotations

import math

from .shape import ModelShape

KV_DTYPE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "int2": 2}
KV_GRANULARITIES = ("per-tensor", "per-token", "per-head", "per-channel", "per-group")
_TORCH_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def dtype_name(torch_dtype) -> str:
    """This module's name for a torch floating dtype (torch.float32 -> "fp32"), to account for a live model."""
    name = str(torch_dtype).removeprefix("torch.")
    if name not in _TORCH_DTYPE_NAMES:
        raise ValueError(f"no memory account for dtype {torch_dtype}; known: {', '.join(_TORCH_DTYPE_NAMES)}")
    return _TORCH_DTYPE_NAMES[name]


def default_kv_granularity(dtype: str) -> str:
    """fp8 KV with one static scale per tensor (vLLM's k_scale/v_scale); integers with per-token scales."""
    return "per-token" if dtype.startswith("int") else "per-tensor"


def kv_elements_per_token_per_layer(s: ModelShape) -> int:
    """Stored numbers per token per layer: K and V of every KV head, or MLA's one compressed latent."""
    if s.is_mla:
        return s.kv_lora_rank + s.qk_rope_head_dim
    return 2 * s.num_kv_heads * s.head_dim


def kv_bytes_per_token(s: ModelShape, dtype: str = "bf16", granularity: str = "per-tensor", group_size: int = 128,
                       token_group: int = 128, scale_bytes: int = 2, asymmetric: bool = False,
                       seq_len: int | None = None) -> float:
    """KV bytes one token adds, averaged over layers (sliding-window layers stop growing at the window).

    Scale overhead (fp16 scales, doubled with zero points when asymmetric):
    per-tensor and per-head static scales are constants (no per-token bytes); per-token stores one
    scale per token per KV head for K and V; per-group one per `group_size` channels of each head;
    per-channel (KIVI-style keys) one per channel per `token_group` tokens for K, with V per-token.
    """
    if dtype not in KV_DTYPE_BITS:
        raise ValueError(f"unknown KV dtype {dtype!r}; known: {', '.join(KV_DTYPE_BITS)}")
    if granularity not in KV_GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; known: {', '.join(KV_GRANULARITIES)}")
    elems = kv_elements_per_token_per_layer(s)
    per_layer = elems * KV_DTYPE_BITS[dtype] / 8
    if KV_DTYPE_BITS[dtype] < 16:
        meta = scale_bytes * (2 if asymmetric else 1)
        heads = 1 if s.is_mla else s.num_kv_heads
        width = elems // (1 if s.is_mla else 2 * s.num_kv_heads)  # channels of one head's K (or the latent)
        kv_tensors = 1 if s.is_mla else 2
        if granularity == "per-token":
            per_layer += kv_tensors * heads * meta
        elif granularity == "per-group":
            per_layer += kv_tensors * heads * math.ceil(width / group_size) * meta
        elif granularity == "per-channel":
            per_layer += heads * width * meta / token_group + (heads * meta if not s.is_mla else 0)
    return per_layer * effective_layers(s, seq_len)


def effective_layers(s: ModelShape, seq_len: int | None) -> float:
    """Layers' worth of KV a token adds: windowed layers keep only the last `sliding_window` tokens. That is what
    a cache holds when it frees each windowed layer's old tokens on their own; a paged cache with one pool for all
    layers frees only when every layer is windowed (`paging.blocks_held` counts that, in whole blocks)."""
    if seq_len is None or not s.sliding_window or seq_len <= s.sliding_window:
        return s.num_layers
    kept = s.sliding_window / seq_len
    return (s.num_layers - s.sliding_window_layers) + s.sliding_window_layers * kept


def kv_cache_bytes(s: ModelShape, seq_len: int, concurrency: int = 1, **kw) -> float:
    return kv_bytes_per_token(s, seq_len=seq_len, **kw) * seq_len * concurrency
