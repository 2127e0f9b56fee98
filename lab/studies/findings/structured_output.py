"""Notebook 07's finding: the grammar mask's share of a decode step, from xgrammar's precompiled mask to the naive
mask recomputed for every state, against the article's 20-30% at small batch (seeds/003 §4.2). The two methods
bound a range, not an interval."""

from __future__ import annotations

from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_band, error_extents, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles
from lab.studies.findings.words import against

BAND = (20.0, 30.0)


def naive_share(run: RunFiles) -> float:
    """The naive full mask's share of a batch-1 step, %: its median time for one state over that plus the step
    without a grammar (how notebook 07's claims table reads it)."""
    naive = run.csv("mask_components")["naive_s"].dropna().median() * 1e3
    step = run.csv("mask_summary").set_index("batch").loc[1, "step without grammar ms"]
    return 100 * naive / (naive + step)


def _values(run: RunFiles) -> dict:
    x = 100 * run.csv("mask_summary").set_index("batch").loc[1, "mask share of step"]
    naive = naive_share(run)
    return {"x": f"{x:.1f}", "naive": f"{naive:.0f}", "rel": against(min(x, naive), max(x, naive), *BAND)}


def _figure(run: RunFiles, title: str):
    df = run.csv("mask_summary")
    fig = Figure(figsize=(7.5, 3.8))
    ax = fig.add_subplot()
    claim_band(ax, *BAND, "article: 20-30% of a step at small batch")
    share = 100 * df["mask share of step"]
    ax.errorbar(df["batch"], share, yerr=error_extents(share, 100 * df["share runs low"], 100 * df["share runs high"]),
                fmt="o-", color=PALETTE[0], capsize=3, label=f"xgrammar's precompiled mask (range of "
                                                             f"{int(df['rounds'].iloc[0])} runs)")
    ax.scatter([1], [naive_share(run)], marker="s", color=PALETTE[5], zorder=3,
               label="naive mask recomputed every state (batch 1)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 70)
    ax.set_xlabel("decode batch (requests)")
    ax.set_ylabel("mask's share of a step (%)")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "What does a grammar mask cost, and what does it buy?",
    "A grammar mask took {x}% of a batch-1 step with xgrammar's precompiled masks and {naive}% recomputed naively: a "
    "range {rel} the article's 20-30%.", _values, _figure,
    claim="两三成): this machine, batch 1")


def _mask_cost(run: RunFiles):
    from lab.studies.structured_output.claims import plot_mask_cost

    return plot_mask_cost(run.csv("mask_summary"), run.csv("mask_components"))


def _validity(run: RunFiles):
    from lab.studies.structured_output.claims import plot_validity

    return plot_validity(run.csv("validity"))


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"mask_cost": _mask_cost, "validity": _validity}
