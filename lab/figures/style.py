"""The lab's shared plotting helpers: what every figure of the studies does the same way.

- `error_extents(value, low, high)`: matplotlib's `yerr` / `xerr` (distances below and above each point) from
  points and their interval ends, checked: a residue of rounding is clamped to 0, an interval that misses its
  point is refused by name, a NaN end (no interval) is no bar.
- `frame_extents(df, col)`: the same from a table's `col`, `col_low` and `col_high` columns.
- `PALETTE`: Okabe and Ito's colour-blind-safe colours, one per series (black and greys are left for reference
  lines); `legend_outside(ax)`: the legend to the right of the panel, off its data.

The standard every figure keeps is docs/plotting.md; `lab.figures.check` checks what a machine can of it.
"""

from __future__ import annotations

import numpy as np

# A point outside its interval by at most this much (relative to the point, absolute below 1) is rounding:
# a Wilson bound of 2.8e-17 at 0 of n, or a pooled ratio summed in another order than its bootstrap's.
ROUNDING = 1e-9

# Okabe and Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
# Their black is left out for claim and reference lines, and a brown added: eight colours, as many as a panel may
# hold series.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#8C564B")


def use_style() -> None:
    """Make `PALETTE` matplotlib's colour cycle (so "C0".."C7" and unstyled series take it) and keep legends
    small; `lab.workflow.run.start_run` calls it, so every notebook's figures start from the standard."""
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams["axes.prop_cycle"] = cycler(color=list(PALETTE))
    mpl.rcParams["legend.fontsize"] = 7
    mpl.rcParams["axes.titlesize"] = 10


def legend_outside(ax, **kw):
    """The panel's legend to its right, top-aligned, off the data (the figure grows to hold it when saved with
    bbox_inches="tight", as `Run.save_figure` does)."""
    return ax.legend(**({"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} | kw))


def error_extents(value, low, high, labels=None, scale: float = 1.0) -> np.ndarray:
    """A 2 x n array of non-negative distances below and above each point (`yerr` / `xerr` for matplotlib's
    `errorbar` and `bar`), times `scale` (100 for a rate drawn in percent).

    `value`, `low` and `high`: scalars or sequences (lists, arrays, pandas Series) of one length. A distance
    below 0 within rounding (`ROUNDING` of max(1, |value|)) is clamped to 0; beyond it the interval excludes
    its point, which a figure cannot draw and a table should not state, so it raises ValueError naming the row
    (its entry in `labels` when given, else its position), the point and the interval. A NaN end (no interval,
    e.g. one item) gives a NaN distance, which matplotlib draws as no bar.
    """
    v, lo, hi = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (value, low, high))
    if not v.ndim == lo.ndim == hi.ndim == 1 or not v.shape == lo.shape == hi.shape:
        raise ValueError(f"value, low and high need one length, got shapes {v.shape}, {lo.shape}, {hi.shape}")
    if labels is not None and len(labels) != v.size:
        raise ValueError(f"{len(labels)} labels for {v.size} points")
    below, above = v - lo, hi - v
    slack = ROUNDING * np.maximum(1.0, np.abs(v))
    with np.errstate(invalid="ignore"):  # NaN compares False: no interval is no miss
        missed = np.flatnonzero((below < -slack) | (above < -slack))
    if missed.size:
        i = missed[0]
        row = repr(list(labels)[i]) if labels is not None else str(i)
        raise ValueError(f"row {row}: the point {v[i]:.6g} lies outside its interval [{lo[i]:.6g}, {hi[i]:.6g}]"
                         f" ({missed.size} such row{'s' if missed.size > 1 else ''})")
    return scale * np.clip(np.stack([below, above]), 0.0, None)  # np.clip keeps NaN


def frame_extents(df, col: str, labels=None, scale: float = 1.0) -> np.ndarray:
    """`error_extents` of a table's `col` between its `col_low` and `col_high` columns (the way
    `lab.stats.intervals.Interval.columns` lays an interval into a row)."""
    return error_extents(df[col], df[f"{col}_low"], df[f"{col}_high"], labels=labels, scale=scale)


# A claim's band and line: grey and black, told apart from data series by colour and named in the legend, so that
# a reader sees the article's value beside the measurement (docs/plotting.md).
CLAIM_COLOUR = "0.2"


def claim_band(ax, low: float, high: float, label: str, axis: str = "y"):
    """The article's range `low`-`high` as a grey band across the panel (horizontal for `axis="y"`), labelled."""
    span = ax.axhspan if axis == "y" else ax.axvspan
    return span(low, high, color="0.85", zorder=0, label=label)


def claim_line(ax, value: float, label: str, axis: str = "y", style: str = "--"):
    """The article's (or a bound's) value as a labelled black line across the panel."""
    line = ax.axhline if axis == "y" else ax.axvline
    return line(value, color=CLAIM_COLOUR, linestyle=style, linewidth=1.2, label=label)


def finding_title(fig, sentence: str, width: int = 80) -> None:
    """The figure's title: the finding in one sentence, wrapped to `width` characters a line."""
    import textwrap

    # anchored at the figure's top edge by its bottom, so it sits above every panel's own title; a run saves
    # with bbox_inches="tight", which grows the canvas to hold it
    fig.suptitle("\n".join(textwrap.wrap(sentence, width)), fontsize=10, ha="left", x=0.02, y=1.0, va="bottom")
