"""Figures of the weight-quantization study (notebook 02): every point with its 95% interval."""

from __future__ import annotations

import pandas as pd

from lab.eval.sensitive import CATEGORIES
from lab.plots import frame_extents


def plot_grid(grid: pd.DataFrame, domains: tuple[str, ...]):
    """Perplexity and KL per domain against the configuration, one line per method, with bootstrap intervals
    over sequences; and the share of sensitive outputs changed per category."""
    import matplotlib.pyplot as plt

    quant, base = grid.iloc[1:], grid.iloc[0]
    cats = [c for c in CATEGORIES if quant[f"pass_{c}"].notna().any()]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for (domain, style), (method, g) in ((d, m) for d in zip(domains, ("o-", "s--", "^:")) for m in
                                         quant.groupby("method", sort=False)):
        x = list(g["config"])
        rows = [f"{method} {c}, {domain}" for c in x]
        axes[0].errorbar(x, g[f"{domain}_perplexity"], yerr=frame_extents(g, f"{domain}_perplexity", rows),
                         fmt=style, capsize=3, label=f"{method}, {domain}")
        axes[1].errorbar(x, g[f"{domain}_kl_mean"], yerr=frame_extents(g, f"{domain}_kl_mean", rows), fmt=style,
                         capsize=3, label=f"{method}, {domain}")
    for domain in domains:
        axes[0].axhline(base[f"{domain}_perplexity"], color="k", ls="--", lw=1)
    axes[0].set(ylabel="perplexity (dashed: unquantized)", title="perplexity per held-out domain", yscale="log")
    axes[1].set(ylabel="mean KL(unquantized || quantized), nats/token", title="KL vs unquantized", yscale="log")
    labels = [f"{m}\n{c}" for m, c in zip(quant["method"], quant["config"])]
    width = 0.8 / max(len(cats), 1)
    for i, c in enumerate(cats):
        axes[2].bar([x + i * width for x in range(len(quant))], 100 * (1 - quant[f"same_output_{c}"]), width, label=c)
    axes[2].set_xticks([x + 0.4 - width / 2 for x in range(len(quant))], labels, fontsize=7)
    axes[2].set(ylabel="% of greedy outputs changed", title="sensitive items: outputs changed vs unquantized")
    for ax in axes:
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_pass_rates(grid: pd.DataFrame):
    """Sensitive pass rate per category and model, with Wilson intervals."""
    import matplotlib.pyplot as plt

    cats = [c for c in CATEGORIES if grid[f"pass_{c}"].notna().any()]
    labels = ["unquantized"] + [f"{m} {c}" for m, c in zip(grid["method"].iloc[1:], grid["config"].iloc[1:])]
    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.8 / len(cats)
    for i, c in enumerate(cats):
        ok = grid[f"pass_{c}"].notna()
        g = grid[ok]
        ax.bar([x + i * width for x in range(len(grid)) if ok.iloc[x]], 100 * g[f"pass_{c}"], width, label=c,
               yerr=frame_extents(g, f"pass_{c}", [f"{name}, {c}" for name, o in zip(labels, ok) if o], scale=100),
               capsize=2, error_kw={"lw": 0.8})
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(grid))], labels, rotation=45, ha="right", fontsize=8)
    ax.set(ylabel="pass rate, % (Wilson 95%)", title="Sensitive items passed, per category (greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
