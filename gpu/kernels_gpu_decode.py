"""Decode attention: checked against its float32 reference per head layout and cache format, then timed over
the sweep's grid of batch and context, as bytes moved per second (`decode_traffic`) against the measured copy
bandwidth; points whose K/V would exceed the cache cap are skipped and listed.
"""

from __future__ import annotations

import statistics

import torch

from kernels_gpu_caches import cache_bytes, cdiv, check_record, filled_cache, int32_tensor, random_tables
from kernels_gpu_report import g4, print_row, tokens_label
from kernels_gpu_sweep import GiB, DecodeCase, Heads, Sweep
from kernels_gpu_timing import Bench, timings_ms


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
    cache = filled_cache(bench, heads, fmt, sum(cdiv(n, bs) * bs for n in lengths))
    tables, lens = random_tables(lengths, cache, bench.device), int32_tensor(lengths, bench.device)
    q = torch.randn(len(lengths), heads.n_heads, heads.head_dim, dtype=bench.dtype, device=bench.device)
    out = paged_decode_attention(q, cache, tables, lens, num_splits=bench.sweep.decode_num_splits,
                                 block_n=bench.sweep.block_n)
    ref = paged_decode_attention_ref(q.float(), cache, tables, lens)
    shape = {"context_lens": lengths, "num_splits": decode_splits(bench, len(lengths), heads.n_kv, max(lengths))[1]}
    return check_record("paged_decode_attention", heads, fmt, shape, out, ref, bench.sweep.tolerance_ulps)


def time_decode(bench: Bench, cache, case: DecodeCase, copy_bw: float) -> dict:
    from lab.kernels.paged_attention import decode_traffic, paged_decode_attention

    heads, B, L = case.heads, case.batch, case.context
    tables, lens = random_tables([L] * B, cache, bench.device), int32_tensor([L] * B, bench.device)
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
    print_row(["heads", "format", "batch", "context", "splits", "ms", "GB/s", "copy GB/s", "of copy"])
    for (heads, fmt), cases in decode_groups(sweep).items():
        sizes = {case: cache_bytes(bench, case) for case in cases}
        fits = [case for case in cases if sizes[case] <= sweep.cache_cap_bytes]
        skipped += [{"heads": c.heads.name, "kv_format": fmt, "batch": c.batch, "context": c.context,
                     "cache_bytes": sizes[c], "cap_bytes": sweep.cache_cap_bytes} for c in cases if c not in fits]
        if not fits:
            continue
        checks.append(check_decode(bench, heads, fmt))
        bench.log.write("decode_check", checks[-1])
        cache = filled_cache(bench, heads, fmt, max(c.batch * cdiv(c.context, sweep.block_size) for c in fits)
                             * sweep.block_size)
        for case in fits:
            p = time_decode(bench, cache, case, copy_bw)
            points.append(p)
            bench.log.write("decode", p)
            print_row([heads.name, fmt, p["batch"], tokens_label(p["context"]), p["num_splits"], g4(p["ms"]),
                        g4(p["bytes_per_s"] / 1e9), g4(copy_bw / 1e9), f"{p['fraction_of_copy']:.1%}"])
        del cache
        if bench.cuda:
            torch.cuda.empty_cache()
    for s in skipped:
        print(f"  skipped {s['heads']} {s['kv_format']} batch {s['batch']} context {tokens_label(s['context'])}: "
              f"{g4(s['cache_bytes'] / GiB)} GiB of K/V > cap {g4(s['cap_bytes'] / GiB)} GiB")
    return {"floor": decode_floor(bench, copy_bw), "points": points, "skipped": skipped}, checks
