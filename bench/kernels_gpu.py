"""GPU benchmark of the lab's Triton attention kernels against what the same GPU measurably does.

Decode attention reads each context token's K and V once and does G FLOPs per byte of a bf16 cache (each of
the G query heads sharing a KV head does one multiply-add per element), far below any GPU's ridge point, so its
ceiling is memory bandwidth: the figure of merit is bytes moved per second (`decode_traffic`) as a fraction of
bandwidth. Flash-Decoding (Dao, Haziza, Massa and Sizov, 2023, "Flash-Decoding for long-context inference")
splits the context across programs precisely so that one sequence can keep the whole memory system busy, and
FlashInfer (Ye et al., 2025, arXiv:2501.01005) reports its decode kernels by the bandwidth they achieve. The
peer here is not the datasheet's number, which real access patterns fall short of, but a large `copy_` timed
in the same run (bytes read + bytes written, as STREAM counts them): the target is >= 85% of it from 16K
tokens of context up, where the context's bytes dwarf the fixed costs of a call.

Prefill attention is compute-bound (a query tile is reused against every key tile), so its figure of merit is
FLOP/s (`prefill_flops`), set against the bf16 matmul rate measured in the same run (the tensor cores'
practical ceiling) and against `torch.nn.functional.scaled_dot_product_attention` (PyTorch's fused
FlashAttention/cuDNN kernels) on the same q, k and v in the contiguous [batch, heads, tokens, head_dim] layout
those kernels want. The target is >= 70% of SDPA's rate.

Every kernel is first checked against its PyTorch reference on a small shape (a fast wrong kernel is
worthless); the errors are in the JSON. Times are medians over repetitions, each after a write of a buffer
larger than L2 so that no run reads K/V left in cache by the previous one (a model's other layers would have
evicted it). They are times of the public calls with validate=False, as the engine calls them: the checks that
read lengths and block ids back from the device (a host sync each) run in the correctness checks, not in the
timed calls. Each API's floor, its time on one block of tokens, is measured too, so that short points can be
read against it.

    python bench/kernels_gpu.py               # one GPU, a few minutes: results/kernels_gpu/kernels_gpu.{json,png}
    python bench/kernels_gpu.py --dry-run     # the same code path on tiny shapes in Triton's CPU interpreter

The dry run's numbers are interpreter timings, not GPU figures: it checks that the script, the kernels'
correctness checks, the JSON and the plot work where no GPU is available.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from lab.provenance import cpu_model, provenance
from lab.quant.kv import KVCacheFormat

# Modules that import triton (lab.kernels, torch.nn.attention.bias) are imported inside the functions that use
# them: the dry run must set TRITON_INTERPRET before triton's first import, which reads it once.

ROOT = Path(__file__).resolve().parents[1]
DECODE_TARGET = 0.85  # of measured copy bandwidth (the target)
PREFILL_TARGET = 0.70  # of SDPA's FLOP/s (the target)
GiB = 1024**3


@dataclass(frozen=True)
class Heads:
    name: str
    n_heads: int
    n_kv: int
    head_dim: int


@dataclass(frozen=True)
class DecodeCase:
    heads: Heads
    kv_format: str  # "plain" (the sweep's dtype) or a lab.quant.kv.KVCacheFormat dtype
    batch: int
    context: int


@dataclass(frozen=True)
class Sweep:
    """Everything one run measures; `GPU_SWEEP` and `DRY_RUN_SWEEP` below are the two used."""

    device: str
    dtype: str
    heads: Heads  # the head configuration of the decode grid and of prefill
    block_size: int
    block_n: int  # key tile of both kernels (their default); decode's split count depends on it
    decode_num_splits: int | None  # None: the wrapper's default, what the engine gets
    decode_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_extras: tuple[DecodeCase, ...]  # other head configurations and quantized caches, a few points
    prefill_lengths: tuple[int, ...]  # fresh prefills: query_len = context_len
    prefill_chunks: tuple[tuple[int, int], ...]  # (query_len, context_len): a chunk over a cached prefix
    decode_check_contexts: tuple[int, ...]  # one batch of these lengths checked against the reference
    prefill_check: tuple[tuple[int, int], ...]  # (query_len, context_len) per sequence of the prefill check
    tolerance: float  # max abs error of a kernel against its float32 reference
    copy_bytes: int
    matmul_n: int
    cache_cap_bytes: int  # decode points whose K/V would exceed this are skipped (and listed)
    flush_bytes: int
    warmup: int
    repeats: int
    target_min_context: int  # the decode target applies from this context up


LLAMA_3_8B = Heads("llama-3-8b", 32, 8, 128)
SMOLLM2_135M = Heads("smollm2-135m", 9, 3, 64)

GPU_SWEEP = Sweep(
    device="cuda", dtype="bfloat16", heads=LLAMA_3_8B, block_size=16, block_n=32, decode_num_splits=None,
    decode_contexts=tuple(1024 * 2**i for i in range(7)), decode_batches=(1, 4, 16, 64),
    decode_extras=tuple(DecodeCase(h, f, b, c) for h, f in ((SMOLLM2_135M, "plain"), (LLAMA_3_8B, "fp8_e4m3"),
                                                             (LLAMA_3_8B, "int8"))
                        for b, c in ((16, 16384), (64, 65536))),
    prefill_lengths=(1024, 2048, 4096, 8192, 16384), prefill_chunks=((2048, 10240), (512, 16896)),
    # Uneven lengths, one not a multiple of the block size: masks and several splits are exercised.
    decode_check_contexts=(4099, 1000, 37), prefill_check=((300, 300), (100, 400)),
    tolerance=2e-2,  # bf16 outputs and probabilities: a few units in bf16's last place of |o| <= ~3
    copy_bytes=GiB, matmul_n=8192, cache_cap_bytes=40 * GiB, flush_bytes=256 * 1024**2,
    warmup=3, repeats=25, target_min_context=16384,
)

DRY_RUN_SWEEP = Sweep(
    device="cpu", dtype="float32", heads=Heads("tiny", 4, 2, 16), block_size=16, block_n=32,
    decode_num_splits=2,  # the interpreter's default is 1 split: 2 runs the split-KV merge the GPU uses
    # 4096 exceeds the tiny cache cap below, so the skip path runs too.
    decode_contexts=(16, 48, 4096), decode_batches=(1, 2),
    decode_extras=(DecodeCase(Heads("tiny-gqa3", 9, 3, 16), "plain", 2, 48),
                   DecodeCase(Heads("tiny", 4, 2, 16), "fp8_e4m3", 2, 48),
                   DecodeCase(Heads("tiny", 4, 2, 16), "int8", 2, 48)),
    prefill_lengths=(16, 32), prefill_chunks=((16, 48),),
    decode_check_contexts=(48, 37, 5), prefill_check=((32, 32), (16, 48)),
    tolerance=1e-4, copy_bytes=16 * 1024**2, matmul_n=256, cache_cap_bytes=64 * 1024, flush_bytes=1024**2,
    warmup=1, repeats=3, target_min_context=48,
)


@dataclass
class Bench:
    """A run's sweep and what its timings need on the device."""

    sweep: Sweep
    device: torch.device
    dtype: torch.dtype
    flush: torch.Tensor

    @staticmethod
    def create(sweep: Sweep) -> "Bench":
        device = torch.device(sweep.device)
        return Bench(sweep, device, getattr(torch, sweep.dtype),
                     torch.empty(sweep.flush_bytes, dtype=torch.uint8, device=device))

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def timings_ms(bench: Bench, fn: Callable[[], object]) -> list[float]:
    """Milliseconds of each of `repeats` calls after `warmup` untimed ones (compilation, allocator). On CUDA,
    events around each call time it on the GPU's clock: its kernels, and the idle gaps its host-side work
    (Python, launches, allocations) leaves between them. The flush before each call
    keeps one repetition's data out of the next one's L2."""
    for _ in range(bench.sweep.warmup):
        fn()
    if bench.cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(bench.sweep.repeats)]
        for start, end in events:
            bench.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(bench.sweep.repeats):
        bench.flush.zero_()
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return times


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _g(x: float) -> str:
    """Four significant digits: the GPU's GB/s and TFLOP/s and the dry run's tiny rates alike."""
    return f"{x:.4g}"


# --- the peers: what the device does on a plain copy and a large matmul ----------------------------------------

def measure_copy(bench: Bench) -> dict:
    """Best copy bandwidth of a buffer far larger than L2 (the best: slower runs are interference, not the
    memory system's limit)."""
    src = torch.randn(bench.sweep.copy_bytes // 4, device=bench.device)
    dst = torch.empty_like(src)
    best = min(timings_ms(bench, lambda: dst.copy_(src)))
    moved = 2 * src.numel() * src.element_size()  # read + written
    return {"buffer_bytes": src.numel() * src.element_size(), "bytes_moved": moved, "best_ms": best,
            "bytes_per_s": moved / (best / 1e3)}


def measure_matmul(bench: Bench) -> dict:
    n = bench.sweep.matmul_n
    a, b = (torch.randn(n, n, dtype=bench.dtype, device=bench.device) for _ in "ab")
    c = torch.empty_like(a)
    best = min(timings_ms(bench, lambda: torch.mm(a, b, out=c)))
    return {"n": n, "dtype": bench.sweep.dtype, "flops": 2 * n**3, "best_ms": best,
            "flops_per_s": 2 * n**3 / (best / 1e3)}


# --- caches and block tables --------------------------------------------------------------------------------

def kv_format(name: str) -> KVCacheFormat | None:
    return None if name == "plain" else KVCacheFormat(name)


def filled_cache(bench: Bench, heads: Heads, fmt: str, num_tokens: int):
    """A pool of at least `num_tokens` slots holding random K/V, written by `reshape_and_cache` (for quantized
    formats that is the engine's own quantizing write) in chunks that bound the temporaries."""
    from lab.kernels import PagedKVCache, reshape_and_cache

    bs = bench.sweep.block_size
    num_blocks = _cdiv(num_tokens, bs)
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
    need = [_cdiv(n, cache.block_size) for n in lengths]
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
    return case.batch * _cdiv(case.context, bs) * bs * one.bytes_per_token


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _check_record(kernel: str, heads: Heads, fmt: str, shape: dict, error: float, tolerance: float) -> dict:
    return {"kernel": kernel, "heads": heads.name, "kv_format": fmt, "shape": shape, "max_abs_error": error,
            "tolerance": tolerance, "ok": error <= tolerance}


# --- decode -------------------------------------------------------------------------------------------------

def decode_splits(bench: Bench, batch: int, n_kv: int, context: int) -> tuple[int, int]:
    """(splits asked for, splits launched) of a decode call: the sweep's count or the wrapper's default, and
    what `split_plan` makes of it (whole key tiles per split can leave fewer)."""
    from lab.kernels.paged_attention import default_num_splits, split_plan

    asked = bench.sweep.decode_num_splits or default_num_splits(batch, n_kv, context, bench.device)
    return asked, split_plan(context, asked, bench.sweep.block_n)[1]


def check_decode(bench: Bench, heads: Heads, fmt: str) -> dict:
    """The decode kernel against its reference, run in float32 on the same (dequantized) cache and q."""
    from lab.kernels.paged_attention import paged_decode_attention, paged_decode_attention_ref

    lengths = list(bench.sweep.decode_check_contexts)
    bs = bench.sweep.block_size
    cache = filled_cache(bench, heads, fmt, sum(_cdiv(n, bs) * bs for n in lengths))
    tables, lens = random_tables(lengths, cache, bench.device), _int32(lengths, bench.device)
    q = torch.randn(len(lengths), heads.n_heads, heads.head_dim, dtype=bench.dtype, device=bench.device)
    out = paged_decode_attention(q, cache, tables, lens, num_splits=bench.sweep.decode_num_splits,
                                 block_n=bench.sweep.block_n)
    error = float((out.float() - paged_decode_attention_ref(q.float(), cache, tables, lens)).abs().max())
    shape = {"context_lens": lengths, "num_splits": decode_splits(bench, len(lengths), heads.n_kv, max(lengths))[1]}
    return _check_record("paged_decode_attention", heads, fmt, shape, error, bench.sweep.tolerance)


def time_decode(bench: Bench, cache, case: DecodeCase, copy_bw: float) -> dict:
    from lab.kernels.paged_attention import decode_traffic, paged_decode_attention

    heads, B, L = case.heads, case.batch, case.context
    tables, lens = random_tables([L] * B, cache, bench.device), _int32([L] * B, bench.device)
    q = torch.randn(B, heads.n_heads, heads.head_dim, dtype=bench.dtype, device=bench.device)
    ms = statistics.median(timings_ms(bench, lambda: paged_decode_attention(
        q, cache, tables, lens, num_splits=bench.sweep.decode_num_splits, block_n=bench.sweep.block_n,
        max_context=L, validate=False)))
    asked, splits = decode_splits(bench, B, heads.n_kv, L)
    moved = decode_traffic([L] * B, cache, heads.n_heads, q.element_size(), asked, bench.sweep.block_n)
    rate = moved / (ms / 1e3)
    return {"heads": heads.name, "n_heads": heads.n_heads, "n_kv": heads.n_kv, "head_dim": heads.head_dim,
            "kv_format": case.kv_format, "batch": B, "context": L, "num_splits": splits, "ms": ms, "bytes": moved,
            "bytes_per_s": rate, "fraction_of_copy": rate / copy_bw}


def decode_floor(bench: Bench, copy_bw: float) -> dict:
    """The public decode call on one block of context, one sequence: host-side work and the launch with
    almost no memory traffic. Points whose time is a small multiple of it are bound by it, not by memory."""
    heads, bs = bench.sweep.heads, bench.sweep.block_size
    return time_decode(bench, filled_cache(bench, heads, "plain", bs), DecodeCase(heads, "plain", 1, bs), copy_bw)


def decode_groups(sweep: Sweep) -> dict[tuple[Heads, str], list[DecodeCase]]:
    """The grid (main heads, plain cache) then the extras, grouped by the pool they need."""
    grid = [DecodeCase(sweep.heads, "plain", b, c) for b in sweep.decode_batches for c in sweep.decode_contexts]
    groups: dict[tuple[Heads, str], list[DecodeCase]] = {}
    for case in grid + list(sweep.decode_extras):
        groups.setdefault((case.heads, case.kv_format), []).append(case)
    return groups


def bench_decode(bench: Bench, copy_bw: float) -> tuple[dict, list[dict]]:
    """Each group's kernel is checked, then timed on one pool sized for the group's largest case that fits
    under the cap; cases beyond the cap are listed as skipped."""
    sweep = bench.sweep
    points, skipped, checks = [], [], []
    _print_row(["heads", "format", "batch", "context", "splits", "ms", "GB/s", "copy GB/s", "of copy"])
    for (heads, fmt), cases in decode_groups(sweep).items():
        sizes = {case: cache_bytes(bench, case) for case in cases}
        fits = [case for case in cases if sizes[case] <= sweep.cache_cap_bytes]
        skipped += [{"heads": c.heads.name, "kv_format": fmt, "batch": c.batch, "context": c.context,
                     "cache_bytes": sizes[c], "cap_bytes": sweep.cache_cap_bytes} for c in cases if c not in fits]
        if not fits:
            continue
        checks.append(check_decode(bench, heads, fmt))
        cache = filled_cache(bench, heads, fmt, max(c.batch * _cdiv(c.context, sweep.block_size) for c in fits)
                             * sweep.block_size)
        for case in fits:
            p = time_decode(bench, cache, case, copy_bw)
            points.append(p)
            _print_row([heads.name, fmt, p["batch"], _tokens(p["context"]), p["num_splits"], _g(p["ms"]),
                        _g(p["bytes_per_s"] / 1e9), _g(copy_bw / 1e9), f"{p['fraction_of_copy']:.1%}"])
        del cache
        if bench.cuda:
            torch.cuda.empty_cache()
    for s in skipped:
        print(f"  skipped {s['heads']} {s['kv_format']} batch {s['batch']} context {_tokens(s['context'])}: "
              f"{_g(s['cache_bytes'] / GiB)} GiB of K/V > cap {_g(s['cap_bytes'] / GiB)} GiB")
    return {"floor": decode_floor(bench, copy_bw), "points": points, "skipped": skipped}, checks


# --- prefill ------------------------------------------------------------------------------------------------

def sdpa_call(q: torch.Tensor, cache, table: torch.Tensor, context: int) -> Callable[[], torch.Tensor]:
    """SDPA on q [T, H, D] (the last T of `context` positions) and the sequence's K/V read out of the pool into
    contiguous [1, H, context, D], KV heads repeated: FlashAttention's kernels take MHA on every torch
    version, while GQA falls back to the math kernel on some. Returns a call giving [T, H, D]."""
    from torch.nn.attention.bias import causal_lower_right

    T, H, _ = q.shape
    pos = torch.arange(context, device=q.device)
    slots = table[pos // cache.block_size].long() * cache.block_size + pos % cache.block_size
    k, v = (cache.read(role, slots).to(q.dtype).transpose(0, 1).repeat_interleave(H // cache.n_kv, dim=0)
            .unsqueeze(0).contiguous() for role in "kv")
    qs = q.transpose(0, 1).unsqueeze(0).contiguous()
    # Lower-right: query i sits at position context - T + i. With T == context this is is_causal=True.
    mask = causal_lower_right(T, context)
    return lambda: F.scaled_dot_product_attention(qs, k, v, attn_mask=mask)[0].transpose(0, 1)


def check_prefill(bench: Bench) -> list[dict]:
    """The prefill kernel (a fresh sequence and a chunk over a prefix in one batch) and the SDPA call it is
    compared with, both against the float32 reference."""
    from lab.kernels.paged_attention import paged_prefill_attention, paged_prefill_attention_ref

    heads, bs, dev = bench.sweep.heads, bench.sweep.block_size, bench.device
    qlens, lengths = [q for q, _ in bench.sweep.prefill_check], [n for _, n in bench.sweep.prefill_check]
    cache = filled_cache(bench, heads, "plain", sum(_cdiv(n, bs) * bs for n in lengths))
    tables, lens = random_tables(lengths, cache, dev), _int32(lengths, dev)
    starts = [sum(qlens[:b]) for b in range(len(qlens))]
    q = torch.randn(sum(qlens), heads.n_heads, heads.head_dim, dtype=bench.dtype, device=dev)
    out = paged_prefill_attention(q, cache, tables, _int32(starts, dev), _int32(qlens, dev), lens,
                                  block_n=bench.sweep.block_n)
    ref = paged_prefill_attention_ref(q.float(), cache, tables, _int32(starts, dev), _int32(qlens, dev), lens)
    sdpa = torch.cat([sdpa_call(q[a:a + t], cache, tables[b], n)() for b, (a, t, n)
                      in enumerate(zip(starts, qlens, lengths))])
    shape = {"query_lens": qlens, "context_lens": lengths}
    tol = bench.sweep.tolerance
    return [_check_record("paged_prefill_attention", heads, "plain", shape,
                          float((out.float() - ref).abs().max()), tol),
            _check_record("scaled_dot_product_attention", heads, "plain", shape,
                          float((sdpa.float() - ref).abs().max()), tol)]


def time_prefill(bench: Bench, cache, qlen: int, context: int, matmul: float) -> dict:
    from lab.kernels.paged_attention import paged_prefill_attention, prefill_flops

    heads, dev = bench.sweep.heads, bench.device
    table = random_tables([context], cache, dev)
    q = torch.randn(qlen, heads.n_heads, heads.head_dim, dtype=bench.dtype, device=dev)
    out = torch.empty_like(q)
    starts, qlens, lens = _int32([0], dev), _int32([qlen], dev), _int32([context], dev)
    triton_ms = statistics.median(timings_ms(bench, lambda: paged_prefill_attention(
        q, cache, table, starts, qlens, lens, out=out, block_n=bench.sweep.block_n, max_query_len=qlen,
        validate=False)))
    sdpa_ms = statistics.median(timings_ms(bench, sdpa_call(q, cache, table[0], context)))
    flops = prefill_flops([qlen], [context], heads.n_heads, heads.head_dim)
    triton_rate, sdpa_rate = flops / (triton_ms / 1e3), flops / (sdpa_ms / 1e3)
    return {"heads": heads.name, "kind": "fresh" if qlen == context else "chunk", "query_len": qlen,
            "context_len": context, "flops": flops, "triton_ms": triton_ms, "triton_flops_per_s": triton_rate,
            "sdpa_ms": sdpa_ms, "sdpa_flops_per_s": sdpa_rate, "ratio_vs_sdpa": triton_rate / sdpa_rate,
            "triton_fraction_of_matmul": triton_rate / matmul, "sdpa_fraction_of_matmul": sdpa_rate / matmul}


def bench_prefill(bench: Bench, matmul: float) -> tuple[dict, list[dict]]:
    sweep = bench.sweep
    checks = check_prefill(bench)
    cases = [(n, n) for n in sweep.prefill_lengths] + list(sweep.prefill_chunks)
    cache = filled_cache(bench, sweep.heads, "plain", max(n for _, n in cases))
    points = []
    _print_row(["query", "context", "triton ms", "TFLOP/s", "SDPA ms", "TFLOP/s", "vs SDPA", "of matmul"])
    for qlen, context in cases:
        p = time_prefill(bench, cache, qlen, context, matmul)
        points.append(p)
        _print_row([_tokens(qlen), _tokens(context), _g(p["triton_ms"]), _g(p["triton_flops_per_s"] / 1e12),
                    _g(p["sdpa_ms"]), _g(p["sdpa_flops_per_s"] / 1e12), f"{p['ratio_vs_sdpa']:.1%}",
                    f"{p['triton_fraction_of_matmul']:.1%}"])
    # As decode's floor: one block of tokens, where the calls' fixed costs are nearly all there is.
    floor = time_prefill(bench, cache, sweep.block_size, sweep.block_size, matmul)
    return {"floor": floor, "points": points}, checks


# --- verdicts, output ---------------------------------------------------------------------------------------

def _worst(points: list[dict], key: str, threshold: float, **extra) -> dict:
    worst = min(points, key=lambda p: p[key], default=None)
    return {**extra, "threshold": threshold, "points": len(points), f"worst_{key}": worst and worst[key],
            "worst_point": worst, "met": None if worst is None else worst[key] >= threshold}


def evaluate_targets(result: dict, sweep: Sweep) -> dict:
    """The issue's targets as measured booleans: every qualifying point, the worst one named. `met` is None
    where no point qualifies."""
    long = [p for p in result["decode"]["points"] if p["heads"] == sweep.heads.name and p["kv_format"] == "plain"
            and p["context"] >= sweep.target_min_context]
    decode = _worst(long, "fraction_of_copy", DECODE_TARGET, min_context=sweep.target_min_context,
                    criterion=f"decode bytes/s >= {DECODE_TARGET:.0%} of measured copy bandwidth, {sweep.heads.name} "
                              f"heads, plain {sweep.dtype} cache, every batch, context >= {sweep.target_min_context}")
    prefill = _worst(result["prefill"]["points"], "ratio_vs_sdpa", PREFILL_TARGET,
                     criterion=f"prefill FLOP/s >= {PREFILL_TARGET:.0%} of SDPA's on the same q/k/v, every case")
    errors = [c["max_abs_error"] for c in result["checks"]]
    checks = {"worst_error": max(errors), "all_within_tolerance": all(c["ok"] for c in result["checks"])}
    met = [decode["met"], prefill["met"], checks["all_within_tolerance"]]
    return {"decode": decode, "prefill": prefill, "checks": checks,
            "all_met": None if None in met else all(met)}


def _print_row(cols: list) -> None:
    print("  " + f"{cols[0]:<14}" + "".join(f"{str(c):>11}" for c in cols[1:]))


def print_summary(result: dict) -> None:
    print("\ncorrectness (max abs error against the float32 reference):")
    for c in result["checks"]:
        print(f"  {c['kernel']:<30} {c['heads']:<14} {c['kv_format']:<9} {c['max_abs_error']:.2e}"
              f"  (tolerance {c['tolerance']:.0e}) {'ok' if c['ok'] else 'FAILED'}")
    t = result["targets"]
    for name, key in (("decode", "fraction_of_copy"), ("prefill", "ratio_vs_sdpa")):
        v = t[name]
        worst = "no qualifying point" if v["worst_point"] is None else f"worst {v[f'worst_{key}']:.1%}"
        print(f"target {name}: {v['criterion']}: {worst} over {v['points']} points -> met: {v['met']}")
    print(f"all targets met: {t['all_met']}")


def _log_tokens_axis(ax, ticks: list[int], **labels) -> None:
    ax.set(xscale="log", **labels)
    ax.set_xticks(ticks, [_tokens(n) for n in ticks])
    ax.minorticks_off()  # the log axis' own minor labels (2 x 10^1 ...) would sit between the token counts


def _plot_decode(ax, result: dict, sweep: Sweep) -> None:
    copy_gb = result["peers"]["copy"]["bytes_per_s"] / 1e9
    decode = result["decode"]["points"]
    main = (sweep.heads.name, "plain")
    for i, batch in enumerate(sweep.decode_batches):
        pts = sorted((p for p in decode if (p["heads"], p["kv_format"]) == main and p["batch"] == batch),
                     key=lambda p: p["context"])
        ax.plot([p["context"] for p in pts], [p["bytes_per_s"] / 1e9 for p in pts], "o-", color=f"C{i}",
                label=f"batch {batch}")
    extras = sorted({(p["heads"], p["kv_format"]) for p in decode} - {main})
    for i, group in enumerate(extras, start=len(sweep.decode_batches)):
        pts = [p for p in decode if (p["heads"], p["kv_format"]) == group]
        ax.scatter([p["context"] for p in pts], [p["bytes_per_s"] / 1e9 for p in pts], marker="x", color=f"C{i}",
                   label=f"{group[0]} {group[1]} (batch {', '.join(str(p['batch']) for p in pts)})")
    ax.axhline(copy_gb, color="k", label=f"measured copy bandwidth {_g(copy_gb)} GB/s")
    ax.axhline(DECODE_TARGET * copy_gb, color="k", ls="--", label=f"{DECODE_TARGET:.0%} of it (target)")
    _log_tokens_axis(ax, sorted({p["context"] for p in decode}), xlabel="context (tokens)",
                     ylabel="achieved GB/s (decode_traffic / time)",
                     title=f"decode attention, {sweep.heads.name} heads, {sweep.dtype}")
    ax.legend(fontsize=8)


def _plot_prefill(ax, result: dict, sweep: Sweep) -> None:
    prefill = result["prefill"]["points"]
    fresh = sorted((p for p in prefill if p["kind"] == "fresh"), key=lambda p: p["query_len"])
    chunks = [p for p in prefill if p["kind"] == "chunk"]
    for key, label, color in (("triton", "Triton paged prefill", "C0"), ("sdpa", "SDPA", "C1")):
        ax.plot([p["query_len"] for p in fresh], [p[f"{key}_flops_per_s"] / 1e12 for p in fresh], "o-",
                color=color, label=f"{label}, fresh prefill")
        ax.scatter([p["context_len"] for p in chunks], [p[f"{key}_flops_per_s"] / 1e12 for p in chunks],
                   marker="s", color=color, label=f"{label}, chunk over a prefix (at its context)")
    matmul = result["peers"]["matmul"]
    ax.axhline(matmul["flops_per_s"] / 1e12, color="k",
               label=f"{matmul['dtype']} matmul {matmul['n']}^3: {_g(matmul['flops_per_s'] / 1e12)} TFLOP/s")
    _log_tokens_axis(ax, sorted({p["context_len"] for p in prefill}), xlabel="context (tokens)",
                     ylabel="achieved TFLOP/s (prefill_flops / time)",
                     title=f"prefill attention, {sweep.heads.name} heads, {sweep.dtype}")
    ax.legend(fontsize=8)


def plot(result: dict, sweep: Sweep, path: Path) -> None:
    fig = Figure(figsize=(13, 5), layout="constrained")
    ax_decode, ax_prefill = fig.subplots(1, 2)
    _plot_decode(ax_decode, result, sweep)
    _plot_prefill(ax_prefill, result, sweep)
    if result["dry_run"]:
        fig.suptitle("DRY RUN: Triton interpreter on CPU, tiny shapes: not GPU figures", color="C3")
    fig.savefig(path, dpi=120)


def run(sweep: Sweep, dry_run: bool) -> dict:
    torch.manual_seed(0)
    started = time.perf_counter()
    bench = Bench.create(sweep)
    device_name = (torch.cuda.get_device_name(bench.device) if bench.cuda
                   else f"CPU, Triton interpreter ({cpu_model()})")
    print(f"device: {device_name}{' (DRY RUN: not GPU figures)' if dry_run else ''}")
    copy, matmul = measure_copy(bench), measure_matmul(bench)
    print(f"copy bandwidth: {_g(copy['bytes_per_s'] / 1e9)} GB/s (best of {sweep.repeats}, "
          f"{copy['buffer_bytes'] / 1024**2:.0f} MiB read + written)")
    print(f"{sweep.dtype} matmul: {_g(matmul['flops_per_s'] / 1e12)} TFLOP/s ({matmul['n']}^3, "
          f"best of {sweep.repeats})")
    print(f"\ndecode (peer: copy bandwidth above; times are medians of {sweep.repeats})")
    decode, decode_checks = bench_decode(bench, copy["bytes_per_s"])
    print(f"  decode API floor (batch 1, one block of context): {_g(decode['floor']['ms'])} ms")
    print("\nprefill (peers: SDPA on the same q/k/v, measured here; the matmul rate above)")
    prefill, prefill_checks = bench_prefill(bench, matmul["flops_per_s"])
    print(f"  prefill API floor (one block of tokens): {_g(prefill['floor']['triton_ms'])} ms, "
          f"SDPA {_g(prefill['floor']['sdpa_ms'])} ms")
    result = {
        "benchmark": "kernels_gpu", "dry_run": dry_run,
        "note": ("dry run: Triton's CPU interpreter on tiny float32 shapes; the numbers check the code path and "
                 "are not GPU figures") if dry_run else "measured on the GPU named in `device`",
        "device": device_name, "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "method": (f"kernels and SDPA: median of {sweep.repeats} calls of the public API ({sweep.warmup} untimed "
                   f"first), each after writing a {sweep.flush_bytes / 1024**2:g} MiB buffer to evict cached "
                   f"data, timed with {'CUDA events' if bench.cuda else 'perf_counter'}; copy and matmul: the "
                   f"best of as many"),
        "provenance": provenance({"sweep": asdict(sweep), "dry_run": dry_run}),
        "peers": {"copy": copy, "matmul": matmul}, "checks": decode_checks + prefill_checks,
        "decode": decode, "prefill": prefill,
    }
    result["targets"] = evaluate_targets(result, sweep)
    result["wall_seconds"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on CPU in Triton's interpreter: checks the code path, not a GPU figure")
    parser.add_argument("--out", type=Path, help="output folder (default: results/kernels_gpu/, or "
                                                 "results/kernels_gpu_dry_run/ with --dry-run)")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        print("bench/kernels_gpu.py measures a GPU, and CUDA is not available here. Run it on a machine with an "
              "NVIDIA GPU, or use --dry-run for the CPU check of the same code path on tiny shapes.", file=sys.stderr)
        return 2
    out = args.out or ROOT / "results" / ("kernels_gpu_dry_run" if args.dry_run else "kernels_gpu")
    sweep = DRY_RUN_SWEEP if args.dry_run else GPU_SWEEP
    result = run(sweep, args.dry_run)
    print_summary(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_gpu.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    plot(result, sweep, out / "kernels_gpu.png")
    print(f"\nwrote {out / 'kernels_gpu.json'} and {out / 'kernels_gpu.png'} ({result['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
