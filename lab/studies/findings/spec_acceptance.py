"""Notebook 05's finding: speculative decoding's speedup at batch 1 per drafter, 95% intervals over prompts,
against the folklore's 2-3x (the article's worked example: about 2.3x at a = 0.7, k = 4, c = 0.05)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_band, claim_line, error_extents, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles

DRAFTERS = (("ngram", "n-gram"), ("quantized", "4-bit copy"), ("layerskip", "layer-skip"))
BAND = (2.0, 3.0)


def _values(run: RunFiles) -> dict:
    m = run.metrics
    out = {key: f"{m[f'speedup_{key}']:.2f}" for key, _ in DRAFTERS}
    prompts = int(run.csv("drafter_comparison")["prompts"].iloc[0])
    return out | {"lo": f"{m['speedup_ngram_low']:.2f}", "hi": f"{m['speedup_ngram_high']:.2f}", "p": prompts}


def _figure(run: RunFiles, title: str):
    m = run.metrics
    prompts = int(run.csv("drafter_comparison")["prompts"].iloc[0])
    y = np.arange(len(DRAFTERS))[::-1]
    v = np.array([m[f"speedup_{k}"] for k, _ in DRAFTERS])
    err = error_extents(v, [m[f"speedup_{k}_low"] for k, _ in DRAFTERS], [m[f"speedup_{k}_high"] for k, _ in DRAFTERS])
    fig = Figure(figsize=(7.5, 3.2))
    ax = fig.add_subplot()
    claim_band(ax, *BAND, "folklore: speculation gives 2-3x", axis="x")
    claim_line(ax, 1.0, "plain decoding", axis="x", style=":")
    ax.barh(y, v, 0.5, xerr=err, capsize=4, color=PALETTE[0], label=f"measured (95% over {prompts} prompts)")
    ax.set_yticks(y, [name for _, name in DRAFTERS])
    ax.set_xlim(0, 3.2)
    ax.set_xlabel("speedup over plain decoding at batch 1 (x)")
    ax.set_ylabel("drafter")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "Does speculative decoding give 2-3x?",
    "At batch 1 on this CPU, speculative decoding ran {ngram}x plain decoding with an n-gram drafter (95% over {p} "
    "prompts: {lo}-{hi}), {quantized}x with a 4-bit copy, {layerskip}x with layer-skip.", _values, _figure)


def _plot(name: str, table: str):
    def draw(run: RunFiles):
        from lab.studies.spec_acceptance import plots

        return getattr(plots, name)(run.csv(table))
    return draw


def _by_position(run: RunFiles):
    """The per-position acceptance lists, which a CSV holds as their printed form."""
    import ast

    from lab.studies.spec_acceptance.plots import plot_acceptance_by_position

    main = run.csv("by_category")
    for col in ("acceptance_by_position", "acceptance_by_position_low", "acceptance_by_position_high"):
        main[col] = main[col].map(lambda v: ast.literal_eval(v) if isinstance(v, str) else v)
    return plot_acceptance_by_position(main)


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"acceptance_by_position": _by_position,
           "predicted_vs_measured": _plot("plot_predicted_vs_measured", "by_category"),
           "speedup_vs_k": _plot("plot_speedup_vs_k", "k_sweep")}
