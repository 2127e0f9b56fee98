"""The articles' claims on tensor and pipeline parallelism and memory per device (seeds/000 section 5.2, seeds/002,
seeds/003 sections 1.1 and 4.3), set against notebook 08's measurements and projections
(`lab.studies.parallelism`). Each row is a `lab.claims.table.claim_row`: the claim, the article's figure (with its seed
and section), what the lab measured or computed, the verdict and why. Every verdict on a number is
`lab.claims.rules.verdict` on it (`lab.claims.table.judged`): the 40% all-reduce share with Replay on (as seeds/000
says it: a plain TP decode step's share, in the projection table, is not its claim) against the span its unknown
latency allows, the memory figures as estimates within 2%, and the notebook's criteria for the qualitative claims
as `Bound`s (TP over a link without NVLink slower than one card, its collectives over half the step, the bubble at
most 20%). TP over a slow link is judged on the projection: on this machine TP=2 over gloo cannot beat TP=1 (two
processes share the 2 cores one uses), so its measurement is shown and decides nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import pandas as pd

from lab import memory as mem
from lab.claims.table import NOT_CHECKABLE, Bound, Number, claim_row, judged, shown
from lab.machine.hardware import GPUS
from lab.parallel.comm_model import LINKS, tp_comm_seconds, tp_decode_step
from lab.machine.roofline import model_cost, prefill_flops
from lab.figures.style import PALETTE, legend_outside

if TYPE_CHECKING:
    from lab.studies.parallelism.measure import ParallelParams


def claims_table(p: ParallelParams, tp: pd.DataFrame, proj: pd.DataFrame, bubble: pd.DataFrame,
                 per_rank: pd.DataFrame) -> pd.DataFrame:
    """The articles' claims on parallelism and memory per device, one `lab.claims.table.claim_row` each."""
    rows = []
    rows.append(_replay_row(p))
    rows += _slow_link_rows(p, tp, proj)
    pre = bubble[bubble["phase"] == "prefill"].sort_values("micro_batches")
    dec_b = bubble[bubble["phase"] == "decode"].sort_values("micro_batches")
    at = pre[pre["m >= 4p"]]
    row = at.iloc[0] if len(at) else pre.iloc[-1]
    rows.append(claim_row(
        "PP: micro-batches at least 4x the stages fill most of the bubble", "m >= 4p (seeds/003 §4.3)",
        f"PP=2, prefill: rank 0 waits {100 * row['wait share (measured)']:.0f}% at m={int(row.micro_batches)} "
        f"(the formula {100 * row['bubble (p - 1) / (m + p - 1)']:.0f}%; "
        f"{100 * pre.iloc[0]['wait share (measured)']:.0f}% at m=1); step {pre.iloc[0]['PP=2 ms']:.0f} -> "
        f"{row['PP=2 ms']:.0f} ms; decode step {dec_b.iloc[0]['PP=2 ms']:.0f} -> "
        f"{dec_b[dec_b['micro_batches'] == row.micro_batches]['PP=2 ms'].iloc[0]:.0f} ms",
        judged(Bound("0.2", above=False), row["wait share (measured)"])[0],
        "the bubble follows (p - 1) / (m + p - 1): m = 4p leaves 1/9 at p = 2, 18% at p = 8; but a micro-batch "
        "costs more than its share when it is small (decode), so more micro-batches can make the step slower"))
    rows.append(claim_row("TP inside a node of at most 8 cards; PP across nodes", "TP <= 8 (seeds/003 §4.3)",
                          "one machine of 2 cores here", NOT_CHECKABLE, "needs a multi-node cluster"))
    w70 = mem.weight_bytes(mem.ModelShape.preset("llama-3-70b"), "bf16")["total"]
    rows.append(claim_row("a 70B model in FP16 takes 140 GB", "140 GB (seeds/003 §1.1, seeds/002 §2.2)",
                          f"Llama-3-70B: {w70 / 1e9:.1f} GB", *judged(Number("140", exact=False), w70 / 1e9)))
    rank = per_rank["weight bytes"].max()
    word, note = judged(Number("17.5", exact=False), rank / 1e9)
    rows.append(claim_row(
        "140 GB in FP16 over 8 A100s with TP: 17.5 GB per card", "17.5 GB (seeds/002 §2.2)",
        f"Llama-3-70B at TP=8, the largest rank: {rank / 1e9:.2f} GB ({rank / mem.GIB:.1f} GiB) of weights, "
        f"KV {per_rank['KV bytes per token'].max() / 1024:.0f} KiB per token on top",
        word, "; ".join(x for x in (note, "weights only: the KV cache and activations come on top") if x)))
    rows.append(claim_row("8-card TP across nodes adds 10-15% to TTFT", "10-15% (seeds/002 §2.3)", "one machine here",
                          NOT_CHECKABLE, "needs two nodes"))
    return pd.DataFrame(rows)


REPLAY_WINDOW = 64  # seeds/000 §2.2's worked example replays a window of 64 tokens


def replay_step_shares(p: ParallelParams, window: int = REPLAY_WINDOW) -> dict[str, float]:
    """Per link, the collectives' share of a PROJECT_TP decode step of PROJECT_MODEL with Replay on (seeds/000
    §5.2): one sequence decodes its next token and recomputes a `window` of its own recent tokens in the same
    forward, so each all-reduce carries window + 1 tokens (the LM head gathers one row). The compute is the
    roofline's: the larger of a rank's weights and KV read at HARDWARE's bandwidth and its share of the window's
    FLOPs (linears and attention over the context) at its peak."""
    shape, hw = mem.ModelShape.preset(p.PROJECT_MODEL), GPUS[p.HARDWARE]
    cost, tokens = model_cost(shape, "bf16", "bf16"), window + 1
    flops = prefill_flops(cost, p.CONTEXT + tokens, cached=p.CONTEXT)
    out = {}
    for key, link in LINKS.items():
        read = tp_decode_step(shape, hw, p.PROJECT_TP, 1, p.CONTEXT, link).compute_s
        compute = max(read, flops / p.PROJECT_TP / hw.peak_flops)
        comm = tp_comm_seconds(shape, p.PROJECT_TP, tokens, link, logits_rows=1)[0]
        out[key] = comm / (compute + comm)
    return out


def _replay_row(p: ParallelParams) -> dict:
    """The 40% share as the article states it: with Replay on (「Replay 开启后」), projected over the span the
    unknown all-reduce latency allows (NVLink to PCIe), like the plain decode row."""
    shares = replay_step_shares(p)
    nv, pcie = 100 * shares["nvlink-h100x8"], 100 * shares[SLOW_LINK]
    rule = Number("40", exact=False)
    word, off = judged(rule, nv, (nv, pcie))
    return claim_row(
        "all-reduce takes up to 40% of a decode step with 8-way TP on a 70B model with Replay on "
        "(「Replay 开启后…通信占比高达 40%」)", "40% (seeds/000 §5.2)",
        f"{shown(nv, rule)}% [{shown(nv, rule)}, {shown(pcie, rule)}], NVLink to PCIe: {p.PROJECT_MODEL} at TP={p.PROJECT_TP}, one sequence at "
        f"{p.CONTEXT} tokens decoding a token and replaying a {REPLAY_WINDOW}-token window (seeds/000 §2.2's) in one "
        f"forward, roofline step + alpha-beta collectives of {REPLAY_WINDOW + 1} tokens", word,
        "; ".join(x for x in (off, "projected: the span, NVLink to PCIe, is what the unknown all-reduce latency "
                                   "allows") if x))


SLOW_LINK = "pcie5-h100x8"  # the link without NVLink the projection has
ONE_CARD = Bound("1", above=False)  # "even slower than one card": TP's speedup over one card under 1
MOST = Bound("50", above=True)  # "most of the compute": the collectives over half the step, in percent


def _slow_link_rows(p: ParallelParams, tp: pd.DataFrame, proj: pd.DataFrame) -> list[dict]:
    """TP over a link without NVLink (seeds/003 §4.3 and §7.1), projected: PROJECT_MODEL's decode step at PROJECT_TP
    (the roofline's step for a rank's share, plus the alpha-beta collectives) against the same model's roofline step
    on one card (as if it fit: PROJECT_TP times a rank's), and the collectives' share of the step. This machine's
    TP=2 over gloo is shown beside it, but cannot decide it: two processes on 2 cores share the cores one process
    already uses, so TP=2 cannot come out faster (it holds by construction)."""
    slow = proj[proj["link"] == SLOW_LINK].assign(
        speedup=lambda d: p.PROJECT_TP * d["compute ms"] / (d["compute ms"] + d["comm ms"]))
    worst, best = slow.loc[slow["speedup"].idxmin()], slow.loc[slow["speedup"].idxmax()]
    # the latency at which TP's step reaches one card's (PROJECT_TP x a rank's compute): alpha + the slack per
    # collective (the all-reduces and the LM head's gather), at the batch where it comes first
    alpha = (slow["alpha_us"] + 1e3 * ((p.PROJECT_TP - 1) * slow["compute ms"] - slow["comm ms"])
             / (slow["all-reduces"] + 1)).min()
    dec = tp[(tp["phase"] == "decode")].sort_values("tokens").iloc[0]
    here = (f"this machine (gloo over loopback, 2 cores): TP=2 {dec['speedup']:.2f}x TP=1 at batch {int(dec.tokens)}, "
            f"{100 * dec['comm share (measured)']:.0f}% in collectives")
    setting = (f"{p.PROJECT_MODEL} at TP={p.PROJECT_TP} over 8x H100 PCIe Gen5 without NVLink (roofline step + "
               f"alpha-beta collectives, alpha {worst['alpha_us']:.0f} us assumed)")
    rows = [claim_row(
        "TP without fast links: communication eats the gain, even slower than one card (没有高速互联硬上张量并行…"
        "甚至比单卡还慢)", "slower (seeds/003 §4.3)",
        f"{shown(worst['speedup'], ONE_CARD)}x one card at batch {int(worst.batch)} ({best['speedup']:.2f}x at batch "
        f"{int(best.batch)}): {setting}; slower than one card once an all-reduce takes over {alpha:.0f} us; {here}",
        *judged(ONE_CARD, worst["speedup"]))]
    rows[0]["note"] = "; ".join(x for x in (rows[0]["note"], (
        "projected: one card's step is the roofline's for the whole model, as if it fit; on this machine TP=2 "
        "cannot beat TP=1 (two processes share the cores one uses), so it decides nothing")) if x)
    share = 100 * slow["comm share"]
    top = slow.loc[share.idxmax()]
    rows.append(claim_row(
        "TP on a machine without fast links: communication eats most of the compute (通信开销能把大部分算力吃掉)",
        "most (seeds/003 §7.1)",
        f"{shown(share.max(), MOST)}% of the step in collectives at batch {int(top.batch)} ({share.min():.0f}% at "
        f"batch {int(slow.loc[share.idxmin()].batch)}): {setting}; NVLink at most "
        f"{100 * proj[proj['link'] != SLOW_LINK]['comm share'].max():.0f}%",
        *judged(MOST, share.max())))
    return rows


def plot_bubble(bubble: pd.DataFrame):
    """The pipeline's wait against micro-batches beside the (p - 1) / (m + p - 1) model, and what the micro-batches
    cost the step."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4))
    for i, (phase, g) in enumerate(bubble.groupby("phase")):
        a.plot(g["micro_batches"], 100 * g["wait share (measured)"], "o-", color=PALETTE[i],
               label=f"{phase}: rank 0 waits (measured)")
        b.plot(g["micro_batches"], g["PP=2 ms"] / g["PP=1 ms"], "o-", color=PALETTE[i], label=phase)
    g = bubble.drop_duplicates("micro_batches")
    a.plot(g["micro_batches"], 100 * g["bubble (p - 1) / (m + p - 1)"], "k--", label="model: (p - 1) / (m + p - 1)")
    a.set_xscale("log", base=2)
    a.set_xlabel("micro-batches m (p = 2 stages)")
    a.set_ylabel("share of the step spent waiting (%)")
    a.set_title("The pipeline bubble, measured against its model")
    legend_outside(a)
    b.axhline(1, color="k", ls=":", label="PP=1's step")
    b.set_xscale("log", base=2)
    b.set_xlabel("micro-batches m (p = 2 stages)")
    b.set_ylabel("PP=2 step / PP=1 step (x)")
    b.set_title("What the micro-batches cost the step")
    legend_outside(b)
    fig.tight_layout()
    return fig
