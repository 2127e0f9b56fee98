"""The engine's KV pool: how many blocks it gets, and the store (`lab.kv`) built for the engine's sequences.

Every format's store, its bytes and its capabilities are `lab.kv`'s (`lab.kv.registry.STORES`); what is the
engine's is the policy: `default_num_blocks` sizes the pool from free memory (a share of it, less the staging
area of a store that keeps exact copies), and `build_kv_store` tells a staging store which sequences still run
(`Status.RUNNING`), so it can reuse the lanes of finished and preempted ones.
"""

from __future__ import annotations

import os

import torch

from lab.kv import KVCacheFormat, build_store
from lab.kv import bytes_per_block as kv_cache_bytes_per_block
from lab.kv import staging_bytes as kv_staging_bytes

from .request import Sequence, Status

# Share of the free memory the KV pool may take when the engine is not given a number of blocks.
KV_CACHE_MEMORY_FRACTION = 0.4


def is_running(seq: Sequence) -> bool:
    return seq.status is Status.RUNNING


def build_kv_store(model, num_blocks: int, block_size: int, kv_format: KVCacheFormat | None = None,
                   kv_scales=None, max_num_seqs: int = 1):
    """The pool for `model`: plain in its dtype, or the store of `kv_format` (with `max_num_seqs` staging lanes
    if it stages)."""
    return build_store(model, num_blocks, block_size, kv_format, kv_scales, max_num_seqs, is_running)


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
