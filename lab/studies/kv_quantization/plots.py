"""Notebook 03's figures: error growth with context per format, keys against values, and the end-to-end
effect beside how many sequences one pool holds."""

from __future__ import annotations

import pandas as pd

from lab.figures.style import PALETTE, error_extents, frame_extents, legend_outside
from lab.studies.kv_quantization.params import KVStudyParams


def _family(name: str) -> str:
    """A format's number type, the small multiple it is drawn in: fp8, int8, int4 or int2."""
    kind = name.split("/")[0]
    return "fp8" if kind.startswith("fp8") else kind


def plot_growth(df: pd.DataFrame, title: str):
    """Next-token KL against position (what the claim "the error grows with context" is judged on; the attention
    output error is in the table), one small multiple per number type in a row so no panel holds more than a
    handful of formats; each line a format with its 95% band over blocks (shaded). Positions are bucket ends on a
    log2 axis; each panel's log y axis is labelled at 1, 2 and 5 of every decade, so a reader can read a slope."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, LogLocator

    families = sorted({_family(n) for n in df["format"]}, key=lambda f: ("fp8", "int8", "int4", "int2").index(f)
                      if f in ("fp8", "int8", "int4", "int2") else 9)
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families), 3.9), squeeze=False)
    ends = sorted(df["position_end"].unique())
    d_all = df[df["metric"] == "next_token_kl"]
    for ax, family in zip(axes[0], families):
        d = d_all[d_all["format"].map(_family) == family]
        for i, (name, g) in enumerate(d.groupby("format", sort=False)):
            ax.plot(g["position_end"], g["value"], "o-", color=PALETTE[i], label=name.removeprefix(f"{family}_"),
                    lw=1.2, ms=3)
            ax.fill_between(g["position_end"], g["value_low"], g["value_high"], color=PALETTE[i], alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ends, [f"{e // 1024}K" if e >= 1024 else str(e) for e in ends], fontsize=7)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(3, 1)))
        ax.yaxis.set_minor_locator(plt.NullLocator())
        ax.tick_params(axis="y", labelsize=7)
        ax.set(xlabel="position (bucket end, tokens)", title=f"{family} formats", ylabel="KL (nats, log scale)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    axes[0][0].set_ylabel("next-token KL(exact || quantized) (nats, log scale)")
    fig.suptitle(f"Next-token KL by position, {title} (shaded: 95% bootstrap interval over blocks)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_roles(roles: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    x = range(len(roles))
    labels = {"attention_rel_error": "attention output relative error (log scale)",
              "next_token_kl": "next-token KL, nats (log scale)"}
    for ax, metric in zip(axes, ("attention_rel_error", "next_token_kl")):
        for i, (shift, role, label) in enumerate(((-0.2, "k", "keys only quantized"),
                                                  (0.2, "v", "values only quantized"))):
            ax.bar([j + shift for j in x], roles[f"{metric}_{role}_only"], 0.4, label=label, color=PALETTE[i],
                   yerr=frame_extents(roles, f"{metric}_{role}_only", list(roles["format"])), capsize=3)
        ax.set_xticks(list(x), roles["format"], fontsize=8)
        ax.set(yscale="log", xlabel="KV format", ylabel=labels[metric],
               title=f"Keys against values quantized alone: {metric.replace('_', ' ')} (95% over blocks)")
        ax.title.set_fontsize(9)
        legend_outside(ax)
    fig.tight_layout()
    return fig


def plot_end_to_end(e2e: pd.DataFrame, concurrency: pd.DataFrame):
    """Per format (rows): the held-out perplexity change against the exact cache beside the 1% the lab reads
    "safe" as (the axis stops where that line stays readable; a format beyond it is marked at the edge with its
    value), the share of sensitive outputs changed, and how many sequences one KV pool holds, measured and
    predicted."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig = plt.figure(figsize=(15, 4.6))
    grid = fig.add_gridspec(1, 4, width_ratios=(1, 1, 0.75, 1), wspace=0.15)  # a gap for the third's own labels
    first = fig.add_subplot(grid[0])
    axes = [first, fig.add_subplot(grid[1], sharey=first), fig.add_subplot(grid[3])]
    names = list(e2e["format"])
    y = np.arange(len(names))[::-1]
    limit = KVStudyParams.SAFE_PPL_PCT
    right = 4 * limit
    change = e2e["perplexity_change_pct"].to_numpy(float)
    shown = change <= right
    axes[0].axvline(limit, color="0.2", ls="--", label=f"'safe': within {limit:g}% (the lab's reading)")
    axes[0].errorbar(change[shown], y[shown], fmt="o", color=PALETTE[0], capsize=3,
                     xerr=frame_extents(e2e[shown], "perplexity_change_pct", [n for n, k in zip(names, shown) if k]),
                     label="change (95% over sequences, paired)")
    for yy, v in zip(y[~shown], change[~shown]):
        axes[0].annotate(f"{v:+.1f}% ->", (right, yy), ha="right", va="center", fontsize=8, color=PALETTE[5])
    axes[0].set_xlim(min(-0.5, float(e2e["perplexity_change_pct_low"].min()) - 0.2), right)
    axes[0].set_yticks(y, names, fontsize=8)
    axes[0].set(xlabel="perplexity change vs the exact cache (%)", ylabel="KV cache format",
                title="Held-out perplexity")
    # the share changed is 1 - the share unchanged: its interval runs from 1 - same's high to 1 - same's low
    changed = error_extents(1 - e2e["same_output_all"], 1 - e2e["same_output_all_high"],
                            1 - e2e["same_output_all_low"], names, scale=100)
    axes[1].barh(y, 100 * (1 - e2e["same_output_all"]), xerr=changed, capsize=3, color=PALETTE[1],
                 label="all but long context (Wilson 95%)")
    if "same_output_long_context" in e2e and e2e["same_output_long_context"].notna().any():
        axes[1].plot(100 * (1 - e2e["same_output_long_context"]), y, "D", color=PALETTE[3], label="long context")
    axes[1].tick_params(labelleft=False)  # the formats' names are the first panel's (a shared axis)
    axes[1].set(xlabel="greedy outputs changed (% of sensitive items)", title="Sensitive outputs changed")
    yc = np.arange(len(concurrency))[::-1]
    axes[2].barh(yc, concurrency["measured_sequences"], color=PALETTE[2], label="engine (measured)")
    axes[2].plot(concurrency["predicted_sequences"], yc, "kx", label="lab.memory (predicted)")
    axes[2].set_yticks(yc, list(concurrency["format"]), fontsize=8)
    axes[2].set(xlabel="sequences resident at once (count)", ylabel="KV cache format",
                title="Sequences one KV pool holds")
    for ax in axes:
        legend_outside(ax, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.suptitle("Each KV cache format against the exact cache, end to end", fontsize=10)
    return fig
