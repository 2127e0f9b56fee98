"""The figures of notebook 05 (`lab.studies.spec_acceptance`): acceptance by draft position, speedup against k,
predicted against measured speedup, each with its 95% interval over prompts as error bars."""

from __future__ import annotations

import pandas as pd

from lab.figures.style import PALETTE, error_extents, frame_extents, legend_outside


def plot_acceptance_by_position(main: pd.DataFrame):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    drafters = list(dict.fromkeys(main["drafter"]))
    fig, axes = plt.subplots(1, len(drafters), figsize=(4.5 * len(drafters), 3.4), squeeze=False, sharey=True)
    categories = list(dict.fromkeys(main["category"]))
    for ax, drafter in zip(axes[0], drafters):
        for _, r in main[(main["drafter"] == drafter) & (main["category"] != "all")].iterrows():
            rates = r["acceptance_by_position"]
            if rates:
                rows = [f"{drafter} {r['category']} position {i}" for i in range(1, len(rates) + 1)]
                # each category a little to the side, so equal rates (often 0 or 1 on few prompts) all show
                shift = 0.06 * (categories.index(r["category"]) - (len(categories) - 1) / 2)
                ax.errorbar([i + shift for i in range(1, len(rates) + 1)], rates, marker="o", capsize=2,
                            label=r["category"],
                            color=PALETTE[categories.index(r["category"]) % len(PALETTE)],
                            yerr=error_extents(rates, r["acceptance_by_position_low"],
                                               r["acceptance_by_position_high"], rows))
        ax.set(title=f"Acceptance by draft position: {drafter}", xlabel="draft position in the round", ylim=(0, 1.02))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel("acceptance given the earlier ones (95% over prompts)")
    legend_outside(axes[0][-1], title="task category")
    fig.tight_layout()
    return fig


def plot_speedup_vs_k(sweep: pd.DataFrame):
    import matplotlib.pyplot as plt

    drafters = list(dict.fromkeys(sweep["drafter"]))
    fig, axes = plt.subplots(1, len(drafters), figsize=(5 * len(drafters), 3.6), squeeze=False, sharey=True)
    for ax, drafter in zip(axes[0], drafters):
        d = sweep[(sweep["drafter"] == drafter) & (sweep["category"] != "all")]
        for i, (cat, g) in enumerate(d.groupby("category", sort=False)):
            color = PALETTE[i]
            ax.errorbar(g["k"], g["measured_speedup"], marker="o", color=color, capsize=2, label=f"{cat} measured",
                        yerr=frame_extents(g, "measured_speedup", [f"{drafter} {cat} k={k}" for k in g["k"]]))
            ax.plot(g["k"], g["predicted_measured_costs"], ls="--", color=color, alpha=0.7, label="_predicted")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.plot([], [], ls="--", color="0.5", label="dashed: predicted with measured c, v(k)\n(in its category's colour)")
        ax.set(title=f"Speedup against k: {drafter}", xlabel="k (drafts per round)")
        ax.title.set_fontsize(9)
    axes[0][0].set_ylabel("speedup over plain decoding (x; bars: 95% over prompts)")
    legend_outside(axes[0][-1])
    fig.tight_layout()
    return fig


def plot_predicted_vs_measured(main: pd.DataFrame):
    """Predicted against measured speedup per task category, the article's formula (v = 1: verification costs one
    step, left) and the formula with this engine's measured costs (right), each with the identity line and a
    +-10% band; one colour per drafter, the measured speedup's 95% interval over prompts as x error bars."""
    import matplotlib.pyplot as plt

    d = main[main["category"] != "all"]
    lo = min(d["measured_speedup"].min(), d["predicted_measured_costs"].min(), d["predicted_article"].min()) * 0.9
    hi = max(d["measured_speedup"].max(), d["predicted_measured_costs"].max(), d["predicted_article"].max()) * 1.1
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharex=True, sharey=True)
    for ax, column, name in ((axes[0], "predicted_article", "the article's formula (v = 1)"),
                             (axes[1], "predicted_measured_costs", "with measured c and v(k)")):
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9", label="within 10%")
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = measured")
        for i, (drafter, g) in enumerate(d.groupby("drafter", sort=False)):
            xerr = frame_extents(g, "measured_speedup", [f"{drafter} {cat}" for cat in g["category"]])
            ax.errorbar(g["measured_speedup"], g[column], xerr=xerr, fmt="o", color=PALETTE[i], capsize=2,
                        label=drafter)
        ax.set(xlabel="measured speedup, x (95% over prompts)", ylabel="predicted speedup, x",
               title=f"Per task category: {name}")
        legend_outside(ax)
    fig.tight_layout()
    return fig
