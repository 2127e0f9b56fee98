"""The deployment article's claims on constrained decoding (seeds/003, section 5.3), set against notebook 07's
measurements (`lab.studies.structured_output`), and the projection of the mask's cost to a GPU serving a
larger vocabulary.

The projection is a model, shown as one: the step is the roofline's lower bound for a decode step
(`lab.machine.roofline.decode_table`: weights and KV read once at the datasheet bandwidth), so the share it gives the
mask is an upper bound; the mask is filled on the host, one request after another as the lab's engine does,
at the fill time measured here scaled by the vocabulary (the bitmask's words grow with it; xgrammar's precomputed
masks make the fill depend on the grammar state more than on the vocabulary, so the scaling errs high); applying
it on the GPU is one small kernel, left out. An engine that fills the next step's masks while the GPU runs the
current forward (vLLM v1 overlaps them) hides the fill until it is longer than the step.

The article's 20-30% is the cost of a mask computed in full every step, before the precompilation it recommends, at
small batch: the lab brackets it between its two ways of computing a mask (xgrammar's precompiled fill, the naive
mask tried token by token) at batch 1, here and projected. Its nested-schema claim is about a finite state machine
and its vocabulary claim about the models in use, neither of which the lab's runs sample: those rows say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lab.claims.table import NOT_CHECKABLE, Bound, Range, claim_row, from_flag, judged
from lab.machine.hardware import GPUS, Hardware
from lab.stats.intervals import rate
from lab.memory import ModelShape
from lab.models.loader import preset_names
from lab.figures.style import PALETTE, error_extents, legend_outside

from lab.machine.roofline import decode_table, model_cost

if TYPE_CHECKING:
    from lab.studies.structured_output.measure import StructuredParams

PROJECT_BATCHES = (1, 8, 32, 128)
MASK_SHARE = Range("20", "30")  # seeds/003 §5.3: the mask's share of a step at small batch, in percent
CONTEXT = 2048  # tokens of context per sequence in the projected steps


def projection(p: StructuredParams, fill_s_per_row: float, naive_s_per_row: float, vocab_here: int,
               hardware: str | Hardware | None = None, batches=PROJECT_BATCHES, models=None) -> pd.DataFrame:
    """Per model and batch size: the roofline's decode step on the accelerator (bf16 weights and KV), the host's
    serial mask fill (the mean per row measured here, scaled by vocabulary), and the fill's share of a step that
    waits for it, or, overlapped with the forward, the part of it left uncovered; and the share the naive mask
    (every token tried against the grammar) would take. `hardware`: a `lab.machine.hardware.GPUS` name (default
    HARDWARE) or a measured `Hardware` (`lab.machine.hardware.probe_inference`: the device the run used)."""
    hw = hardware if isinstance(hardware, Hardware) else GPUS[hardware or p.HARDWARE]
    rows = []
    for name in models or p.PROJECT_MODELS:
        shape = ModelShape.preset(name)
        scale = shape.vocab_size / vocab_here
        for point in decode_table(hw, model_cost(shape, "bf16", "bf16"), CONTEXT, batches):
            fill, naive = point.batch * fill_s_per_row * scale, point.batch * naive_s_per_row * scale
            rows.append({"model": name, "vocabulary": shape.vocab_size, "hardware": hw.name, "batch": point.batch,
                         "step ms (roofline)": 1e3 * point.tpot_s, "mask fill ms (serial)": 1e3 * fill,
                         "share, serial": fill / (point.tpot_s + fill),
                         "share, overlapped": max(0.0, fill - point.tpot_s) / max(fill, point.tpot_s),
                         "share, naive mask": naive / (point.tpot_s + naive)})
    return pd.DataFrame(rows)


def claims_table(p: StructuredParams, validity: pd.DataFrame, summary: pd.DataFrame, components: pd.DataFrame,
                 depth: pd.DataFrame, compile_df: pd.DataFrame, proj: pd.DataFrame, vocab_here: int) -> pd.DataFrame:
    """One row per claim of seeds/003 section 5.3 (`lab.claims.table.claim_row`): the claim, the article's figure, what
    the lab measured, the verdict and why."""
    rows = []
    on = validity[validity["grammar"] == "on"]
    off = validity[validity["grammar"] == "off"]
    valid_all = bool((on["schema_valid"] == 1.0).all())
    rows.append(claim_row(
        "constrained decoding makes the format absolutely correct", "100% valid",
        "; ".join(f"T={r.temperature}: {rate(round(r.schema_valid * r.outputs), r.outputs)} schema-valid with the "
                  f"grammar, {rate(round(s.schema_valid * s.outputs), s.outputs)} without"
                  for r, s in zip(on.itertuples(), off.itertuples())),
        from_flag(valid_all), "for every output that finished" if valid_all else "outputs cut by max_tokens are "
        "unfinished prefixes (the grammar holds for every output that finished)"))
    g_on, g_off = on[on["temperature"] == 0].iloc[0], off[off["temperature"] == 0].iloc[0]
    # judged on the work to a valid answer (tokens, retries included), not on one run's seconds: a count, which the
    # machine's drift between two timed passes does not move
    fewer = g_on["tokens per valid answer"] / g_off["tokens per valid answer"]
    word, off_by = judged(Bound("1", above=False), fewer)
    rows.append(claim_row(
        "... and faster: a smaller search space and fewer retries (a retry costs more than any kernel tuning)",
        "faster", f"greedy, tokens to a valid answer, with over without the grammar: {fewer:.3f} "
        f"({g_on['tokens per valid answer']:.1f} against {g_off['tokens per valid answer']:.1f} tokens, retries "
        f"included); seconds {g_on['seconds per valid answer']:.3f} against {g_off['seconds per valid answer']:.3f} "
        f"(batch time per item / valid rate, one run)", word,
        "; ".join(x for x in (off_by, "part of it is format: the grammar writes compact JSON, the model alone "
                              "pretty-prints it and adds prose" if fewer < 1 else
                              "not here: the answers without the grammar are valid often enough, or shorter") if x)))
    rows += _mask_share_rows(summary, components, proj, vocab_here)
    rows += _mask_and_grammar_rows(components, depth, compile_df, vocab_here)
    return pd.DataFrame(rows)


FULL_MASK = ("computing the full mask every step takes 20-30% of a step at small batch "
             "(每步都全量算一遍掩码, 在小 batch 下…两三成)")
BRACKET = ("the article's full mask, computed every step before the precompilation it recommends, costs between the "
           "lab's two ways of computing one: xgrammar's precompiled fill (the fastest) and the naive mask, every token "
           "tried against the grammar one by one in Python (the slowest); a span across 20-30% decides nothing, a "
           "naive mask written in C would")


def _mask_share_rows(summary: pd.DataFrame, components: pd.DataFrame, proj: pd.DataFrame,
                     vocab_here: int) -> list[dict]:
    """The article's 20-30% at small batch (batch 1), here and projected to a GPU: the share of a step the full mask
    takes lies between the precompiled mask's and the naive mask's (`BRACKET`), which is the claim's interval; the
    naive mask, the article's way of computing it, is the point."""
    one = summary[summary["batch"] == summary["batch"].min()].iloc[0]
    naive_ms, step = 1e3 * components["naive_s"].median(), one["step without grammar ms"]
    fast, slow = 100 * one["mask share of step"], 100 * naive_ms / (step + naive_ms)
    word, off = judged(MASK_SHARE, slow, (fast, slow))
    rows = [claim_row(
        f"{FULL_MASK}: this machine, batch {int(one.batch)}", "20-30%",
        f"{slow:.1f}% [{fast:.1f}, {slow:.1f}] of a step (vocabulary {vocab_here:,}, batch {int(one.batch)}): from "
        f"xgrammar's precompiled mask, {one['mask ms per row']:.3f} ms a row of a {one['step with grammar ms']:.1f} ms "
        f"step, to the naive mask, {naive_ms:.1f} ms a state against a {step:.1f} ms step without the grammar; step "
        f"with / without the grammar {one['with / without']:.3f}x (span of {one['rounds']} runs "
        f"{one['ratio runs low']:.3f}-{one['ratio runs high']:.3f}"
        f"{'' if one['distinguishable'] else ', not distinguishable from 1'})",
        word, "; ".join(x for x in (off, BRACKET) if x))]
    small = proj[proj["batch"] == proj["batch"].min()].iloc[0]
    big = proj[proj["batch"] == proj["batch"].max()].iloc[0]
    fast, slow = 100 * small["share, serial"], 100 * small["share, naive mask"]
    word, off = judged(MASK_SHARE, slow, (fast, slow))
    rows.append(claim_row(
        f"(the same, projected) {FULL_MASK}: a 100k+ vocabulary on a GPU", "20-30%",
        f"{slow:.1f}% [{fast:.1f}, {slow:.1f}] at batch {small.batch}: {small.model} (vocabulary "
        f"{small.vocabulary:,}) on {small.hardware}, from xgrammar's precompiled fill, the host filling each mask in "
        f"turn ({fast:.1f}% at batch {small.batch}, {100 * big['share, serial']:.1f}% at batch {big.batch}; "
        f"{100 * big['share, overlapped']:.1f}% left when filled during the forward), to the naive mask (upper "
        f"bounds: the roofline's step)", word, "; ".join(x for x in (off, BRACKET) if x)))
    return rows


def _mask_and_grammar_rows(components: pd.DataFrame, depth: pd.DataFrame,
                           compile_df: pd.DataFrame, vocab_here: int) -> list[dict]:
    """The claims on how the mask is built (precompiled, nested schemas) and on vocabulary sizes."""
    naive = components.dropna(subset=["naive_s"])
    ratio = naive["naive_s"].median() / components["fill_s"].median()
    agree = bool(naive["naive_agrees"].all())
    apply_s, fill_s = components["apply_s"].median(), components["fill_s"].median()
    part = "more" if apply_s > fill_s else "less"  # measured: on a CPU the apply dominated the fill
    rows = [claim_row(
        "precompiling the state transitions reduces the mask to a lookup and a bitwise AND", "lookup",
        f"the naive mask (every token tried): {1e3 * naive['naive_s'].median():.1f} ms a state; xgrammar's "
        f"precomputed fill: {1e3 * components['fill_s'].median():.4f} ms ({ratio:.0f}x); applying it to the logits "
        f"{1e3 * apply_s:.3f} ms on the run's device ({part} than the fill); the two masks agree on "
        f"{int(naive['naive_agrees'].sum())} of {len(naive)} sampled states",
        from_flag(bool(ratio > 10 and agree)), "" if ratio > 10 and agree else
        "not measurably: the precomputed fill is not 10x faster than the naive mask" if agree else
        "the precomputed and the naive mask disagree on a sampled state")]
    d0, d1 = depth.iloc[0], depth.iloc[-1]
    slope = (float(np.polyfit(np.log(depth["depth"]), np.log(depth["compile ms"]), 1)[0]) if len(depth) > 1
             else float("nan"))  # the exponent of a power law through every depth
    tree = compile_df.set_index("grammar").loc["recursive tree ($ref)", "cold ms"]
    rows.append(claim_row(
        "deeply nested schemas make the state machine explode: limit the nesting depth (嵌套太深的状态机会爆炸)",
        "explodes", f"xgrammar's pushdown automaton: compile {d0['compile ms']:.1f} ms at depth {int(d0.depth)}, "
        f"{d1['compile ms']:.1f} ms at depth {int(d1.depth)} (~ depth^{slope:.2f}); fill along a valid instance "
        f"{d0['fill us median']:.1f} vs {d1['fill us median']:.1f} us (median); a recursive schema compiles in "
        f"{tree:.1f} ms", NOT_CHECKABLE,
        "the article means a finite state machine (a regex-style compiler unrolls every level and cannot express "
        "recursion); the lab's decoder compiles a pushdown automaton, whose stack takes nesting, so its cost says "
        "nothing of an FSM's: an FSM-based compiler's state count over the same depths would decide it"))
    # every preset of a released model (the toy test shape, "tiny", is none)
    vocabs = {m: ModelShape.preset(m).vocab_size for m in preset_names() if m != "tiny"}
    large = sum(v >= 100_000 for v in vocabs.values())
    rows.append(claim_row(
        "vocabularies run to a hundred thousand or more (词表动辄十几万)", "100k+",
        f"{large} of the lab's {len(vocabs)} model presets: " + ", ".join(f"{m}: {v:,}" for m, v in vocabs.items()),
        NOT_CHECKABLE, "a statement about which models are in use, which the lab's presets (chosen for other "
                       "studies) can illustrate but not sample: a census of the vocabularies of the most-used open "
                       "models would decide it"))
    return rows


def plot_mask_cost(summary: pd.DataFrame, components: pd.DataFrame):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(summary))
    a.bar(x - 0.2, summary["step without grammar ms"], 0.4, color=PALETTE[0], label="step without grammar")
    a.bar(x + 0.2, summary["step with grammar ms"], 0.4, color=PALETTE[1], label="step with grammar")
    a.bar(x + 0.2, summary["mask ms per step"], 0.4, label="of which: mask fill + apply", color="k", alpha=0.6)
    a.set_xticks(x, [str(b) for b in summary["batch"]])
    a.set_xlabel("decode batch (sequences)")
    a.set_ylabel("ms per decode step (median)")
    legend_outside(a)
    a.set_title("Decode step with and without the grammar")
    b.scatter(components["allowed"], 1e6 * components["fill_s"], s=6, color=PALETTE[0], label="fill (xgrammar)")
    b.scatter(components["allowed"], 1e6 * components["apply_s"], s=6, color=PALETTE[1], label="apply")
    b.set_xscale("symlog")
    b.set_yscale("log")
    b.set_xlabel("tokens the grammar state allows (symlog)")
    b.set_ylabel("us per row (log scale)")
    legend_outside(b)
    b.set_title("Mask cost per row, by grammar state")
    fig.tight_layout()
    return fig


def plot_validity(validity: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(9, 4))
    cols = ["whole_output_is_json", "schema_valid", "field accuracy"]
    labels = [f"T={r.temperature}, grammar {r.grammar}" for r in validity.itertuples()]
    x = np.arange(len(cols))
    width = 0.8 / len(validity)
    for i, (label, (_, r)) in enumerate(zip(labels, validity.iterrows())):
        vals = [r[c] for c in cols]
        yerr = error_extents(vals, [r[f"{c} 95% low"] for c in cols], [r[f"{c} 95% high"] for c in cols],
                             [f"{label}: {c}" for c in cols])
        ax.bar(x + i * width, vals, width, yerr=yerr, capsize=3, color=PALETTE[i], label=label)
    ax.set_xticks(x + width * (len(validity) - 1) / 2, ["whole output is JSON", "schema-valid", "field accuracy"])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("measure of the extraction's output")
    ax.set_ylabel("rate (Wilson 95% interval)")
    legend_outside(ax)
    ax.set_title("Extraction task: format and content, with and without the grammar")
    return fig
