"""Timing contenders interleaved over rounds, so that a ratio between two of them does not carry the drift between
them.

This machine's speed moves by up to 2x between hours and by several percent between seconds (issue 52: the
compiled-against-eager verdict flipped between two passes seconds apart when each variant was timed once, one after
the other). So every contender (an engine variant, `transformers`, vLLM's CPU build, a server) is built first and
held, then each round times every workload on every contender, one right after the other, the order rotated
between rounds so that none always runs first (warm caches) or last. A ratio is taken within each round, between
two timings seconds apart, and reported as the median over the rounds and the span (lowest, highest): with three
rounds, a span that straddles the target means the run did not settle it.

Where the contenders do not fit in memory together (an 8B model's bf16 copies on one GPU), each is built, timed for
all its rounds and released in turn (`interleaved=False` in the result): its ratios then carry the drift between
contenders, and the printout says so.
"""

from __future__ import annotations

import statistics
from typing import Callable, Protocol


class Contender(Protocol):
    """One thing that runs the workloads: `measure` times one workload once and returns at least
    {"seconds", "new_tokens", "step_s", "value"} (value in the workload's metric); `close` frees what it holds."""

    label: str

    def measure(self, workload) -> dict: ...

    def close(self) -> None: ...


def summarize(values: list[float]) -> dict:
    """The median of one quantity over rounds, its span and the values themselves (in round order)."""
    if not values:
        raise ValueError("no rounds to summarize")
    return {"value": statistics.median(values), "span": [min(values), max(values)], "values": list(values)}


def per_round_ratio(ours: list[float], theirs: list[float], lower_is_better: bool) -> dict:
    """The speedup of `ours` over `theirs` taken within each round (both lists in round order), summarized:
    for a time (lower is better) theirs / ours, for a rate ours / theirs."""
    if len(ours) != len(theirs):
        raise ValueError(f"ratios need the same rounds on both sides, got {len(ours)} and {len(theirs)}")
    ratios = [t / o if lower_is_better else o / t for o, t in zip(ours, theirs)]
    return summarize(ratios)


def rotated(items: list, r: int) -> list:
    """`items` started at position r (mod their number): round r's order."""
    if not items:
        return []
    k = r % len(items)
    return items[k:] + items[:k]


def run_rounds(contenders: list, workloads: list, rounds: int,
               on_measure: Callable[[object, object, int, dict], None] = lambda c, w, r, m: None) -> dict:
    """Every workload on every contender, `rounds` times, interleaved: {label: {workload name: [measured dict per
    round]}}. `on_measure(contender, workload, round, measured)` is called as each timing finishes."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    out = {c.label: {w.name: [] for w in workloads} for c in contenders}
    for r in range(rounds):
        for w in workloads:
            for c in rotated(contenders, r):
                m = c.measure(w)
                out[c.label][w.name].append(m)
                on_measure(c, w, r, m)
    return out


def combine(measured: list[dict]) -> dict:
    """One workload's rounds on one contender as a single record: the median of every number over the rounds (so
    a record reads as before; preemptions, a count, summed), the metric's span and values, and the number of
    rounds."""
    keys = [k for k, v in measured[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out = {k: statistics.median([m[k] for m in measured if m.get(k) is not None])
           for k in keys if any(m.get(k) is not None for m in measured)}
    if "preemptions" in out:  # a count: one round's preemptions must not vanish in the median
        out["preemptions"] = sum(m.get("preemptions") or 0 for m in measured)
    out.update(summarize([m["value"] for m in measured]), rounds=len(measured))
    return out
