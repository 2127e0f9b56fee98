"""Figures of the weight-quantization study (notebook 02): every point with its 95% interval, categories (models,
ladder rungs) in their order and never joined by lines, one colour per series from a colour-blind-safe palette."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.eval.sensitive import CATEGORIES
from lab.figures.style import error_extents, frame_extents

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


def _by_model(ax, labels: list[str], series: dict[str, tuple], xlabel: str, transform=lambda v: v):
    """One point per model (rows, top to bottom in the given order) and series with its interval, series offset
    within a row; `transform` maps values and interval ends alike (monotone)."""
    y = np.arange(len(labels))[::-1]
    height = 0.6 / max(len(series), 1)
    for i, (name, (v, lo, hi)) in enumerate(series.items()):
        v, lo, hi = (transform(np.asarray(a, dtype=float)) for a in (v, lo, hi))
        ax.errorbar(v, y + ((len(series) - 1) / 2 - i) * height, xerr=error_extents(v, lo, hi, labels), fmt="o",
                    ms=4, capsize=2, color=PALETTE[i], label=name)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(xlabel)


def plot_grid(grid: pd.DataFrame, sens: pd.DataFrame, domains: tuple[str, ...]):
    """Per model, in the grid's order (rows): perplexity as a ratio to the unquantized model's per domain (paired
    intervals over sequences; a log axis, on which the GGUF Q4_1 control of an already-Q4_1 model sits at exactly
    1 and a change within noise on either side of it), the mean KL per domain (log axis; the control's exact 0 is
    written in), and the share of all sensitive outputs changed (Wilson 95%; per category: `plot_pass_rates`)."""
    import matplotlib.pyplot as plt

    quant = grid.iloc[1:].reset_index(drop=True)
    labels = list(sens["model"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 5.2), sharey=True)
    _by_model(axes[0], labels, {d: _columns(sens, f"{d}_ppl_rise_%") for d in domains},
              "perplexity, quantized / unquantized (x, log scale)", transform=lambda v: 1 + v / 100)
    axes[0].set_xscale("log")
    low, high = axes[0].get_xlim()
    ticks = [t for t in (0.9, 1, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8, 16, 32) if low <= t <= high]
    axes[0].set_xticks(ticks, [f"{t:g}" for t in ticks])
    axes[0].xaxis.set_minor_locator(plt.NullLocator())
    axes[0].axvline(1.0, color="0.3", lw=0.8, label="_unchanged")
    axes[0].set_title("perplexity per held-out domain")
    axes[0].set_ylabel("model (method and configuration)")
    kl = {d: _columns(quant, f"{d}_kl_mean") for d in domains}
    zero = np.all([np.asarray(v, dtype=float) == 0 for v, _, _ in kl.values()], axis=0)
    _by_model(axes[1], labels, {d: tuple(np.where(zero, np.nan, np.asarray(a, dtype=float)) for a in cols)
                                for d, cols in kl.items()}, "mean KL(unquantized || quantized) (nats/token, log scale)")
    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(plt.NullFormatter())  # a narrow range labels minor ticks, which collide
    for yy in np.arange(len(labels))[::-1][zero]:
        axes[1].text(0.02, yy, "exactly 0", va="center", fontsize=7, transform=axes[1].get_yaxis_transform())
    axes[1].set_title("KL per held-out domain")
    changed = 100 * (1 - quant["same_output_all"])
    # the share changed is 1 - the share unchanged: its interval is the unchanged one's, mirrored
    _by_model(axes[2], labels, {"all sensitive items": (changed, 100 * (1 - quant["same_output_all_high"]),
                                                        100 * (1 - quant["same_output_all_low"]))},
              "greedy outputs changed (% of sensitive items, Wilson 95%)")
    axes[2].set_xlim(0, 100)
    axes[2].set_title("outputs changed")
    for ax in axes[:2]:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=len(domains))
    fig.suptitle("Each re-quantized model against the unquantized one (95% intervals: paired over sequences for "
                 "perplexity and KL)", fontsize=10)
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
    """Sensitive pass rate per model (rows, in the grid's order), one small multiple per category sharing the
    model axis, with Wilson intervals and the unquantized model's rate as the line each model is read against."""
    import matplotlib.pyplot as plt

    cats = [c for c in CATEGORIES if grid[f"pass_{c}"].notna().any()]
    labels = ["unquantized"] + [f"{m} {c}" for m, c in zip(grid["method"].iloc[1:], grid["config"].iloc[1:])]
    y = np.arange(len(grid))[::-1]
    fig, axes = plt.subplots(1, len(cats), figsize=(2.6 * len(cats) + 1.5, 5), sharey=True, squeeze=False)
    for i, (ax, c) in enumerate(zip(axes[0], cats)):
        ok = grid[f"pass_{c}"].notna().to_numpy()
        g = grid[ok]
        ax.errorbar(100 * g[f"pass_{c}"], y[ok], xerr=frame_extents(g, f"pass_{c}", [n for n, o in zip(labels, ok) if o],
                                                                    scale=100),
                    fmt="o", ms=4, capsize=2, color=PALETTE[i], label=f"{c} (Wilson 95%)")
        ax.axvline(100 * grid[f"pass_{c}"].iloc[0], color="0.3", ls="--", lw=0.9, label="unquantized")
        ax.set_xlim(-5, 105)
        ax.set(title=c.replace("_", " "), xlabel="pass rate (%)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    axes[0][0].set_yticks(y, labels, fontsize=8)
    axes[0][0].set_ylabel("model (method and configuration)")
    fig.suptitle("Sensitive items passed per category (greedy), against the unquantized model", fontsize=10)
    fig.tight_layout()
    return fig
