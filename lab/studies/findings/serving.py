"""Notebook 06's finding: prefix caching's cut of TTFT P50 under load, with a shared system prompt and with random
prompts, each against the article's figure for it (seeds/002 §6.2: a further 30-50%; about 10-20% with random
inputs), medians and ranges over independent runs."""

from __future__ import annotations

from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_band, finding_title, legend_outside
from lab.claims.across_runs import spread
from lab.studies.findings import Finding, RunFiles
from lab.studies.findings.words import against
from lab.studies.serving.claims import prefix_cuts

SHARED, RANDOM = "shared system prompt", "random prompts"
BANDS = {SHARED: (30.0, 50.0, "article: a further 30-50%"), RANDOM: (10.0, 20.0, "article: about 10-20% by paging")}


def _values(run: RunFiles) -> dict:
    df = run.csv("prefix_caching")
    s = spread(prefix_cuts(df, SHARED))
    tokens = int(df["system_prompt_tokens"].iloc[0])
    return {"cut": f"{s.median:.0f}", "lo": f"{s.lo:.1f}", "hi": f"{s.hi:.1f}", "n": s.n, "tokens": tokens,
            "rel": against(s.lo, s.hi, *BANDS[SHARED][:2])}


def _figure(run: RunFiles, title: str):
    df = run.csv("prefix_caching")
    fig = Figure(figsize=(8, 3.6))
    axes = fig.subplots(1, 2, sharey=True)
    for i, (ax, prompts) in enumerate(zip(axes, (SHARED, RANDOM))):
        cuts = prefix_cuts(df, prompts)
        s = spread(cuts)
        low, high, label = BANDS[prompts]
        claim_band(ax, low, high, label)
        ax.axhline(0, color="0.5", linewidth=0.8, label="_no change")
        ax.scatter(range(len(cuts)), cuts, color=PALETTE[2 * i], label=f"one run each (median {s.median:.0f}%)")
        ax.set_xticks(range(len(cuts)), [f"run {r + 1}" for r in range(len(cuts))])
        ax.set_xlim(-0.5, len(cuts) - 0.5)
        ax.set_title(prompts)
        ax.set_xlabel("independent load run")
        legend_outside(ax, loc="upper left", bbox_to_anchor=(0.0, -0.22))
    axes[0].set_ylabel("TTFT P50 cut by prefix caching (%)")
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "What do TTFT, TPOT and goodput do under load?",
    "Under load with a shared {tokens}-token system prompt, prefix caching cut TTFT P50 by {cut}% (range of {n} runs "
    "{lo}-{hi}%): {rel} the article's further 30-50%.", _values, _figure,
    claim="KV reuse with a fixed system prompt lowers TTFT")


def _ramp(run: RunFiles):
    from lab.studies.serving.plots import plot_ramp

    m = run.metrics
    return plot_ramp(run.csv("ramp_levels"), m["knee_concurrency"], m["operating_concurrency"])


def _dashboard(name: str):
    def draw(run: RunFiles):
        from lab.bench.dashboard import plot_tables

        title = {"dashboard_knee": f"concurrency {run.metrics['knee_concurrency']}",
                 "dashboard_chunked_on": "chunked prefill on", "dashboard_chunked_off": "chunked prefill off"}[name]
        return plot_tables(run.csv(f"{name}_requests"), run.csv(f"{name}_scrapes"), title)
    return draw


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py); the
# dashboards only from runs that kept their load's tables (`lab.bench.dashboard.save`)
FIGURES = {"ramp": _ramp, **{n: _dashboard(n) for n in ("dashboard_knee", "dashboard_chunked_on",
                                                        "dashboard_chunked_off")}}
