"""Paging waste: the KV slots a paged cache leaves empty, against contiguous preallocation to max_model_len; and
the blocks a sequence holds when sliding windows let a paged cache free some.

Kwon et al., PagedAttention, SOSP 2023: at most one partly filled block per sequence. Request lengths come from
a log-normal fitted to published P50/P90/P99, taken at evenly spaced quantiles (no sampling noise).
"""

from __future__ import annotations

import math

from .shape import ModelShape


def blocks_held(s: ModelShape, seq_len: int, block_size: int, tokens_per_step: int = 1) -> int:
    """Most KV blocks one sequence of `seq_len` tokens holds at once in a paged cache with one block pool for all
    layers (the lab's engine, `lab.engine.block_manager.BlockManager`), while a step computes `tokens_per_step` of its
    tokens.

    Every layer windowed (Mistral), W < seq_len: the step computing positions p .. p + n - 1 holds the blocks from
    the one holding p - W + 1 (the first key its first query sees; those before are freed) to the one holding
    p + n - 1, at most ceil((W + n - 2) / bs) + 1 of them (vLLM's SlidingWindowSpec bounds it by
    ceil((W - 1 + n) / bs) + 1, one token more). Otherwise all ceil(seq_len / bs): with some global layers (Gemma's
    alternation) the one pool cannot free a block a global layer still reads. `kv_cache.kv_cache_bytes` caps each
    windowed layer separately, which is what an allocator with a pool per kind of layer holds (vLLM's hybrid KV
    cache manager), not this one."""
    full = -(-seq_len // block_size)
    window = s.sliding_window
    if not window or s.sliding_window_layers < s.num_layers or window >= seq_len:
        return full
    return min(full, -(-(window + tokens_per_step - 2) // block_size) + 1)


def lognormal_from_percentiles(p50: float, p90: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of log-length fitted to P50, P90, P99: mu = ln P50, sigma by least squares on z-scores."""
    z90, z99 = 1.2815515655446004, 2.3263478740408408
    mu = math.log(p50)
    sigma = (z90 * (math.log(p90) - mu) + z99 * (math.log(p99) - mu)) / (z90**2 + z99**2)
    return mu, sigma


def lognormal_lengths(p50: float, p90: float, p99: float, n: int = 10_000) -> list[int]:
    """n deterministic lengths at evenly spaced quantiles of the fitted log-normal (no sampling noise)."""
    from statistics import NormalDist

    mu, sigma = lognormal_from_percentiles(p50, p90, p99)
    z = NormalDist()
    return [max(1, round(math.exp(mu + sigma * z.inv_cdf((i + 0.5) / n)))) for i in range(n)]


def paging_waste(lengths: list[int], block_size: int, max_model_len: int) -> dict[str, float]:
    """Mean wasted KV slots per sequence: paged (last block's tail) vs contiguous (up to max_model_len).

    Lengths over max_model_len would be rejected by an engine; they are counted and left out, never clipped.
    """
    kept = [n for n in lengths if n <= max_model_len]
    if not kept:
        raise ValueError(f"every length exceeds max_model_len {max_model_len}")
    paged = sum(-(-n // block_size) * block_size - n for n in kept) / len(kept)
    contiguous = sum(max_model_len - n for n in kept) / len(kept)
    mean_len = sum(kept) / len(kept)
    return {"block_size": block_size, "mean_length": mean_len, "rejected_fraction": 1 - len(kept) / len(lengths),
            "paged_waste_slots": paged, "contiguous_waste_slots": contiguous,
            "paged_waste_fraction": paged / (mean_len + paged),
            "contiguous_waste_fraction": contiguous / max_model_len}
