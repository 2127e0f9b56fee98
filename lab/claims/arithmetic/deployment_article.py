"""Seed 003's arithmetic, recomputed from the inputs the article states (quantization, KV and serving).

Each row takes the article's own inputs (a 70B model, 32 layers x 8 KV heads x 128 in FP16, 8K tokens, 32
requests, 2 TB/s, 300+ TFLOP/s at 40%, a 500-token request in a 4096-token reservation) through `lab.memory`,
`lab.machine.roofline` and `lab.machine.hardware`; where the article leaves an input open (request lengths for paging, a real
70B's shape) the row names what it takes instead. Rows of §1.1-§2.1 and §6.2 that notebook 01's own table already
recomputes (`lab.studies.memory_accounting.measure.claims_table`) are not repeated here.
"""

from __future__ import annotations

from lab import memory as mem
from lab.machine import roofline
from lab.claims.table import Bound, Number, Range
from lab.machine.hardware import GPUS
from lab.claims.arithmetic import Paging, recomputed

# The article's example model (§1.1, §6.2): 32 layers, hidden 4096, 8 KV heads of 128, FP16 KV.
ARTICLE = mem.ModelShape("32L-8KV-128", 1, 1, 1, 32, 8, 8, 128)
MHA = mem.ModelShape("32L-32KV-128", 1, 1, 1, 32, 32, 32, 128)
RESERVE_GB = 3.0  # §6.2's estimate_memory(overhead_gb=3.0)
CARD_GB = 80  # "单张 80GB 卡"


def _section_1() -> list[dict]:
    """§1.1-§1.3: weights, KV, activations, the prefill's time, the throughput a TPOT gives."""
    l70 = mem.ModelShape.preset("llama-3-70b")
    a100 = GPUS["a100-sxm-80gb"]  # "三百多 TFLOPs" with "2TB/s": an A100's 312 TFLOP/s, 2.0 TB/s
    prefill = roofline.prefill_flops(roofline.ModelCost(0, 70e9, 0), 4096)
    return [
        recomputed("003 §1.1: 70B in INT4 with group scales and zero points (Llama-3-70B, int4 g128 asymmetric, "
                   "bf16 embeddings/LM head)", "38-42 GB (「group scale 和 zero point」)", Range("38", "42"),
                   mem.weight_bytes(l70, "int4-g128-asym")["total"] / 1e9, "GB",
                   why="zero points packed at 4 bits beside each group's fp16 scale (GPTQ/AWQ's qzeros)"),
        recomputed("003 §1.1: 70e9 weights at 4 bits, before scales", "about 35 GB (「35GB 左右」)", Number("35"),
                   mem.weight_bytes_for_params(70e9, 0.5) / 1e9, "GB"),
        recomputed("003 §1.1: KV per token with MHA, 32 layers x 32 KV heads x 128, fp16", "512 KB",
                   Number("512"), mem.kv_bytes_per_token(MHA, "fp16") / 1024, "KiB"),
        recomputed("003 §1.1: activation peak of a Llama-3-70B forward, 8192 batched tokens (§3.2's upper end), "
                   "32 sequences, bf16 (lab.memory.activation_peak_bytes)", "2-4 GB margin (「留 2~4GB 余量」)",
                   Range(None, "4"), mem.activation_peak_bytes(l70, 8192, 32) / 1e9, "GB",
                   why="a profile-free estimate: one layer's widest intermediates for the step's tokens and the "
                       "sampled rows' fp32 logits; a real engine's profile adds its allocator's slack"),
        recomputed("003 §1.2: prefill of 5.73e14 FLOPs at 40% of an A100's 312 TFLOP/s", "4+ s (「四秒多」)",
                   Range("4.0", "4.9"),
                   roofline.prefill_time_lower_bound(a100, prefill, 0, compute_efficiency=0.4).seconds, "s"),
        recomputed("003 §1.3: 32 requests at a TPOT of 50 ms", "640 tokens/s", Number("640"), 32 / 0.050,
                   "tokens/s"),
    ]


def _section_2() -> list[dict]:
    """§2.1 and §2.3: what an INT4 step can save at most, and an FP8 KV cache."""
    l70 = mem.ModelShape.preset("llama-3-70b")
    fp16, int4 = (roofline.decode_bytes(roofline.model_cost(l70, w, "bf16"), 1, 4096) for w in ("bf16", "int4-g128"))
    return [
        recomputed("003 §2.1: bytes a decode step reads, FP16 over INT4 weights (Llama-3-70B, int4 g128, batch 1, "
                   "4096 tokens of fp16 KV)", "not 4x (「INT4 能带来四倍加速…没在真实负载上测过」)",
                   Bound("4", above=False), fp16 / int4, "x",
                   why="the most a bandwidth-bound step can gain: KV, scales and the unquantized embeddings are read "
                       "either way"),
        recomputed("003 §2.3: an FP8 KV cache for 32 requests of 8K, 32 layers x 8 KV heads x 128",
                   "half of 32 GB (「直接砍半」)",
                   Number("16"), mem.kv_cache_bytes(ARTICLE, 8192, 32, dtype="fp8") / mem.GIB, "GiB"),
    ]


def _section_3(p: "Paging") -> list[dict]:
    """§3.1: a contiguous reservation's waste, paging's, the concurrency paging holds, and block sizes."""
    lengths = mem.lognormal_lengths(p.p50, p.p90, p.p99)
    waste = {b: mem.paging_waste(lengths, b, p.seq_len) for b in (8, 16, 32)}
    held = {b: w["mean_length"] + w["paged_waste_slots"] for b, w in waste.items()}  # KV slots a sequence holds
    dist = (f"log-normal lengths P50/P90/P99 {p.p50}/{p.p90}/{p.p99}, at most "
            f"{p.seq_len} tokens")
    return [
        recomputed("003 §3.1: a 4096-token reservation for a 500-token request, the share left empty",
                   "八成 (0.8)", Number("0.8"), mem.paging_waste([500], 4096, 4096)["contiguous_waste_fraction"],
                   "of the reservation", why="1 - 500/4096 rounds to nine tenths (九成), not eight"),
        recomputed(f"003 §3.1: a contiguous reservation's KV waste ({dist})", "over 60% (「六成以上」)",
                   Range("60", None), 100 * waste[16]["contiguous_waste_fraction"], "%"),
        recomputed(f"003 §3.1: paged KV waste at block 16 ({dist})", "single digits (「个位数百分比」)",
                   Range(None, "9"), 100 * waste[16]["paged_waste_fraction"], "%"),
        recomputed(f"003 §3.1: sequences the same KV memory holds, paged at block 16 over contiguous ({dist})",
                   "several times (「多扛好几倍并发」)", Range("3", None), p.seq_len / held[16], "x"),
        recomputed(f"003 §3.1: sequences the same KV memory holds, block 8 over block 32 ({dist})",
                   "little difference (「差异不会特别大」)", Bound("1.1", above=False), held[32] / held[8], "x",
                   why="under 1.1x, the notebooks' reading of 'hardly worth it'; the block table and addressing "
                       "costs the article also weighs are not counted"),
    ]


def _total(shape: mem.ModelShape, requests: int, kv: str) -> float:
    """§6.2's estimate_memory in GiB: 70e9 weights at 0.55 bytes, the KV of `requests` x 8K, 3 GB reserve."""
    weights = mem.weight_bytes_for_params(70e9, 0.55) / mem.GIB
    return weights + mem.kv_cache_bytes(shape, 8192, requests, dtype=kv) / mem.GIB + RESERVE_GB


def _section_6() -> list[dict]:
    """§6.2's sizing example, on its own 32-layer shape and on a real 70B's 80 layers."""
    l70 = mem.ModelShape.preset("llama-3-70b")
    real = (f"Llama-3-70B's {l70.num_layers} layers x {l70.num_kv_heads} KV heads x {l70.head_dim}, weights and "
            f"reserve as the example's")
    return [
        recomputed("003 §6.2: the example's total, 35.86 GiB of weights + 32 x 8K of fp16 KV + 3 GB",
                   "七十多GB, fits an 80 GB card", Range("70", "79"), _total(ARTICLE, 32, "fp16"), "GiB"),
        recomputed("003 §6.2: the example at 24 requests or with an FP8 KV cache, the larger total",
                   "both fit 80 GB (「两条路都能走通」)", Bound(str(CARD_GB), above=False),
                   max(_total(ARTICLE, 24, "fp16"), _total(ARTICLE, 32, "fp8")), "GiB"),
        recomputed(f"003 §6.2: the example for a real 70B, 32 x 8K of fp16 KV ({real})",
                   "fits an 80 GB card (「刚好卡在边缘」)", Bound(str(CARD_GB), above=False),
                   _total(l70, 32, "fp16"), "GiB"),
        recomputed(f"003 §6.2: a real 70B at 24 requests or with an FP8 KV cache, the larger total ({real})",
                   "both fit 80 GB", Bound(str(CARD_GB), above=False),
                   max(_total(l70, 24, "fp16"), _total(l70, 32, "fp8")), "GiB"),
    ]


def _unrowed() -> list[dict]:
    """Claims a skeptic's re-read found without a row (issue 48 item 5): §4.3's pipeline traffic against tensor
    parallelism's, and §7.3's one 32K request against the article's own cache pool (§6.2's 32 x 8K of fp16 KV)."""
    l70 = mem.ModelShape.preset("llama-3-70b")
    act = l70.hidden_size * 2  # one token's activation in fp16
    tp = 2 * l70.num_layers * act * 2 * (8 - 1) / 8  # two ring all-reduces a layer over 8 cards
    pp = (8 - 1) * act  # seven stage boundaries
    pool = mem.kv_cache_bytes(ARTICLE, 8192, 32, dtype="fp16")
    return [
        recomputed("003 §4.3: bytes a token moves under TP=8 (two all-reduces a layer) over PP=8 (seven boundaries), "
                   "a 70B's 80 layers of d_model 8192 in fp16, above 1", "通信量小很多", Bound("1"), tp / pp, "x"),
        recomputed("003 §7.3: one 32K request's KV on its own model (128 KB a token, fp16) over its own 32 GB pool "
                   "(§6.2: 32 x 8K), above 1 to burst it", "直接把缓存池撑爆", Bound("1"),
                   mem.kv_cache_bytes(ARTICLE, 32768, dtype="fp16") / pool, "x",
                   why="a 32K request takes an eighth of the pool its own example sizes; its own §6.3 configuration "
                       "(max_model_len 16384) refuses it before it reaches the pool"),
    ]


def rows(paging: Paging) -> list[dict]:
    """One `recomputed` row per claim of seed 003 that arithmetic on its stated inputs decides."""
    return [*_section_1(), *_section_2(), *_section_3(paging), *_section_6(), *_unrowed()]
