"""The deployment article's claims on speculative decoding (seeds/003, section 5), checked (notebook 05).

Its worked numbers are recomputed with `lab.spec.theory`; its claims about acceptance by task, the draft cost
ratio c and the cost of verification are set against the main run of `lab.studies.spec_acceptance` (its
per-category table and step costs). Each row says what the article claims, what the lab computes or measures,
and whether the claim holds (True, False, or None where it cannot be checked here or where the measurement's 95%
interval over prompts straddles the claim's value: the verdict then says "not distinguishable"). A measured
figure is printed as "value [low, high]", the form the claims ledger reads (`lab.ledger.rules.parse_lab`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from lab.intervals import NOT_DISTINGUISHABLE, Interval
from lab.spec.drafters import weight_bytes_ratio
from lab.spec.measure import StepCosts
from lab.spec.speculator import SpeculativeConfig
from lab.spec.theory import best_k, expected_tokens_per_round, predicted_speedup

if TYPE_CHECKING:
    from lab.studies.spec_acceptance import SpecParams


def quantized_c_bound(p: SpecParams, model) -> float:
    """The c a bandwidth-bound int-DRAFT_BITS GEMM would give the quantized copy (bytes read per step)."""
    return weight_bytes_ratio(p.DRAFT_BITS, SpeculativeConfig.draft_group_size, model)  # the copy's group size


# The c range's verdict by where c_effective's interval lies (the ledger reads "within" and "wrong" as holds and
# wrong through the holds column; lab.ledger.rules.from_notebook).
C_RANGE = {"inside": "within", "below": "wrong: far below the range (the range does not describe this drafter)",
           "above": "wrong on this engine: a draft forward's fixed cost does not shrink with its size",
           NOT_DISTINGUISHABLE: f"{NOT_DISTINGUISHABLE}: the interval straddles an end of the range"}
HOLDS_BY_SIDE = {"inside": True, "below": False, "above": False, NOT_DISTINGUISHABLE: None}


def range_verdict(iv: Interval, lo: float | None, hi: float | None) -> str:
    """'inside', 'below', 'above' (the whole interval on that side of the range [lo, hi]; None: an open end),
    or 'not distinguishable' (it straddles an end); 'not measured' when there is no value (no rounds)."""
    if iv.value != iv.value:
        return "not measured"
    if (hi is not None and iv.low > hi) or (lo is not None and iv.high < lo):
        return "above" if hi is not None and iv.low > hi else "below"
    if (lo is None or iv.low >= lo) and (hi is None or iv.high <= hi):
        return "inside"
    return NOT_DISTINGUISHABLE


def _interval(row, name: str) -> Interval:
    """`name` of a table row with its `_low` / `_high` columns (the point alone where they are NaN: no rounds)."""
    value, low, high = float(row[name]), float(row[f"{name}_low"]), float(row[f"{name}_high"])
    return Interval(value, value, value) if low != low or high != high else Interval(value, low, high)


def _bracketed(iv: Interval, fmt: str = ".3g") -> str:
    """"v [low, high]": the form `lab.ledger.rules.parse_lab` reads a number and its interval from."""
    return f"{iv.value:{fmt}} [{iv.low:{fmt}}, {iv.high:{fmt}}]"


def _all_inside(sides: list[str]) -> bool | None:
    """True when every interval is inside its range, False when one lies wholly outside, else None."""
    return True if all(x == "inside" for x in sides) else None if all(x in ("inside", NOT_DISTINGUISHABLE)
                                                                       for x in sides) else False


def claims_table(main: pd.DataFrame, costs: dict[str, StepCosts], p: SpecParams, model) -> pd.DataFrame:
    """The deployment article's section 5 numbers, recomputed or measured here. `holds`: True, False, or None
    where the claim cannot be checked here or the interval does not decide it."""
    cats = main[main["category"] != "all"]
    overall = main[main["category"] == "all"].set_index("drafter")
    rows = []

    def add(claim, ours, verdict, holds):
        rows.append({"article (seeds/003 section 5)": claim, "recomputed or measured": ours, "verdict": verdict,
                     "holds": holds})

    e, s = expected_tokens_per_round(0.7, 4), predicted_speedup(0.7, 4, 0.05)
    ok = abs(e - 2.77) < 0.01 and abs(s - 2.3) < 0.05
    add("a=0.7, k=4, c=0.05: E = 2.77 tokens, cost 1.2, speedup ~2.3x", f"E = {e:.3f}, speedup = {s:.3f}",
        "arithmetic right" if ok else "arithmetic wrong", ok)
    e, s = expected_tokens_per_round(0.5, 4), predicted_speedup(0.5, 4, 0.05)
    ok = abs(e - 1.94) < 0.01 and abs(s - 1.6) < 0.05
    add("a=0.5: E = 1.94, speedup ~1.6x", f"E = {e:.3f}, speedup = {s:.3f}",
        "arithmetic right" if ok else "arithmetic wrong", ok)
    s4, kb = predicted_speedup(0.4, 4, 0.05), best_k(0.4, 0.05)
    add("a below 0.4 is hardly worth it", f"a=0.4, c=0.05: {s4:.2f}x at k=4, {predicted_speedup(0.4, kb, 0.05):.2f}x "
        f"at the best k={kb}", "by its own formula a=0.4 still gives >1.3x at c=0.05: the cut-off depends on c "
        "and the verification cost, not on a alone", s4 < 1.1)
    for name in costs:
        c_eff, c_fwd = _interval(overall.loc[name], "c_effective"), costs[name].c
        side = range_verdict(c_eff, 0.03, 0.1)
        add(f"draft cost ratio c is typically 0.03-0.1 ({name})",
            f"c_effective = {_bracketed(c_eff)}" + (f", c_forward = {c_fwd:.3g}" if c_fwd is not None else ""),
            C_RANGE[side], HOLDS_BY_SIDE[side])
    if "quantized" in overall.index:
        add("(no claim) a weight-quantized copy as draft", f"c of a bandwidth-bound int{p.DRAFT_BITS} kernel: "
            f"{quantized_c_bound(p, model):.3f}; measured on the lab's packed low-bit kernels: "
            f"{overall.loc['quantized', 'c_effective']:.3f}", "the copy runs packed (lab.quant.packed: torch's CPU "
            "int4/int8 kernels, LM head packed too); the gap to the bound is the step's fixed cost (norms, "
            "attention, sampling), which does not shrink with the weights", None)
    v = {name: float(overall.loc[name, "v(k)"]) for name in costs}
    add("verifying k drafts costs one target step (cost 1 + k c)", f"measured v({p.K}) = " +
        ", ".join(f"{x:.2f} ({n})" for n, x in v.items()) + " plain steps",
        "wrong here: a (k+1)-token forward with k+1 LM-head rows costs more than a one-token step",
        all(x < 1.1 for x in v.values()))
    art, meas = main["error_article_vs_10pct"].value_counts(), main["error_measured_costs_vs_10pct"].value_counts()
    holds = True if art.get("within 10%", 0) == len(main) else False if art.get("outside 10%", 0) else None
    add("acceptance decides everything (the speedup follows from a, k and c)",
        f"of {len(main)} rows (95% intervals over prompts), the article's prediction: " +
        ", ".join(f"{w} at {n}" for w, n in art.items()) + "; with measured v(k): " +
        ", ".join(f"{w} at {n}" for w, n in meas.items()),
        "a, c and the verification cost decide it" if holds is not None else
        f"{NOT_DISTINGUISHABLE}: no row is outside 10% beyond its interval, not every row is within it", holds)
    high = cats[cats["category"].isin(["code", "rewriting", "translation", "summarization"])]
    low = cats[cats["category"] == "open-ended"]
    for drafter in cats["drafter"].unique():
        h, lo = high[high["drafter"] == drafter], low[low["drafter"] == drafter]
        if h.empty or lo.empty:
            continue
        sides = ([range_verdict(_interval(r, "a"), 0.7, None) for _, r in h.iterrows()] +
                 [range_verdict(_interval(r, "a"), None, 0.5) for _, r in lo.iterrows()])
        ok = _all_inside(sides)
        add(f"code/rewriting/translation/summarization a >= 0.7; open-ended writing a < 0.5 ({drafter})",
            ", ".join(f"{r['category']} {_bracketed(_interval(r, 'a'), '.2f')}"
                      for _, r in pd.concat([h, lo]).iterrows()),
            "holds" if ok else "does not hold for this drafter" if ok is False else
            f"{NOT_DISTINGUISHABLE}: an interval straddles its threshold", ok)
    ng = cats[(cats["drafter"] == "ngram") & cats["category"].isin(["rewriting", "summarization"])]
    if not ng.empty:
        ok = _all_inside([range_verdict(_interval(r, "measured_speedup"), 1.1, None) for _, r in ng.iterrows()])
        add("n-gram drafts work wonders for document rewriting and RAG, at almost zero cost",
            ", ".join(f"{r['category']}: a {r['a']:.2f}, {_bracketed(_interval(r, 'measured_speedup'), '.2f')}x"
                      for _, r in ng.iterrows()),
            "holds (speedup above 1.1x)" if ok else "not as measured here" if ok is False else
            f"{NOT_DISTINGUISHABLE} from 1.1x", ok)
    add("acceptance_threshold 0.55 and draft_len 4 as a starting point", "see the policy and best-k tables",
        "a per-category choice", None)
    add("a same-family small model drafts best", "SmolLM2-135M is the family's smallest: no smaller sibling is "
        "embedded", "not testable here", None)
    return pd.DataFrame(rows)
