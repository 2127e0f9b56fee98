"""Notebook 04's finding: whether recomputing a recent window's KV beat reading it, at every measured point, against
the article's "recompute wins, by an order of magnitude" (seeds/000 §2.2, §3.1)."""

from __future__ import annotations

from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_line, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles

STORES = (("load host memory s", "host memory"), ("load disk file s", "a disk file"))


def _values(run: RunFiles) -> dict:
    m = run.metrics
    return {"h": m["recompute_beats_host_memory"], "d": m["recompute_beats_disk"], "n": m["measured_points"]}


def _figure(run: RunFiles, title: str):
    df = run.csv("measured")
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    claim_line(ax, 1.0, "break-even: recompute takes as long as the read")
    claim_line(ax, 0.1, "article: recompute an order of magnitude faster", style=":")
    colours = iter(PALETTE)
    for model, rows in df.groupby("model", sort=False):
        for column, store in STORES:
            ax.scatter(rows["prefix"], rows["recompute_s"] / rows[column], color=next(colours), s=18,
                       label=f"{model}, read from {store}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context before the recomputed window (tokens; every measured window)")
    ax.set_ylabel("recompute time / read time (x, log scale)")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "Can recomputing the KV cache beat reading it?",
    "On this CPU, recomputing a recent window's KV beat reading it at {h} of {n} measured points from host memory and"
    " {d} of {n} from disk.", _values, _figure,
    claim="§3.1: recomputing a recent window beats reading its KV on long contexts")


def _plot(name: str):
    def draw(run: RunFiles):
        from lab.studies import replay_break_even as study

        return getattr(study, name)(run.csv("measured"))
    return draw


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"crossover": _plot("plot_crossover"), "predicted_vs_measured": _plot("plot_predicted")}
