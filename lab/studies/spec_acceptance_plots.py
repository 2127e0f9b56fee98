"""The figures of notebook 05 (`lab.studies.spec_acceptance`): acceptance by draft position, speedup against k,
predicted against measured speedup, each with its 95% interval over prompts as error bars."""

from __future__ import annotations

import pandas as pd

from lab.plots import error_extents, frame_extents


def plot_acceptance_by_position(main: pd.DataFrame):
    import matplotlib.pyplot as plt

    drafters = list(dict.fromkeys(main["drafter"]))
    fig, axes = plt.subplots(1, len(drafters), figsize=(4.5 * len(drafters), 3.4), squeeze=False, sharey=True)
    for ax, drafter in zip(axes[0], drafters):
        for _, r in main[(main["drafter"] == drafter) & (main["category"] != "all")].iterrows():
            rates = r["acceptance_by_position"]
            if rates:
                rows = [f"{drafter} {r['category']} position {i}" for i in range(1, len(rates) + 1)]
                ax.errorbar(range(1, len(rates) + 1), rates, marker="o", capsize=2, label=r["category"],
                            yerr=error_extents(rates, r["acceptance_by_position_low"],
                                               r["acceptance_by_position_high"], rows))
        ax.set(title=drafter, xlabel="draft position", ylim=(0, 1.02))
    axes[0][0].set_ylabel("acceptance given the earlier ones (95% over prompts)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_speedup_vs_k(sweep: pd.DataFrame):
    import matplotlib.pyplot as plt

    drafters = list(dict.fromkeys(sweep["drafter"]))
    fig, axes = plt.subplots(1, len(drafters), figsize=(5 * len(drafters), 3.6), squeeze=False, sharey=True)
    for ax, drafter in zip(axes[0], drafters):
        d = sweep[(sweep["drafter"] == drafter) & (sweep["category"] != "all")]
        for i, (cat, g) in enumerate(d.groupby("category", sort=False)):
            color = f"C{i}"
            ax.errorbar(g["k"], g["measured_speedup"], marker="o", color=color, capsize=2, label=f"{cat} measured",
                        yerr=frame_extents(g, "measured_speedup", [f"{drafter} {cat} k={k}" for k in g["k"]]))
            ax.plot(g["k"], g["predicted_measured_costs"], ls="--", color=color, alpha=0.7)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=f"{drafter} (dashed: predicted with measured c, v(k))", xlabel="k (drafts per round)")
    axes[0][0].set_ylabel("speedup over plain decoding")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_predicted_vs_measured(main: pd.DataFrame):
    import matplotlib.pyplot as plt

    d = main[main["category"] != "all"]
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    for i, (drafter, g) in enumerate(d.groupby("drafter", sort=False)):
        xerr = frame_extents(g, "measured_speedup", [f"{drafter} {cat}" for cat in g["category"]])
        ax.errorbar(g["measured_speedup"], g["predicted_article"], xerr=xerr, fmt="x", color=f"C{i}", capsize=2,
                    label=f"{drafter}: article (v=1)")
        ax.errorbar(g["measured_speedup"], g["predicted_measured_costs"], xerr=xerr, fmt="o", color=f"C{i}",
                    capsize=2, label=f"{drafter}: measured v(k)")
    lo = min(d["measured_speedup"].min(), d["predicted_measured_costs"].min(), d["predicted_article"].min()) * 0.9
    hi = max(d["measured_speedup"].max(), d["predicted_measured_costs"].max(), d["predicted_article"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.plot([lo, hi], [lo * 1.1, hi * 1.1], color="grey", lw=0.5, ls=":")
    ax.plot([lo, hi], [lo * 0.9, hi * 0.9], color="grey", lw=0.5, ls=":")
    ax.set(xlabel="measured speedup (95% over prompts)", ylabel="predicted speedup",
           title="per category (dotted: ±10%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
