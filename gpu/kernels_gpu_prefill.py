"""Prefill attention: checked (with the SDPA call it is compared with) against the float32 reference, then
timed on fresh prefills and chunks over a cached prefix, as FLOP/s (`prefill_flops`) against
`torch.nn.functional.scaled_dot_product_attention` on the same q, k and v and the measured matmul rate.

`torch.nn.attention.bias` and `lab.kernels` import triton, so they are imported inside the functions.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels_gpu_caches import cdiv, check_record, filled_cache, int32_tensor, random_tables
from kernels_gpu_report import g4, print_row, tokens_label
from kernels_gpu_timing import Bench, timings_ms


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
    cache = filled_cache(bench, heads, "plain", sum(cdiv(n, bs) * bs for n in lengths))
    tables, lens = random_tables(lengths, cache, dev), int32_tensor(lengths, dev)
    starts = [sum(qlens[:b]) for b in range(len(qlens))]
    q = torch.randn(sum(qlens), heads.n_heads, heads.head_dim, dtype=bench.dtype, device=dev)
    out = paged_prefill_attention(q, cache, tables, int32_tensor(starts, dev), int32_tensor(qlens, dev), lens,
                                  block_n=bench.sweep.block_n)
    ref = paged_prefill_attention_ref(q.float(), cache, tables, int32_tensor(starts, dev), int32_tensor(qlens, dev), lens)
    sdpa = torch.cat([sdpa_call(q[a:a + t], cache, tables[b], n)() for b, (a, t, n)
                      in enumerate(zip(starts, qlens, lengths))])
    shape = {"query_lens": qlens, "context_lens": lengths}
    ulps = bench.sweep.tolerance_ulps
    return [check_record("paged_prefill_attention", heads, "plain", shape, out, ref, ulps),
            check_record("scaled_dot_product_attention", heads, "plain", shape, sdpa, ref, ulps)]


def time_prefill(bench: Bench, cache, qlen: int, context: int, matmul: float) -> dict:
    from lab.kernels.paged_attention import paged_prefill_attention, prefill_flops

    heads, dev = bench.sweep.heads, bench.device
    table = random_tables([context], cache, dev)
    q = torch.randn(qlen, heads.n_heads, heads.head_dim, dtype=bench.dtype, device=dev)
    out = torch.empty_like(q)
    starts, qlens, lens = int32_tensor([0], dev), int32_tensor([qlen], dev), int32_tensor([context], dev)
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
    for check in checks:
        bench.log.write("prefill_check", check)
    cases = [(n, n) for n in sweep.prefill_lengths] + list(sweep.prefill_chunks)
    cache = filled_cache(bench, sweep.heads, "plain", max(n for _, n in cases))
    points = []
    print_row(["query", "context", "triton ms", "TFLOP/s", "SDPA ms", "TFLOP/s", "vs SDPA", "of matmul"])
    for qlen, context in cases:
        p = time_prefill(bench, cache, qlen, context, matmul)
        points.append(p)
        bench.log.write("prefill", p)
        print_row([tokens_label(qlen), tokens_label(context), g4(p["triton_ms"]), g4(p["triton_flops_per_s"] / 1e12),
                    g4(p["sdpa_ms"]), g4(p["sdpa_flops_per_s"] / 1e12), f"{p['ratio_vs_sdpa']:.1%}",
                    f"{p['triton_fraction_of_matmul']:.1%}"])
    # As decode's floor: one block of tokens, where the calls' fixed costs are nearly all there is.
    floor = time_prefill(bench, cache, sweep.block_size, sweep.block_size, matmul)
    return {"floor": floor, "points": points}, checks
