"""Notebook 06's claims table: the serving claims of seeds/002 and seeds/003 that its load runs measure.

One `lab.claims.claim_row` per claim, its verdict from the ledger's rules on the run-level spread of the ratio it
rests on (`lab.run_level`: the compared settings back to back in each of REPEATS runs, min to max over
at least three): prefix caching's cut of TTFT P50 with a shared system prompt (seeds/002 §6.2, seeds/003 §3.3) and
with random prompts (seeds/002 §6.2), and what fixed request lengths overstate against log-normal ones
(seeds/003 §6.2). A cut is 1 - TTFT P50 with caching / without, in percent.
"""

from __future__ import annotations

import pandas as pd

from lab.claims import Bound, Range, claim_row
from lab.run_level import judged_runs, spread, text

# "一大截" (a big chunk) read as more than a quarter off; "严重高估" (seriously overestimate) as by more than a fifth
BIG_CHUNK, SERIOUS = Bound("25"), Bound("1.2")


def prefix_cuts(prefix: pd.DataFrame, prompts: str) -> pd.Series:
    """Per run, the cut of TTFT P50 by prefix caching (percent) under the load of `prompts` (`serving.PROMPTS`)."""
    t = prefix[prefix["prompts"] == prompts].pivot(index="repeat", columns="prefix_caching", values="ttft_p50")
    return 100 * (1 - t[True] / t[False])


def _hit(prefix: pd.DataFrame, prompts: str) -> float:
    on = prefix[(prefix["prompts"] == prompts) & prefix["prefix_caching"]]
    return 100 * float(on["hit_rate"].median())


def _row(claim: str, says: str, measured: str, rule, values, why: str) -> dict:
    s = spread(values)
    word, note = judged_runs(rule, s)
    return claim_row(claim, says, f"{measured}: {text(s, rule)}", word, "; ".join(x for x in (note, why) if x))


def claims_table(prefix: pd.DataFrame, shapes: pd.DataFrame, system_prompt: int, where: str) -> pd.DataFrame:
    """The claims table of notebook 06 from its `prefix_caching` and `length_shapes` tables; `system_prompt` is the
    shared prefix's tokens and `where` the setting in words (model, device, operating concurrency)."""
    shared, rand = prefix_cuts(prefix, "shared system prompt"), prefix_cuts(prefix, "random prompts")
    on_shared = f"{where}, a {system_prompt}-token shared system prompt ({_hit(prefix, 'shared system prompt'):.0f}% " \
                f"of prompt tokens hit): TTFT P50 with prefix caching against without, % lower"
    on_random = f"{where}, random prompts ({_hit(prefix, 'random prompts'):.1f}% hit): TTFT P50 with prefix caching " \
                f"against without, % lower"
    under_load = "under load, TTFT is queueing as well as prefill, and caching shortens both"
    fixed = shapes[shapes["lengths"] == "fixed at P50"]
    mean = shapes[shapes["lengths"] == "fixed at the mean"]["goodput_requests_vs_lognormal"].median()
    rows = [
        _row("KV reuse with a fixed system prompt lowers TTFT a further 30-50% (「首字延遲進一步降低30%-50%」)",
             "30-50% (seeds/002 §6.2)", on_shared, Range("30", "50"), shared, under_load),
        _row("with random inputs, enabling KV reuse still lowers TTFT by about 10-20% through paging "
             "(「延遲降低約10%-20%」)", "10-20% (seeds/002 §6.2)", on_random, Range("10", "20"), rand,
             "random prompts share no prefix to reuse; the engine pages its KV cache either way, so what is "
             "compared is prefix caching alone"),
        _row("prefix caching cuts TTFT by a big chunk with a long fixed system prompt (「首包时间能降一大截」)",
             "substantially (seeds/003 §3.3)", on_shared, BIG_CHUNK, shared,
             f"'a big chunk' read as more than a quarter off (the rule); {under_load}"),
        _row("fixed-length load tests seriously overestimate performance (「用固定长度压测会严重高估性能」)",
             "overestimate (seeds/003 §6.2)",
             f"{where}: goodput (requests/s within the SLO) with every length fixed at the P50 over the log-normal's "
             f"(fixed at the log-normal's mean, the same tokens: {mean:.2f}x, run median), x", SERIOUS,
             fixed["goodput_requests_vs_lognormal"],
             "'seriously' read as by more than a fifth (the rule); the P50 is what a quick benchmark fixes, and the "
             "run at the mean separates the spread of lengths from their volume"),
    ]
    return pd.DataFrame(rows)
