"""Notebook 08's finding: the all-reduce's share of a 70B TP=8 decode step with Replay on, projected by the roofline
and an alpha-beta model from NVLink to PCIe (the all-reduce latency alpha is assumed, so the two links bound a range,
not an interval), against the article's "up to 40%" (seeds/000 §5.2)."""

from __future__ import annotations

import dataclasses

from matplotlib.figure import Figure

from lab.parallel.comm_model import LINKS
from lab.figures.style import PALETTE, claim_line, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles
from lab.studies.findings.words import against

CLAIM = 40.0  # 「通信占比高达 40%」


def _shares(run: RunFiles) -> dict[str, float]:
    from lab.studies.parallelism.measure import ParallelParams
    from lab.studies.parallelism.claims import replay_step_shares

    names = {f.name for f in dataclasses.fields(ParallelParams)}
    return {k: 100 * v for k, v in replay_step_shares(ParallelParams(
        **{k: v for k, v in run.parameters.items() if k in names})).items()}


def _values(run: RunFiles) -> dict:
    s = _shares(run)
    nv, pcie = s["nvlink-h100x8"], s["pcie5-h100x8"]
    return {"nv": f"{nv:.0f}", "pcie": f"{pcie:.0f}", "model": run.parameters["PROJECT_MODEL"],
            "tp": run.parameters["PROJECT_TP"], "rel": against(min(nv, pcie), max(nv, pcie), 0.0, CLAIM)}


def _figure(run: RunFiles, title: str):
    df = run.csv("alpha_sweep")
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    claim_line(ax, CLAIM, "article: all-reduce up to 40% of a step")
    colours = iter(PALETTE)
    for (link, batch), rows in df.groupby(["link", "batch"]):
        ax.plot(rows["alpha_us"], 100 * rows["comm share"], "o-", markersize=3, color=next(colours),
                label=f"{LINKS[link].name}, plain decode at batch {batch}")
    for link, share in _shares(run).items():
        ax.scatter([LINKS[link].alpha * 1e6], [share], marker="*", s=140, color=next(colours), zorder=3,
                   label=f"{LINKS[link].name}, Replay on (assumed alpha)")
    ax.set_xscale("log")
    ax.set_ylim(0, 100)
    ax.set_xlabel("all-reduce latency alpha (us, log scale; assumed, not measured)")
    ax.set_ylabel("all-reduce share of a decode step (%)")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "What do tensor and pipeline parallelism's communication cost?",
    "Projected by the roofline and an alpha-beta model, all-reduce takes {nv}% (NVLink) to {pcie}% (PCIe) of a "
    "{model} TP={tp} decode step with Replay on: a range {rel} the article's 'up to 40%'.", _values, _figure,
    claim="all-reduce takes up to 40% of a decode step")


def _links(run: RunFiles):
    from lab.studies.parallelism.measure import plot_links

    return plot_links(run.csv("comm_sweep"), run.csv("comm_fit"))


def _alpha(run: RunFiles):
    from lab.studies.parallelism.measure import ParallelParams, plot_alpha_sweep

    return plot_alpha_sweep(run.csv("alpha_sweep"), run.params(ParallelParams))


def _bubble(run: RunFiles):
    from lab.studies.parallelism.claims import plot_bubble

    return plot_bubble(run.csv("bubble"))


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"comm_sweep": _links, "alpha_sweep": _alpha, "bubble": _bubble}
