"""Notebook 03's finding: what each KV cache format costs in perplexity, against the 1% the lab reads as the
article's "safe" (notebook 03's SAFE_PPL_PCT; seeds/003 §2.3). The axis stops where FP8's interval is readable;
formats beyond it are marked at the edge with their value."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_line, error_extents, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles
from lab.studies.findings.words import against

FP8 = "fp8_e4m3/per-tensor"
SAFE_PPL_PCT = 1.0  # notebook 03's reading of "safe": the article gives no number (the ledger names the flip)
CLIP = 5.0  # the axis's right end, in percent: FP8's interval stays readable


def _values(run: RunFiles) -> dict:
    e = run.csv("end_to_end").set_index("format").loc[FP8]
    lo, hi = e["perplexity_change_pct_low"], e["perplexity_change_pct_high"]
    return {"v": f"{e['perplexity_change_pct']:+.2f}", "lo": f"{lo:+.2f}", "hi": f"{hi:+.2f}",
            "n": int(e["n_sequences"]), "rel": against(lo, hi, 0.0, SAFE_PPL_PCT)}


def _figure(run: RunFiles, title: str):
    df = run.csv("end_to_end")
    df = df[df["format"] != "exact"].sort_values("perplexity_change_pct").reset_index(drop=True)
    y = np.arange(len(df))
    v = df["perplexity_change_pct"]
    fig = Figure(figsize=(8, 3.8))
    ax = fig.add_subplot()
    ax.axvspan(0, SAFE_PPL_PCT, color="0.88", zorder=0, label=f"'safe': within {SAFE_PPL_PCT:g}% (the lab's reading)")
    claim_line(ax, SAFE_PPL_PCT, f"{SAFE_PPL_PCT:g}% (flips the FP8 verdict: the ledger names it)", axis="x")
    inside = v <= CLIP
    ax.errorbar(v[inside], y[inside], xerr=error_extents(v[inside], df["perplexity_change_pct_low"][inside],
                                                          df["perplexity_change_pct_high"][inside]),
                fmt="o", color=PALETTE[0], capsize=3, label=f"perplexity change (95% over {int(df['n_sequences'][0])} "
                                                             "sequences, paired)")
    for yy, value in zip(y[~inside], v[~inside]):
        ax.annotate(f"{value:+.1f}% ->", (CLIP, yy), ha="right", va="center", fontsize=8, color=PALETTE[5])
    ax.set_xlim(-0.5, CLIP)
    ax.set_yticks(y, df["format"])
    ax.set_xlabel("perplexity change against the exact cache (%)")
    ax.set_ylabel("KV cache format")
    legend_outside(ax)
    finding_title(fig, title)
    return fig


FINDING = Finding(
    "Is an FP8 KV cache safe, and which KV formats hold up?",
    "On this 135M model an FP8 KV cache raised perplexity {v}% (95% over {n} sequences: {lo} to {hi}), {rel} the 1% "
    "the lab reads the article's 'safe' as.", _values, _figure, claim="FP8 (e4m3, calibrated per-tensor scale) is safe")


def _growth(roles: bool, title: str):
    def draw(run: RunFiles):
        from lab.studies.kv_quantization import plot_growth

        growth = run.csv("error_by_position")
        is_role = growth["format"].str.endswith(("k-only", "v-only"))
        return plot_growth(growth[is_role if roles else ~is_role], title)
    return draw


def _roles(run: RunFiles):
    from lab.studies.kv_quantization import plot_roles

    return plot_roles(run.csv("k_vs_v"))


def _end_to_end(run: RunFiles):
    from lab.studies.kv_quantization import plot_end_to_end

    return plot_end_to_end(run.csv("end_to_end"), run.csv("concurrency"))


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"error_growth": _growth(False, "K and V quantized"), "k_vs_v": _roles,
           "k_vs_v_growth": _growth(True, "keys only or values only quantized"), "end_to_end": _end_to_end}
