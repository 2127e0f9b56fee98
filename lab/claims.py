"""Checking a source article's numbers: the study recomputes each one, and the verdict is computed, not typed.

The memory-accounting and replay studies set every number their source articles state beside the lab's own
recomputation of it; `verdict` turns the pair into "correct" or by how much the claim is off, so that a table
of claims can never say "correct" about a number it did not check.
"""

from __future__ import annotations


def verdict(claimed, computed: float, rel_tol: float = 0.02) -> str:
    """'correct' when the recomputation agrees within rounding (a range: falls inside it), else by how much."""
    lo, hi = claimed if isinstance(claimed, tuple) else (claimed, claimed)
    if lo * (1 - rel_tol) <= computed <= hi * (1 + rel_tol):
        return "correct"
    ref = lo if computed < lo else hi
    return f"wrong: the lab gets {computed / ref:.4g}x the claim"
