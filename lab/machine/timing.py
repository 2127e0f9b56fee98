"""Timing on the host: the median of repeated calls after a warm-up, the one way the lab times a function
(replay's recompute and loads, speculative decoding's step costs, the engine benchmark's peers).

The median, not the mean: on a shared 2-core machine a few calls are delayed by other work, and the median
ignores them. A warm-up call first, so allocation and first-touch costs are not timed. Where CUDA is in use,
each call is followed by a synchronize, so the time is the device's, not the launch's.
"""

from __future__ import annotations

import statistics
import time

import torch


def sync() -> None:
    """Wait for the GPUs where CUDA is in use: a clock read after launches alone times the launches. Every
    device holding memory, not only the current one (`torch.cuda.synchronize()` alone waits for the current
    device, cuda:0 unless set: work a study put on DEVICE=cuda:1 would be timed at its launch)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        current = torch.cuda.current_device()
        for i in range(torch.cuda.device_count()):
            if i == current or torch.cuda.memory_allocated(i):  # reading the allocator creates no context
                torch.cuda.synchronize(i)


def median_seconds(fn, repeats: int, before=None) -> float:
    """Median wall time of `repeats` calls of fn after one warm-up call (`before` runs, untimed, before each)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = []
    fn()  # warm-up: allocation, first touch
    for _ in range(repeats):
        if before is not None:
            before()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe_seconds(probe, repeats: int) -> float:
    """Median seconds of the step a probe (`LLM.forward_probe`: a context manager yielding it) holds."""
    if repeats < 1:
        raise ValueError(f"need repeats >= 1, got {repeats}")
    with probe as step:
        return median_seconds(step, repeats)


def ratio_interval(num: list[float], den: list[float], confidence: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """median(num) / median(den) and its percentile-bootstrap interval (both samples resampled, each on its
    own: the two timings are not paired step by step): how far the ratio of two timed quantities moves with the
    step-to-step spread of the timings. The interval contains the ratio (`lab.stats.intervals.percentile_interval`)."""
    import numpy as np

    from lab.stats.intervals import percentile_interval

    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ratios = (np.median(rng.choice(a, (resamples, a.size)), axis=1)
              / np.median(rng.choice(b, (resamples, b.size)), axis=1))
    iv = percentile_interval(np.median(a) / np.median(b), ratios, confidence, skip_nan=False)
    return iv.value, iv.low, iv.high
