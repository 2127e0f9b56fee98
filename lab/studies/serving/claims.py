"""Notebook 06's claims table: the serving claims of seeds/002 and seeds/003 that its load runs measure.

One `lab.claims.table.claim_row` per claim, its verdict from the ledger's rules on the run-level spread of the ratio it
rests on (`lab.claims.across_runs`: the compared settings back to back in each of REPEATS runs, min to max over
at least three): prefix caching's cut of TTFT P50 with a shared system prompt (seeds/002 §6.2, seeds/003 §3.3) and
with random prompts (seeds/002 §6.2), what fixed request lengths overstate against log-normal ones
(seeds/003 §6.2), the stall a long prefill puts on running decodes that chunked prefill removes (seeds/003 §3.2),
and the knee of the concurrency ramp (seeds/003 §6.2). A cut is 1 - TTFT P50 with caching / without, in percent.
"""

from __future__ import annotations

import pandas as pd

from lab.claims.table import NOT_CHECKABLE, Bound, Number, Range, claim_row, judged
from lab.claims.across_runs import MIN_RUNS, judged_runs, spread, text

# "一大截" (a big chunk) read as more than a quarter off; "严重高估" (seriously overestimate) as by more than a fifth
BIG_CHUNK, SERIOUS = Bound("25"), Bound("1.2")
# "停顿" (a stall) that chunked prefill removes: the largest gap longer with chunking off than on
STALL = Bound("1")
# "完全失效" (fails entirely): none of the system prompt served from the cache
ENTIRELY = Number("0")


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


def stall_ratios(chunked: pd.DataFrame) -> pd.Series:
    """Per run, the running requests' largest inter-token gap (P99 over requests) with chunked prefill off over on."""
    t = chunked.pivot(index="repeat", columns="chunked_prefill", values="max_gap_p99")
    return t[False] / t[True]


def top_doubling(ramp: pd.DataFrame, metric: str) -> pd.Series:
    """Per pass of the ramp, `metric` at its highest concurrency over the level below it (a doubling)."""
    t = ramp.pivot(index="repeat", columns="concurrency", values=metric).sort_index(axis=1)
    return t.iloc[:, -1] / t.iloc[:, -2]


def timestamp_row(dynamic: pd.DataFrame) -> dict:
    """seeds/003 §3.3's "a timestamp inserted in the middle defeats the prefix cache entirely", on the engine's
    counts (`serving.dynamic_prefix`): exact, so no interval; "entirely" is 0% of the system prompt cached."""
    half = dynamic.set_index("timestamp").loc["halfway"]
    share = half["cached_share_of_system_prompt_%"]
    word, note = judged(ENTIRELY, share)
    start = dynamic.set_index("timestamp").loc["at the start", "cached_share_of_system_prompt_%"]
    return claim_row("dynamic content such as a timestamp inserted into the prompt defeats the prefix cache entirely "
                     "(「中间插入了动态内容比如时间戳就完全失效」)", "entirely (seeds/003 §3.3)",
                     f"{share:.1f}% of a {int(half['system_prompt_tokens'])}-token system prompt served from the cache "
                     f"with a timestamp inserted halfway ({int(half['cached_tokens'])} tokens; {start:.1f}% with it "
                     f"at the start)", word,
                     "; ".join(x for x in (note, "counts on the lab engine's block-hashed prefix cache: the full "
                                           "blocks before the change still hit") if x))


def serving_rows(chunked: pd.DataFrame, ramp: pd.DataFrame, knee_gain: float, served: str, op: int,
                 budgets: tuple[int, int]) -> list[dict]:
    """The chunked-prefill stall (seeds/003 §3.2, at `op` requests in flight) and the ramp's knee (seeds/003 §6.2).
    `served`: the model and device in words; `budgets`: the batched tokens a step takes with chunking on and off."""
    levels = sorted(ramp["concurrency"].unique())[-2:]
    tpot = spread(top_doubling(ramp, "tpot_p50"))
    flattens = Bound(f"{1 + knee_gain:g}", above=False)
    knee = _row("raising concurrency, throughput flattens at a knee while TPOT worsens fast "
                "(「开始走平甚至下降同时 TPOT 快速恶化」)", "a knee (seeds/003 §6.2)",
                f"{served}, closed loop: output throughput at {levels[1]} in flight over {levels[0]} "
                f"(TPOT P50 {tpot.median:.2f}x), x", flattens, top_doubling(ramp, "output_throughput"),
                f"'flattens' read as under {knee_gain:.0%} more throughput for the top doubling of concurrency, the "
                f"notebook's knee rule (KNEE_GAIN)")
    gains = spread(top_doubling(ramp, "output_throughput"))
    if gains.n >= MIN_RUNS and gains.lo > 1 + knee_gain:  # every pass still gains at its top: no knee reached yet
        knee = claim_row(knee["claim"], knee["article"], knee["measured here"], NOT_CHECKABLE,
                         f"the ramp stopped before its knee: every pass still gains more than {knee_gain:.0%} at its "
                         f"top doubling, and a finite ramp cannot show that no knee exists; a ramp to more requests "
                         f"in flight (CONCURRENCY) decides it")
    return [
        _row("too many batched tokens let one long prefill stall the running decodes; chunked prefill slots it into "
             "their gaps (「打字突然停顿」)", "stall (seeds/003 §3.2)",
             f"{served}, {op} in flight, long prompts mixed in: the running requests' largest inter-token gap (P99) with chunked "
             f"prefill off ({budgets[1]} batched tokens) over on ({budgets[0]}), x", STALL, stall_ratios(chunked),
             "a stall that chunking removes shows as a ratio above 1 in every run (the rule)"),
        knee,
    ]


def claims_table(prefix: pd.DataFrame, shapes: pd.DataFrame, system_prompt: int, where: str,
                 serving: list[dict] = ()) -> pd.DataFrame:
    """The claims table of notebook 06 from its `prefix_caching` and `length_shapes` tables, followed by the rows
    of `serving_rows`; `system_prompt` is the shared prefix's tokens and `where` the setting in words (model,
    device, operating concurrency)."""
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
    return pd.DataFrame(rows + list(serving))
