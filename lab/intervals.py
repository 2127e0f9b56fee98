"""Uncertainty of the figures the studies report: a rate's interval, and whether two paired measurements differ.

- `wilson(k, n)`: the Wilson score interval of a proportion (Wilson, 1927), which stays inside [0, 1] and is
  not degenerate at 0 or n successes (the normal approximation says 100% +- 0 for 40 of 40; Wilson says
  91.2-100%).
- `paired_difference(a, b)`: the mean of a - b over paired items (the same prompt under two methods) and its
  percentile-bootstrap interval, resampling items; the difference is *distinguishable* from zero when the
  interval excludes it. Pairing removes the items' own difficulty from the comparison.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of k successes in n trials."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a, b, confidence: float = 0.95, resamples: int = 4000, seed: int = 0) -> dict:
    """mean(a - b) over paired items with its bootstrap interval; `distinguishable`: the interval excludes 0."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired samples must have one equal, non-zero length, got {a.size} and {b.size}")
    d = a - b
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, (resamples, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"difference": float(d.mean()), "low": float(lo), "high": float(hi),
            "distinguishable": bool(lo > 0 or hi < 0)}


def rate(k: int, n: int) -> str:
    """'k/n = p% (lo-hi%)', the way a table states a rate with its Wilson interval."""
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / n:.0%} ({lo:.0%}-{hi:.0%})"
