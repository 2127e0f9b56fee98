"""Notebook 00's finding: what a prefix-cache hit does to one request's time to first token (no claim decided;
the folklore's "prefix caching halves TTFT" is drawn as half the miss)."""

from __future__ import annotations

from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_line, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles


def _values(run: RunFiles) -> dict:
    t = run.csv("ttft_hit_vs_miss").groupby("case")["ttft_ms"]
    same = bool(run.metrics["outputs_identical_hit_vs_miss_float32"])
    n = int(t.size()["miss"])
    return {"miss": f"{t.median()['miss']:.0f}", "hit": f"{t.median()['hit']:.0f}",
            "repeats": f"the median of {n} repeats" if n > 1 else "one repeat",
            "same": "the same" if same else "a different"}


def _figure(run: RunFiles, title: str):
    df = run.csv("ttft_hit_vs_miss")
    fig = Figure(figsize=(7, 3.6))
    ax = fig.add_subplot()
    for i, (case, name) in enumerate((("miss", "prefix-cache miss"), ("hit", "prefix-cache hit"))):
        t = df[df["case"] == case]["ttft_ms"]
        ax.scatter([i] * len(t), t, color=PALETTE[i], alpha=0.6, label=f"{name}: one repeat each")
    medians = df.groupby("case")["ttft_ms"].median()[["miss", "hit"]]
    ax.hlines(medians, [-0.25, 0.75], [0.25, 1.25], color="0.15", linewidth=2.5, label="median of the repeats")
    miss = medians["miss"]
    claim_line(ax, miss / 2, "half the miss's median (the folklore's 'halves TTFT')")
    ax.set_xticks([0, 1], ["miss", "hit"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(0, None)
    ax.set_xlabel("the request's prompt")
    ax.set_ylabel("time to first token (ms)")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "What happens to one request, from LLM.generate to the attention?",
    "A prefix-cache hit cut a lone request's time to first token from {miss} ms to {hit} ms ({repeats} each),"
    " with {same} greedy output in float32.", _values, _figure)


def _kv_over_time(run: RunFiles):
    from lab.studies.engine_tour.measure import TourParams, plot_kv_over_time

    return plot_kv_over_time(run.csv("steps_cold"), run.params(TourParams).NUM_KV_BLOCKS,
                             "Cold batch: KV blocks in use per step")


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"kv_blocks_over_time": _kv_over_time}
