"""The articles' claims on tensor and pipeline parallelism and memory per device (seeds/000 section 5.2, seeds/002,
seeds/003 sections 1.1 and 4.3), set against notebook 08's measurements and projections
(`lab.studies.parallelism`). Each row is a `lab.claims.claim_row`: the claim, the article's figure (with its seed
and section), what the lab measured or computed, the verdict and why. Every verdict on a number is
`lab.ledger.rules.verdict` on it (`lab.claims.judged`): the 40% all-reduce share against the span its unknown
latency allows, the memory figures as estimates within 2%, and the notebook's criteria for the qualitative claims
(TP=2 slower than TP=1, the bubble at most 20%) as `Bound`s."""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import pandas as pd

from lab import memory as mem
from lab.claims import NOT_CHECKABLE, Bound, Number, claim_row, judged

if TYPE_CHECKING:
    from lab.studies.parallelism import ParallelParams


def claims_table(p: ParallelParams, tp: pd.DataFrame, proj: pd.DataFrame, bubble: pd.DataFrame,
                 per_rank: pd.DataFrame) -> pd.DataFrame:
    """The articles' claims on parallelism and memory per device, one `lab.claims.claim_row` each."""
    rows = []
    one = proj[proj["batch"] == proj["batch"].min()].set_index("link")
    nv, pcie = one.loc["nvlink-h100x8"], one.loc["pcie5-h100x8"]
    # the share's span, NVLink to PCIe, is what the unknown all-reduce latency allows: the claim's interval
    share = (100 * nv["comm share"], 100 * pcie["comm share"])
    word, off = judged(Number("40", exact=False), share[0], share)
    rows.append(claim_row(
        "all-reduce takes up to 40% of a decode step with 8-way TP on a 70B model", "40% (seeds/000 §5.2)",
        f"{p.PROJECT_MODEL} at TP={p.PROJECT_TP}, batch {int(nv.batch)}, roofline step + alpha-beta collectives: "
        f"{100 * nv['comm share']:.0f}% on NVLink (alpha {nv.alpha_us:.0f} us assumed), "
        f"{100 * pcie['comm share']:.0f}% on PCIe; 40% needs an all-reduce latency of "
        f"{nv['alpha for 40% (us)']:.0f} us on NVLink", word,
        "; ".join(x for x in (off, "the span, NVLink to PCIe, is what the unknown all-reduce latency allows (a real "
                                   "step is longer than its roofline bound, which lowers the share)") if x)))
    dec = tp[(tp["phase"] == "decode")].sort_values("tokens").iloc[0]
    big = proj[proj["batch"] == proj["batch"].max()].set_index("link")
    rows.append(claim_row(
        "TP without fast links: communication eats the gain, even slower than one card", "slower (seeds/003 §4.3)",
        f"this machine (gloo over loopback): decode at batch {int(dec.tokens)} {dec['TP=1 ms']:.0f} ms at TP=1, "
        f"{dec['TP=2 ms']:.0f} ms at TP=2 ({100 * dec['comm share (measured)']:.0f}% in collectives); projected "
        f"PCIe at batch {int(big.loc['pcie5-h100x8', 'batch'])}: {100 * big.loc['pcie5-h100x8', 'comm share']:.0f}% "
        f"of the step, NVLink {100 * big.loc['nvlink-h100x8', 'comm share']:.0f}%",
        judged(Bound("1", above=False), dec["speedup"])[0],
        "here: TP=2 is slower than one process" if dec["speedup"] < 1 else "not here: TP=2 is faster"))
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


def plot_bubble(bubble: pd.DataFrame):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for phase, g in bubble.groupby("phase"):
        a.plot(g["micro_batches"], g["wait share (measured)"], "o-", label=f"{phase}: rank 0 waits (measured)")
        b.plot(g["micro_batches"], g["PP=2 ms"] / g["PP=1 ms"], "o-", label=phase)
    g = bubble.drop_duplicates("micro_batches")
    a.plot(g["micro_batches"], g["bubble (p - 1) / (m + p - 1)"], "k--", label="(p - 1) / (m + p - 1)")
    a.set_xscale("log", base=2)
    a.set_xlabel("micro-batches m (p = 2 stages)")
    a.set_ylabel("share of the step")
    a.set_title("the pipeline bubble")
    a.legend(fontsize=8)
    b.axhline(1, color="k", ls=":")
    b.set_xscale("log", base=2)
    b.set_xlabel("micro-batches m")
    b.set_ylabel("PP=2 step / PP=1 step")
    b.set_title("what the micro-batches cost")
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig
