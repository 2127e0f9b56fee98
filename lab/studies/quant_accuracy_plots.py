"""Figures of the weight-quantization study (notebook 02): every point with its 95% interval, categories (models,
ladder rungs) in their order and never joined by lines, one colour per series from a colour-blind-safe palette."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.eval.sensitive import CATEGORIES
from lab.plots import error_extents, frame_extents

# Okabe and Ito's colour-blind-safe palette, black left out (the reference lines are black).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
# Perplexity changes run from exactly 0 (the control) to a few hundred percent: linear within 1%, log beyond.
LINEAR_WITHIN = 1.0


def _dodged(ax, labels: list[str], series: dict[str, tuple], ylabel: str, linthresh: float = LINEAR_WITHIN,
            floor: float | None = None, xlabel: str = "model (method and configuration)"):
    """One point per category and series with its interval, series side by side, categories in the given order
    and never joined; `series`: name -> (values, low, high); `floor`: the axis's bottom (0 for a quantity that
    cannot be negative)."""
    width = 0.7 / max(len(series), 1)
    for i, (name, (v, lo, hi)) in enumerate(series.items()):
        x = np.arange(len(labels)) + (i - (len(series) - 1) / 2) * width
        ax.errorbar(x, v, yerr=error_extents(v, lo, hi, [f"{c}, {name}" for c in labels]), fmt="o", ms=4,
                    capsize=3, color=PALETTE[i], label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_xlabel(xlabel)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=linthresh)
    ax.set_ylabel(ylabel)
    lowest = min(float(np.nanmin(np.asarray(lo, dtype=float), initial=0.0)) for _, lo, _ in series.values())
    ax.set_ylim(bottom=floor if floor is not None else 2 * lowest if lowest < 0 else -linthresh / 2)


def _columns(df: pd.DataFrame, col: str) -> tuple:
    return df[col], df[f"{col}_low"], df[f"{col}_high"]


def plot_grid(grid: pd.DataFrame, sens: pd.DataFrame, domains: tuple[str, ...]):
    """Per model, in the grid's order: the perplexity change against the unquantized model per domain (paired
    intervals over sequences; the GGUF Q4_1 control of an already-Q4_1 model sits at exactly 0), the KL per domain,
    and the share of sensitive outputs changed per category."""
    import matplotlib.pyplot as plt

    quant = grid.iloc[1:]
    labels = list(sens["model"])
    cats = [c for c in CATEGORIES if quant[f"pass_{c}"].notna().any()]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    _dodged(axes[0], labels, {d: _columns(sens, f"{d}_ppl_rise_%") for d in domains},
            "perplexity change vs unquantized, % (symlog)")
    axes[0].set_title("Perplexity change of each re-quantized model, per held-out domain")
    _dodged(axes[1], labels, {d: _columns(quant, f"{d}_kl_mean") for d in domains},
            "mean KL(unquantized || quantized), nats/token (symlog)", linthresh=0.01, floor=0)
    axes[1].set_title("KL against the unquantized model, per domain")
    width = 0.8 / max(len(cats), 1)
    for i, c in enumerate(cats):
        changed = 100 * (1 - quant[f"same_output_{c}"])
        # The share changed is 1 - the share unchanged, so its interval is the unchanged one's, mirrored.
        yerr = (None if f"same_output_{c}_low" not in quant else
                np.abs(np.vstack([changed - 100 * (1 - quant[f"same_output_{c}_high"]),
                                  100 * (1 - quant[f"same_output_{c}_low"]) - changed])))
        axes[2].bar([x + i * width for x in range(len(quant))], changed, width, label=c, yerr=yerr,
                    color=PALETTE[i], capsize=2, error_kw={"lw": 0.8})
    axes[2].set_xticks([x + 0.4 - width / 2 for x in range(len(quant))], labels, rotation=45, ha="right", fontsize=7)
    axes[2].set_xlabel("model (method and configuration)")
    axes[2].set(ylabel="% of greedy outputs changed (Wilson 95%)",
                title="Sensitive items: outputs changed vs unquantized")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_ladder(ladder: pd.DataFrame, domains: tuple[str, ...]):
    """`quant_accuracy_ladder.ladder_table`: each rung's relative weight error (interval over decoder layers) and
    perplexity change against the unquantized model per domain (paired intervals over sequences), rungs in order."""
    import matplotlib.pyplot as plt

    labels = list(ladder["rung"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    _dodged(axes[0], labels, {"all decoder linears": _columns(ladder, "weight_error_%")},
            "relative weight error ||W_q - W|| / ||W||, % (symlog)", floor=0,
            xlabel="quantizer rung (one change at a time)")
    axes[0].set_title("Weight error, one quantizer change at a time")
    _dodged(axes[1], labels, {d: _columns(ladder, f"{d}_ppl_change_%") for d in domains},
            "perplexity change vs unquantized, % (symlog)", xlabel="quantizer rung (one change at a time)")
    axes[1].set_title("Perplexity change, one quantizer change at a time")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_decomposition(decomp: pd.DataFrame, domains: tuple[str, ...]):
    """Per model and domain, its perplexity change split into the part at 4 bits with its group size (on an
    already-4-bit model: the grid) and the part from fewer levels, each with its paired interval; the two multiply
    to the whole: (1 + grid)(1 + levels) = 1 + total."""
    import matplotlib.pyplot as plt

    labels = list(decomp["model"])
    fig, axes = plt.subplots(1, len(domains), figsize=(7 * len(domains), 4.5), squeeze=False)
    for ax, d in zip(axes[0], domains):
        parts = {"at 4 bits, same group (grid)": _columns(decomp, f"{d}_grid_%"),
                 "from fewer bits (levels)": _columns(decomp, f"{d}_levels_%")}
        _dodged(ax, labels, parts, "perplexity change, % (symlog)")
        ax.set_title(f"Where each model's perplexity change comes from ({d})")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
               color=PALETTE[i], capsize=2, error_kw={"lw": 0.8})
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(grid))], labels, rotation=45, ha="right", fontsize=8)
    ax.set(xlabel="model (method and configuration)", ylabel="pass rate, % (Wilson 95%)",
           title="Sensitive items passed, per category (greedy)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
