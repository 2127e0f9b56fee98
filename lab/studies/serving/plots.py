"""Notebook 06's concurrency-ramp figure: each level's median over the ramp's passes with their min-max span,
levels on a log2 axis (concurrency doubles), the knee and the operating point marked and named in the legend."""

from __future__ import annotations

import pandas as pd

from lab.figures.style import frame_extents

# Okabe and Ito's colour-blind-safe palette: one colour per series, none repeated within a panel.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00")


def _series(ax, levels: pd.DataFrame, metric: str, label: str, colour: str, marker: str):
    spans = frame_extents(levels, metric, [f"{label}, concurrency {c}" for c in levels["concurrency"]])
    passes = int(levels["passes"].min())
    ax.errorbar(levels["concurrency"], levels[metric], yerr=spans, fmt=marker, color=colour, capsize=3,
                label=f"{label} (median, span of {passes} pass{'' if passes == 1 else 'es'})")


def plot_ramp(levels: pd.DataFrame, knee: int, op: int):
    """Throughput (left) and latency (right) against requests in flight, from `serving.ramp_levels`. Levels are
    measured points, not joined: each is its own closed-loop load."""
    import matplotlib.pyplot as plt

    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4))
    if np.allclose(levels["goodput_tokens"], levels["output_throughput"]):  # one series would hide the other
        _series(a, levels, "output_throughput", "output tokens/s = goodput (every request within the SLOs)",
                PALETTE[0], "o")
    else:
        _series(a, levels, "output_throughput", "output tokens/s", PALETTE[0], "o")
        _series(a, levels, "goodput_tokens", "goodput tokens/s (within the SLOs)", PALETTE[1], "s")
    _series(b, levels, "tpot_p50", "TPOT P50", PALETTE[0], "o")
    _series(b, levels, "tpot_p99", "TPOT P99", PALETTE[1], "s")
    _series(b, levels, "ttft_p99", "TTFT P99", PALETTE[2], "^")
    a.set(ylabel="throughput (tokens/s)", title="Throughput as concurrency rises (closed loop)")
    b.set(ylabel="latency (s, log scale)", yscale="log", title="Latency as concurrency rises")
    # `serving.find_knee` falls back to the last level when throughput never flattens: then there is no knee
    found = knee < levels["concurrency"].max()
    knee_label = f"knee: concurrency {knee}" if found else \
        f"no knee up to {knee}: throughput still rising (the operating point counts from {knee})"
    for ax in (a, b):
        ax.axvline(knee, color="black", ls="--", lw=0.8, label=knee_label)
        ax.axvline(op, color="0.5", ls=":", lw=1.0, label=f"operating point (70% of {knee}): {op}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(levels["concurrency"]), [str(c) for c in levels["concurrency"]])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.margins(x=0.08)  # the end levels off the frame
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
