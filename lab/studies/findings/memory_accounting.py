"""Notebook 01's finding: INT4 decode against bf16 at batch 1 and 32 on this CPU, beside the bytes-read bound and
the article's 2-2.5x (seeds/003 §2.1)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_band, claim_line, error_extents, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles
from lab.studies.findings.words import against

BAND = (2.0, 2.5)  # 「INT4 decode is 2-2.5x faster than FP16」


def _rows(run: RunFiles):
    df = run.csv("int4_speedup")
    df = df[df["int4 against"] == "bfloat16"].set_index("batch")
    return df  # span_low, span_high: the range of the runs (not a 95% interval)


def _values(run: RunFiles) -> dict:
    df = _rows(run)
    b1, big = df.loc[1], df.loc[df.index.max()]  # batch 1 and the largest measured (32 at the reference size)
    return {"b1": f"{b1['measured_speedup']:.2f}", "lo": f"{b1['span_low']:.2f}", "hi": f"{b1['span_high']:.2f}",
            "n": int(b1["runs"]), "big": f"{big['measured_speedup']:.2f}", "batch": int(df.index.max()),
            "rel": against(min(b1["span_low"], big["span_low"]), max(b1["span_high"], big["span_high"]), *BAND)}


def _figure(run: RunFiles, title: str):
    df = _rows(run)
    x = np.arange(len(df))
    fig = Figure(figsize=(7, 3.8))
    ax = fig.add_subplot()
    claim_band(ax, *BAND, "article: INT4 decode 2-2.5x FP16")
    claim_line(ax, 1.0, "as fast as bf16", style=":")
    ax.bar(x, df["measured_speedup"], 0.5, color=PALETTE[0],
           yerr=error_extents(df["measured_speedup"], df["span_low"], df["span_high"]), capsize=4,
           label=f"measured INT4 / bf16 (median, range of {int(df['runs'].iloc[0])} runs)")
    ax.scatter(x, df["bytes_read_ratio"], marker="D", color=PALETTE[1], zorder=3,
               label="bound: bf16 bytes read / INT4 bytes read")
    ax.set_xticks(x, [f"batch {b}" for b in df.index])
    ax.set_xlabel("decode batch (SmolLM2-135M on this CPU)")
    ax.set_ylabel("decode speed, INT4 over bf16 (x)")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "Is INT4 decode 2-2.5x faster than 16-bit, as the bytes it reads suggest?",
    "On this CPU, INT4 weights made a batch-1 decode step {b1}x as fast as bf16 (range of {n} runs {lo}-{hi}) and "
    "{big}x at batch {batch}: {rel} the article's 2-2.5x.", _values, _figure,
    claim="INT4 decode is 2-2.5x faster than FP16 (batch 1)")


def _params(run: RunFiles):
    from lab.studies.memory_accounting.measure import MemoryParams

    return run.params(MemoryParams)


def _roofline(run: RunFiles):
    from lab import memory as mem
    from lab.machine import roofline
    from lab.machine.hardware import get_gpu
    from lab.studies.memory_accounting import measure as study

    p = _params(run)
    gpu = get_gpu(p.GPU)
    cost = study.model_cost(mem.ModelShape.load(p.MODEL), p.WEIGHTS, p.KV_DTYPE)
    return roofline.plot_roofline(gpu, study.roofline_points(gpu, cost, p.SEQ_LEN))


def _int4(run: RunFiles):
    from lab.studies.memory_accounting import int4_decode

    return int4_decode.plot(run.csv("int4_speedup"))


def _study_plot(name: str, table: str):
    def draw(run: RunFiles):
        from lab.studies.memory_accounting import measure as study

        return getattr(study, name)(run.csv(table), _params(run))
    return draw


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"memory_vs_context": _study_plot("plot_memory_vs_context", "memory_vs_context"),
           "concurrency_vs_context": _study_plot("plot_concurrency", "concurrency_vs_context"),
           "paging_waste": _study_plot("plot_paging", "paging_waste"), "roofline": _roofline, "int4_decode": _int4}
