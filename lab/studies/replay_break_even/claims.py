"""The replay article's claims (seeds/000) against notebook 04 (`lab.studies.replay_break_even`): its numbers
recomputed for its 70B example on an H100, and what this machine's measured recomputes say of its claims about
them (recompute beats reading; its cost does not grow with the context; replay pays more the longer the context).

Every verdict is `lab.claims.rules.verdict` on the lab's number (`lab.claims.table.judged`); the one claim no number
decides is wrong by argument, its argument in the note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from lab.claims.table import BY_ARGUMENT, CLAIMS_COLUMNS, Bound, Number, claim_row, judged, shown
from lab.machine.hardware import GPUS
from lab.memory import ModelShape
from lab.replay.cost import LINKS, recompute_seconds, window_cost

if TYPE_CHECKING:
    from lab.studies.replay_break_even.measure import ReplayParams


TP_CARDS = 8  # the article's 70B in fp16 (141 GB of weights) over 8 H100s: the least that holds it with its KV
GROWTH_PREFIXES = (32768, 65536, 131072)  # the contexts the article's replay is about (§1.1, §4.1: 32K and more)
GROWTH_WINDOWS = (16, 32, 64)  # its windows (§3.1: 16-64 tokens)


def claims_table(p: ReplayParams, measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """The replay article's numbers (its 70B example: 80 layers, 8 KV heads of 128, d_model 8192, fp16, H100)
    beside the lab's recomputation, one `claim_row` each (the claim led by its section of seeds/000). Every
    verdict is `lab.claims.rules.verdict` on the lab's number: its own arithmetic (`Number(text)`) to its printed
    digit, an estimate (`Number(text, exact=False)`) within 2%, a comparison (`Bound`) strictly; the one claim
    no number decides is wrong by argument, the argument in its note."""
    s = ModelShape.preset("llama-3-70b")
    h100 = GPUS["h100-sxm"]
    per_layer = 2 * s.num_kv_heads * s.head_dim * 2
    kv_128k = s.num_layers * 131072 * per_layer
    article_w64 = 80 * 64 * (2 * 8192 * 128 + 64 * 128)
    article_w32 = 80 * 32 * (2 * 8192 * 128 + 32 * 128)
    full_w32 = window_cost(s, 32, 131072 - 32)
    # Its PD example: a 32K context; pulling the KV takes 2.9 ms, recomputing the last 64 tokens 0.4 ms.
    pd_cost = window_cost(s, 64, 32768 - 64)
    pd_recompute = max(recompute_seconds(s, pd_cost, h100, p.EFFICIENCY))
    # Each: the claim, what the article says, its number in the unit of the lab's as a rule (its own arithmetic,
    # or an estimate), the lab's number, the unit.
    rows = [
        _recomputed("§2.1: H100 ridge point (989 TFLOP/s / 3.35 TB/s)", "295 FLOPs/B", Number("295"),
                    h100.peak_flops / h100.mem_bandwidth, "FLOPs/B"),
        _recomputed("§1.1: KV per token per layer (8 KV heads x 128, fp16)", "8 KB", Number("8192"), per_layer, "B"),
        _recomputed("§2.2: recompute FLOPs of a 64-token window (its formula)", "10.7e9", Number("10.7e9"),
                    article_w64, "FLOPs", why=f"the last printed digit is off: {article_w64:.4g} prints as "
                                              f"{article_w64 / 1e9:.1f}e9"),
        _recomputed("§2.2: ... and of all the work a 64-token window needs (every layer's linears + attention, "
                    "M=32K)", "10.7e9", _estimate("10.7e9"), window_cost(s, 64, 32768).recompute_flops, "FLOPs"),
        _recomputed("§2.2: bytes of a 64-token window's KV (its 2.6 MB counts one KV head)", "2.6 MB", Number("2.6e6"),
                    window_cost(s, 64, 0).kv_bytes, "B"),
        _recomputed("§2.2: FLOPs per KV byte of the window (its 4,072)", "4072", Number("4072"),
                    window_cost(s, 64, 32768).flops_per_kv_byte, "FLOPs/B"),
        _recomputed("§2.2: KV read per decode step at 128K (its 5.4 GB counts one KV head)", "5.4 GB",
                    Number("5.4e9"), kv_128k, "B"),
        _recomputed("§2.2: time to recompute 32 tokens with its 5.38e9 FLOPs on an H100", "0.05 ms", Number("0.05"),
                    1e3 * article_w32 / h100.peak_flops, "ms"),
        _recomputed("§2.2: ... with the full work of 32 tokens after 128K (attention over the prefix included)",
                    "0.05 ms", _estimate("0.05"), 1e3 * full_w32.recompute_flops / h100.peak_flops, "ms"),
        _recomputed("§2.2: time to read 128K tokens' KV at 3.35 TB/s (its 5.4 GB)", "1.6 ms", Number("1.6"),
                    1e3 * 5.37e9 / h100.mem_bandwidth, "ms"),
        # per card of the TP=8 node the article's 70B needs (141 GB of fp16 weights fit no one 80 GB card): each card
        # holds one of the eight KV heads, an eighth of the read
        _recomputed("§2.2: ... the real 128K KV (8 KV heads), per card at TP=8", "1.6 ms", _estimate("1.6"),
                    1e3 * kv_128k / TP_CARDS / h100.mem_bandwidth, "ms",
                    why=f"a 70B in fp16 needs {TP_CARDS} cards; on one card the whole read would take "
                        f"{1e3 * kv_128k / h100.mem_bandwidth:.3g} ms"),
        _recomputed("§3.2: PD: recompute the last 64 tokens of a 32K context on the decode node (H100, 50%, weights "
                    "and prefix read)", "0.4 ms", _estimate("0.4"), 1e3 * pd_recompute, "ms"),
        _recomputed("§3.2: PD: pull the 32K context's KV from the prefill node over a 400 Gb/s link", "2.9 ms",
                    _estimate("2.9"), 1e3 * window_cost(s, 32768, 0).kv_bytes / LINKS["net-400g"].bandwidth, "ms"),
    ]
    receive_ms = 1e3 * pd_cost.kv_bytes / LINKS["net-400g"].bandwidth
    gain = receive_ms / (1e3 * pd_recompute)  # recomputing beats receiving when this exceeds 1
    rows.append(_compared("§3.2: PD: recompute the last 64 tokens rather than receive their KV", "recompute (0.4 ms)",
                          f"receive {receive_ms:.3g} ms over 400 Gb/s vs recompute {1e3 * pd_recompute:.3g} ms: "
                          f"receive / recompute {gain:.3g}", Bound("1"), gain, "receiving wins"))
    # Its self-diagnosis rule (§5.5): replay when the estimated KV read exceeds 1.2 x the estimated recompute of
    # W tokens at 50% efficiency. On its own 128K example, with the real KV and the full work of W = 32:
    read_s = kv_128k / h100.mem_bandwidth
    recompute_s = full_w32.recompute_flops / (0.5 * h100.peak_flops)
    rows.append(_compared("§5.5: self-diagnosis on its 128K example: replay pays (read > 1.2 x recompute at 50%)",
                          "yes (1.6 ms vs 0.08-0.12 ms)",
                          f"read {1e3 * read_s:.3g} ms vs recompute {1e3 * recompute_s:.3g} ms: read / recompute "
                          f"{read_s / recompute_s:.3g}", Bound("1.2"), read_s / recompute_s,
                          "the rule says do not replay"))
    # No number decides it: the window's attention reads every prefix position's K and V, whatever it recomputes.
    rows.append(claim_row("§2.2: replaying a window spares reading the prefix's KV",
                          "1.6 ms read vs 0.05 ms recompute",
                          f"the window's attention reads all {kv_128k / 1e9:.3g} GB of the prefix anyway", BY_ARGUMENT,
                          "the read is not avoided: each recomputed token attends to every prefix position, so the "
                          "window's attention reads the prefix's K and V whether or not its own KV is kept"))
    rows.extend(projected_growth_rows(s, h100, p.EFFICIENCY))
    if measured is not None and len(measured):
        rows.extend(measured_rows(measured))
    return pd.DataFrame(rows, columns=CLAIMS_COLUMNS)


def projected_growth(s: ModelShape, hw, efficiency: float, window: int,
                     prefixes: tuple[int, ...] = GROWTH_PREFIXES) -> float:
    """d log t / d log M of a standalone recompute of `window` tokens on `hw` (`lab.replay.cost`: the larger of its
    FLOPs at `efficiency` x peak and reading the weights plus the prefix's KV), over `prefixes`."""
    t = [max(recompute_seconds(s, window_cost(s, window, m), hw, efficiency)) for m in prefixes]
    return float(np.polyfit(np.log(prefixes), np.log(t), 1)[0])


def projected_growth_rows(s: ModelShape, hw, efficiency: float) -> list[dict]:
    """§2.2's "the recompute does not depend on M" and §4.1's "replay pays more the longer the context", for the
    article's own 70B on an H100 at 32K-128K (the cost model's growth: the weights' read is the constant, the
    prefix read and attention the growth); W = 64 is §2.2's window, the others its §3.1 range."""
    by_w = {w: projected_growth(s, hw, efficiency, w) for w in GROWTH_WINDOWS}
    e = by_w[64]
    where = (f"llama-3-70b on an H100 at {int(100 * efficiency)}% of peak, prefixes "
             f"{GROWTH_PREFIXES[0] // 1024}K-{GROWTH_PREFIXES[-1] // 1024}K, W = 64 "
             f"(W = {GROWTH_WINDOWS[0]}-{GROWTH_WINDOWS[-1]}: {min(by_w.values()):.3g} to {max(by_w.values()):.3g})")
    rule = Bound("0.5", above=False)
    word, off = judged(rule, e)
    rows = [claim_row("§2.2 (projected to its 70B): a recent window's recompute grows with the context M as",
                      "常数 (constant in M)", f"d log t / d log M {shown(e, rule)}: {where}", word,
                      "; ".join(x for x in (off, "the criterion: nearer 0 (constant) than 1 (the KV read of the whole "
                                                 "context); the constant is large (the weights' read), the growth "
                                                 "the prefix's KV read and attention") if x))]
    # against the window's own KV (what replay saves) the ratio grows like the recompute; against the whole context's
    # KV read (the article's frame) it falls by one power of M
    against_whole = e - 1.0
    rule = Bound("0", above=False)
    word, off = judged(rule, e)
    rows.append(claim_row(
        "§4.1 (projected to its 70B): replay pays more the longer the context, as", "≥32K，上下文越短，Replay越不划算",
        f"d log (recompute / load) / d log M against the window's own KV {shown(e, rule)}, against the whole "
        f"context's KV read {against_whole:.3g}: {where}", word,
        "; ".join(x for x in (off, "two readings of what replay is weighed against: the window's own KV, the bytes it "
                                   "saves, which do not grow with M; or the whole context's KV, as the article's §2.2 "
                                   "compares, which replay does not save (000-18)") if x)))
    return rows


def _estimate(text: str) -> Number:
    """An article's figure about a real model or device (modelling choices it does not state move it): 2%."""
    return Number(text, exact=False)


def _recomputed(claim: str, says: str, rule: Number, computed: float, unit: str, why: str = "") -> dict:
    """A `claim_row` for an article's number recomputed here, judged by `rule` (`lab.claims.table.judged`) and printed to
    at least the claim's precision, so the ledger reads back the verdict; by how much (and `why`, where the figure
    has a point worth stating) in the note."""
    word, off = judged(rule, computed)
    return claim_row(claim, says, f"{shown(computed, rule)} {unit}", word, "; ".join(n for n in (off, why) if n))


def _compared(claim: str, says: str, measured: str, rule: Bound, value: float, why_not: str) -> dict:
    """A `claim_row` for a comparison the article draws: `rule` on the ratio `value`; `why_not` when it fails."""
    word, off = judged(rule, value)
    return claim_row(claim, says, measured, word, "; ".join((off, why_not)) if off else "")


def prefix_growth(measured: pd.DataFrame) -> pd.Series:
    """Per (model, window): how the measured recompute time grows with the prefix M, d log t / d log M (the slope
    of a least-squares line through the log-log points): 0 for a cost that does not depend on M, 1 for one that
    grows like the KV read of the whole context."""
    out = {}
    for key, d in measured.groupby(["model", "window"], sort=False):
        if d["prefix"].nunique() >= 2:
            out[key] = float(np.polyfit(np.log(d["prefix"]), np.log(d["recompute_s"]), 1)[0])
    return pd.Series(out, dtype=float)


def measured_rows(measured: pd.DataFrame) -> list[dict]:
    """The article's claims that this machine's measured recomputes decide: recompute beats reading a window's KV
    (§3.1), a window's recompute does not grow with the context (§2.2), and replay pays more the longer the context
    (§4.1); the growth's figure is the median over (model, window) with the span of the others in brackets."""
    n = len(measured)
    wins = {tier: int((measured[f"load {tier} s"] > measured["recompute_s"]).sum())
            for tier in ("host memory", "disk file")}
    # the criterion: recomputing beats host memory at one measured point at least (the longest contexts included)
    word, _ = judged(Bound("0"), wins["host memory"])
    rows = [claim_row("§3.1: recomputing a recent window beats reading its KV on long contexts",
                      "yes, by an order of magnitude",
                      f"recompute faster than host memory in {wins['host memory']} of {n} measured points, "
                      f"than the disk file in {wins['disk file']} of {n}", word,
                      "on this machine: its engine against its host memory and disk")]
    growth = prefix_growth(measured)
    if growth.empty:
        return rows
    cells = f"over {len(growth)} (model, window) cells, prefixes {measured['prefix'].min()}-{measured['prefix'].max()}"
    e, lo, hi = growth.median(), growth.min(), growth.max()
    rule = Bound("0.5", above=False)  # nearer a constant (0) than the KV read of the whole context (1)
    word, off = judged(rule, e, (lo, hi))
    rows.append(claim_row(
        "§2.2: a recent window's recompute costs the same whatever the context length M", "常数 (constant in M)",
        f"d log t / d log M {shown(e, rule)} [{shown(lo, rule)}, {shown(hi, rule)}] {cells}", word,
        "; ".join(x for x in (off, "the criterion: nearer 0 (constant) than 1 (the KV read of the whole context); the "
                                   "window's attention reads and scores every prefix position") if x)))
    rule = Bound("0", above=False)  # paying more the longer the context: recompute / load falls with M
    word, off = judged(rule, e, (lo, hi))
    rows.append(claim_row(
        "§4.1: replay pays more the longer the context (the shorter, the less)", "≥32K，上下文越短，Replay越不划算",
        f"d log (recompute / load) / d log M {shown(e, rule)} [{shown(lo, rule)}, {shown(hi, rule)}] {cells}",
        word, "; ".join(x for x in (off, "the claim: recompute / load falls as M grows; load is the window's own KV, the "
                                         "bytes replay saves, which do not grow with M, while the recompute does; "
                                         "against reading the whole context's KV, as the article compares (§2.2), the "
                                         "read is not saved") if x)))
    return rows
