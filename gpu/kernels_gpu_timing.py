"""Timing on the device, and the peers the kernels are set against: a plain copy and a large matmul.

Times are taken after a write of a buffer larger than L2 so that no run reads data left in cache by the
previous one; kernels are timed as medians, the peers as the best of as many calls (slower runs are
interference, not the memory system's or the tensor cores' limit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels_gpu_sweep import Sweep
from lab.bench.caselog import CaseLog


@dataclass
class Bench:
    """A run's sweep and what its timings need on the device."""

    sweep: Sweep
    device: torch.device
    dtype: torch.dtype
    flush: torch.Tensor
    log: CaseLog  # every finished case, as a JSON line (a step stopped at its time limit keeps them)

    @staticmethod
    def create(sweep: Sweep, log: CaseLog | None = None) -> "Bench":
        device = torch.device(sweep.device)
        return Bench(sweep, device, getattr(torch, sweep.dtype),
                     torch.empty(sweep.flush_bytes, dtype=torch.uint8, device=device), log or CaseLog(None))

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
