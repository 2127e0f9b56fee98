"""Notebook 02's finding: the embedded model's weights are already on a 4-bit grid, so the cost of 4 bits is not
measurable on it; the quantizer ladder shows what each step away from its own grid costs, against the article's
"perplexity up a few tenths" (seeds/003 §2.2, 「涨个零点几」: +0.x in perplexity itself). On a user's 16-bit model
(issue 51) the sentence is the key claim's measurement: the best 4-bit method's perplexity change, with its
interval."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from lab.figures.style import PALETTE, claim_line, error_extents, finding_title, legend_outside
from lab.studies.findings import Finding, RunFiles

TENTHS = 1.0  # "up a few tenths": at most +1.0 in perplexity, the most the words allow


def _values(run: RunFiles) -> dict:
    m = run.metrics
    if not m.get("weights16"):
        return {"case": "grid", "bits": m["baseline_bits"], "ppl": f"{m['gguf-q4_1_w4g32_code_ppl_change_%']:+.1f}%"}
    # 16-bit weights: the key claim's own numbers (`stats.claims_table`): the best method at the checkpoint config,
    # on the first domain
    from lab.studies.quant_accuracy.stats import best_at, rise

    sens, domain = run.csv("sensitive_vs_perplexity"), _domains(run)[0]
    model = best_at(sens, run.parameters["CHECKPOINT_CONFIG"], domain)
    change = rise(sens, model, domain)
    return {"case": "weights16", "best": model, "domain": domain, "rise": f"{change.value:+.1f}%",
            "low": f"{change.low:+.1f}", "high": f"{change.high:+.1f}%"}


def _tenths(run: RunFiles) -> float:
    """"Up a few tenths" at its most (+1 in perplexity) as a % of this model's reference code perplexity."""
    return 100 * TENTHS / run.metrics["reference_code_perplexity"]


def _figure(run: RunFiles, title: str):
    weights16 = bool(run.metrics.get("weights16"))
    df = run.csv("ladder").iloc[::-1].reset_index(drop=True)  # GGUF Q4_1 (the model's own grid, if it has one) on top
    y = np.arange(len(df))
    fig = Figure(figsize=(9, 4.2))
    left, right = fig.subplots(1, 2, sharey=True)
    left.barh(y, df["weight_error_%"], color=PALETTE[0],
              xerr=error_extents(df["weight_error_%"], df["weight_error_%_low"], df["weight_error_%_high"]),
              label="_weight error")
    left.set_xlabel("weight error (% of the weight norm;\n95% bootstrap over layers)")
    left.set_yticks(y, df["rung"])
    left.set_ylabel("quantizer, step by step from " + ("GGUF Q4_1" if weights16 else "the model's own grid"))
    left.set_title("distance from the stored weights")
    change = "code_ppl_change_%"
    if weights16:
        # every rung costs something on 16-bit weights, and a change may be negative: a linear axis through 0
        right.barh(y, df[change], color=PALETTE[1], label="perplexity change (95% bootstrap)",
                   xerr=error_extents(df[change], df[f"{change}_low"], df[f"{change}_high"]))
        right.axvline(0, color="0.3", lw=0.8)
        right.set_xlabel("code perplexity change (%)")
    else:
        # on the model's own grid the first rungs cost exactly nothing, the last ones tens of %: a log axis
        exact = df[change] <= 0
        shown = df[~exact]
        right.barh(y[~exact], shown[change], color=PALETTE[1], label="perplexity change (95% bootstrap)",
                   xerr=error_extents(shown[change], shown[f"{change}_low"], shown[f"{change}_high"]))
        for yy in y[exact]:
            right.text(0.012, yy, "exact: +0.0%", va="center", transform=right.get_yaxis_transform(), fontsize=8)
        right.set_xscale("log")
        right.set_xlim(1, None)
        right.set_xlabel("code perplexity change (%, log scale)")
    claim_line(right, _tenths(run), f"article: perplexity up a few tenths (+{TENTHS:.0f} = {_tenths(run):.2g}%)",
               axis="x")
    right.set_title("what it costs")
    legend_outside(right)
    finding_title(fig, title, width=100)
    return fig


FINDING = Finding(
    "Is INT4 weight quantization free?",
    {"grid": "This model's decoder weights are already {bits}-bit: its own Q4_1 grid reproduces them exactly ({ppl} "
             "perplexity), so what 4 bits cost a 16-bit model cannot be measured on it.",
     "weights16": "On these 16-bit weights the best 4-bit method, {best}, moves {domain} perplexity by {rise} (95% over "
                  "documents: {low} to {high}); the article says up a few tenths."},
    _values, _figure, claim="perplexity barely moves under 4-bit weight quantization")


def _domains(run: RunFiles) -> tuple[str, ...]:
    return tuple(run.parameters["DOMAINS"])


def _grid(run: RunFiles):
    from lab.studies.quant_accuracy.plots import plot_grid

    return plot_grid(run.csv("grid"), run.csv("sensitive_vs_perplexity"), _domains(run))


def _pass_rates(run: RunFiles):
    from lab.studies.quant_accuracy.plots import plot_pass_rates

    return plot_pass_rates(run.csv("grid"))


def _ladder(run: RunFiles):
    from lab.studies.quant_accuracy.plots import plot_ladder

    return plot_ladder(run.csv("ladder"), _domains(run))


def _decomposition(run: RunFiles):
    from lab.studies.quant_accuracy.plots import plot_decomposition

    return plot_decomposition(run.csv("decomposition"), _domains(run))


# every other figure the notebook saves, redrawn from the run's files (tests/test_figures_committed.py)
FIGURES = {"grid": _grid, "pass_rates": _pass_rates, "ladder": _ladder, "decomposition": _decomposition}
