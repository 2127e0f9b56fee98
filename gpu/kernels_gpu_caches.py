"""Paged KV pools filled with random K/V (through the engine's own quantizing write), and block tables that
scatter a sequence over the pool as an engine's free list does after some churn; the correctness records.

`lab.kernels` imports triton, so it is imported inside the functions: the dry run sets TRITON_INTERPRET
before triton's first import, which reads it once.
"""

from __future__ import annotations

import torch

from kernels_gpu_sweep import DecodeCase, Heads
from kernels_gpu_timing import Bench
from lab.kv.format import KVCacheFormat


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_format(name: str) -> KVCacheFormat | None:
    return None if name == "plain" else KVCacheFormat(name)


def filled_cache(bench: Bench, heads: Heads, fmt: str, num_tokens: int):
    """A pool of at least `num_tokens` slots holding random K/V, written by `reshape_and_cache` (for quantized
    formats that is the engine's own quantizing write) in chunks that bound the temporaries."""
    from lab.kernels import PagedKVCache, reshape_and_cache

    bs = bench.sweep.block_size
    num_blocks = cdiv(num_tokens, bs)
    cache = PagedKVCache.allocate(num_blocks, bs, heads.n_kv, heads.head_dim, fmt=kv_format(fmt),
                                  dtype=bench.dtype, device=bench.device)
    chunk = 65536
    for start in range(0, num_blocks * bs, chunk):
        n = min(chunk, num_blocks * bs - start)
        k, v = (torch.randn(n, heads.n_kv, heads.head_dim, dtype=bench.dtype, device=bench.device) for _ in "kv")
        reshape_and_cache(k, v, cache, torch.arange(start, start + n, device=bench.device))
    return cache


def random_tables(lengths: list[int], cache, device: torch.device) -> torch.Tensor:
    """Block tables [B, max blocks] int32 of distinct pool blocks in random order, as an engine's free list
    hands them out after some churn; entries past a sequence's last block are 0 and never read."""
    need = [cdiv(n, cache.block_size) for n in lengths]
    ids = torch.randperm(cache.k.shape[0], device=device)[:sum(need)].to(torch.int32)
    tables = torch.zeros(len(lengths), max(need), dtype=torch.int32, device=device)
    for b, row in enumerate(torch.split(ids, need)):
        tables[b, :len(row)] = row
    return tables


def cache_bytes(bench: Bench, case: DecodeCase) -> int:
    """Pool bytes a decode case needs: whole blocks of K and V (with their scales) for every sequence."""
    from lab.kernels import PagedKVCache

    one = PagedKVCache.allocate(1, 1, case.heads.n_kv, case.heads.head_dim, fmt=kv_format(case.kv_format),
                                dtype=bench.dtype, device="cpu")
    bs = bench.sweep.block_size
    return case.batch * cdiv(case.context, bs) * bs * one.bytes_per_token


def int32_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def check_record(kernel: str, heads: Heads, fmt: str, shape: dict, out: torch.Tensor, ref: torch.Tensor,
                 ulps: float) -> dict:
    """`out` against its float32 reference `ref`: within `ulps` units in the last place of out's dtype at
    max(1, max |ref|). A NaN error fails the check (and is written as null, `lab.workflow.run.json_safe`)."""
    error = float((out.float() - ref.float()).abs().max())
    scale = max(1.0, float(ref.abs().max()))
    tolerance = ulps * torch.finfo(out.dtype).eps * scale
    return {"kernel": kernel, "heads": heads.name, "kv_format": fmt, "shape": shape, "max_abs_error": error,
            "tolerance": tolerance, "tolerance_ulps": ulps, "reference_absmax": scale,
            "ok": bool(error <= tolerance)}
