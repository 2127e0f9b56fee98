"""The run's verdicts and what it prints: the issue's targets as measured booleans (the worst qualifying point
named), the correctness summary, and the table rows and number formats the other parts print with.
"""

from __future__ import annotations

import math

from kernels_gpu_sweep import DECODE_TARGET, PREFILL_TARGET, Sweep


def tokens_label(n: int) -> str:
    """A token count as the tables and axes show it: 16384 -> "16K"."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def g4(x: float) -> str:
    """Four significant digits: the GPU's GB/s and TFLOP/s and the dry run's tiny rates alike."""
    return f"{x:.4g}"


def _worst(points: list[dict], key: str, threshold: float, **extra) -> dict:
    worst = min(points, key=lambda p: p[key], default=None)
    return {**extra, "threshold": threshold, "points": len(points), f"worst_{key}": worst and worst[key],
            "worst_point": worst, "met": None if worst is None else worst[key] >= threshold}


def evaluate_targets(result: dict, sweep: Sweep) -> dict:
    """The issue's targets as measured booleans: every qualifying point, the worst one named. `met` is None
    where no point qualifies."""
    long = [p for p in result["decode"]["points"] if p["heads"] == sweep.heads.name and p["kv_format"] == "plain"
            and p["context"] >= sweep.target_min_context]
    decode = _worst(long, "fraction_of_copy", DECODE_TARGET, min_context=sweep.target_min_context,
                    criterion=f"decode bytes/s >= {DECODE_TARGET:.0%} of measured copy bandwidth, {sweep.heads.name} "
                              f"heads, plain {sweep.dtype} cache, every batch, context >= {sweep.target_min_context}")
    prefill = _worst(result["prefill"]["points"], "ratio_vs_sdpa", PREFILL_TARGET,
                     criterion=f"prefill FLOP/s >= {PREFILL_TARGET:.0%} of SDPA's on the same q/k/v, every case")
    errors = [c["max_abs_error"] for c in result["checks"]]
    worst = max(errors, key=lambda e: math.inf if math.isnan(e) else e)  # a NaN is the worst error
    checks = {"worst_error": worst, "all_within_tolerance": all(c["ok"] for c in result["checks"])}
    met = [decode["met"], prefill["met"], checks["all_within_tolerance"]]
    return {"decode": decode, "prefill": prefill, "checks": checks,
            "all_met": None if None in met else all(met)}


def print_row(cols: list) -> None:
    print("  " + f"{cols[0]:<14}" + "".join(f"{str(c):>11}" for c in cols[1:]))


def print_summary(result: dict) -> None:
    print("\ncorrectness (max abs error against the float32 reference):")
    for c in result["checks"]:
        print(f"  {c['kernel']:<30} {c['heads']:<14} {c['kv_format']:<9} {c['max_abs_error']:.2e}"
              f"  (tolerance {c['tolerance']:.1e}, {c['tolerance_ulps']:g} ulp) {'ok' if c['ok'] else 'FAILED'}")
    t = result["targets"]
    for name, key in (("decode", "fraction_of_copy"), ("prefill", "ratio_vs_sdpa")):
        v = t[name]
        worst = "no qualifying point" if v["worst_point"] is None else f"worst {v[f'worst_{key}']:.1%}"
        print(f"target {name}: {v['criterion']}: {worst} over {v['points']} points -> met: {v['met']}")
    print(f"all targets met: {t['all_met']}")
