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


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def median_seconds(fn, repeats: int, before=None) -> float:
    """Median wall time of `repeats` calls of fn after one warm-up call (`before` runs, untimed, before each)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = []
    fn()  # warm-up: allocation, first touch
    for _ in range(repeats):
        if before is not None:
            before()
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
