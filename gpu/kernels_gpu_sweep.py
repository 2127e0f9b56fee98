"""What one run of gpu/kernels_gpu.py measures: head layouts, decode and prefill shapes, the correctness
checks' shapes and tolerance, the peers' sizes, timing repetitions, and the issue's targets. `GPU_SWEEP` is
the real run on one GPU, `DRY_RUN_SWEEP` the same code path on tiny shapes in Triton's CPU interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    kv_format: str  # "plain" (the sweep's dtype) or a lab.kv.format.KVCacheFormat dtype
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
    # A kernel's max abs error against its float32 reference may be this many units in the last place of the
    # sweep's dtype at the reference's largest |value| (at least 1): bfloat16's step is 2^-7 below 2 but 2^-5
    # from 4 up, so a fixed absolute tolerance fails correct kernels on large outputs (`check_record`).
    tolerance_ulps: float
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
    tolerance_ulps=4,  # the bf16 output's own rounding is half a unit; bf16 probabilities in P @ V add a few
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
    tolerance_ulps=256, copy_bytes=16 * 1024**2, matmul_n=256, cache_cap_bytes=64 * 1024, flush_bytes=1024**2,
    warmup=1, repeats=3, target_min_context=48,
)
