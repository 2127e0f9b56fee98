"""Capacity by vLLM's rule: KV blocks = (memory x utilization - weights - activation peak - overhead) / block
bytes, and the concurrency they hold; `memory_for_concurrency` is the inverse.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kv_cache import kv_bytes_per_token
from .shape import ModelShape
from .weights import weight_bytes


def activation_peak_bytes(s: ModelShape, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int = 2) -> float:
    """A profile-free estimate of the forward's peak: the widest intermediates of one layer for the
    step's tokens (q/k/v, gate/up) plus float32 logits for the sampled rows. vLLM measures this
    by a profiling run instead; pass a measured number to `capacity` when you have one."""
    width = max(s.intermediate_size, s.moe_intermediate_size) * 2 + (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    return max_num_batched_tokens * (width + 2 * s.hidden_size) * dtype_bytes + max_num_seqs * s.vocab_size * 4


@dataclass
class Capacity:
    memory_bytes: float
    utilization: float
    weight_bytes: float
    activation_bytes: float
    overhead_bytes: float
    kv_block_bytes: float
    free_bytes: float  # left for the KV cache; negative when weights and activations alone do not fit
    num_blocks: int
    max_model_len: int
    block_size: int
    max_concurrency: float  # sequences of max_model_len the blocks hold
    operating_concurrency: int  # 80% of it, the margin both articles recommend

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def capacity(s: ModelShape, memory_bytes: float, weights: str = "bf16", kv_dtype: str = "bf16",
             max_model_len: int = 8192, block_size: int = 16, utilization: float = 0.9,
             activation_bytes: float | None = None, overhead_bytes: float = 0.0, max_num_batched_tokens: int = 8192,
             max_num_seqs: int = 256, margin: float = 0.8, **kv_kw) -> Capacity:
    """KV blocks and concurrency by vLLM's rule (blocks = free memory / block bytes)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization {utilization} must be in (0, 1]")
    w = weight_bytes(s, weights)["total"]
    act = activation_peak_bytes(s, max_num_batched_tokens, max_num_seqs) if activation_bytes is None else activation_bytes
    block = kv_bytes_per_token(s, kv_dtype, **kv_kw) * block_size
    free = memory_bytes * utilization - w - act - overhead_bytes
    blocks = max(0, int(free // block))
    per_seq = -(-max_model_len // block_size)
    conc = blocks / per_seq
    return Capacity(memory_bytes, utilization, w, act, overhead_bytes, block, free, blocks, max_model_len,
                    block_size, conc, int(conc * margin))


def memory_for_concurrency(s: ModelShape, concurrency: int, weights: str = "bf16", kv_dtype: str = "bf16",
                           max_model_len: int = 8192, block_size: int = 16, utilization: float = 0.9,
                           activation_bytes: float | None = None, overhead_bytes: float = 0.0,
                           max_num_batched_tokens: int = 8192, **kv_kw) -> float:
    """The inverse: device memory needed so `concurrency` sequences of max_model_len fit."""
    w = weight_bytes(s, weights)["total"]
    act = (activation_peak_bytes(s, max_num_batched_tokens, concurrency) if activation_bytes is None
           else activation_bytes)
    block = kv_bytes_per_token(s, kv_dtype, **kv_kw) * block_size
    return (w + act + overhead_bytes + concurrency * -(-max_model_len // block_size) * block) / utilization
