"""What `lab bench engine` prints and draws: every measurement beside its bound and its peers, the ratios, and
the issue's targets (measured, never asserted: `targets` says met or not and by how much)."""

from __future__ import annotations

UNITS = {"decode-1": "ms/step", "offline-32x128": "tokens/s", "prefill-2k": "s"}
LOWER_IS_BETTER = {"decode-1", "prefill-2k"}
# The vLLM 0.32 CPU build on the issue's 32 x 128 workload (issue 18's table, measured on the project's machine
# before this benchmark existed): quoted, not measured here. `--peer-url` measures a running server instead.
VLLM_CPU_QUOTED = {"float32": 162.0, "bfloat16": 285.0}


def _speedup(workload: str, ours: float, theirs: float) -> float:
    return theirs / ours if workload in LOWER_IS_BETTER else ours / theirs


def _best(result: dict, workload: str, dtype: str | None = None, int4: bool = False,
          kind: str = "") -> dict | None:
    """The fastest engine variant at `workload` (in `dtype`; 4-bit or not; whose name starts with `kind`)."""
    rows = [e for e in result["engines"] if workload in e["workloads"] and (dtype is None or e["dtype"] == dtype)
            and e["variant"].startswith("int4") == int4 and e["variant"].startswith(kind)]
    key = (lambda e: -e["workloads"][workload]["value"]) if workload not in LOWER_IS_BETTER else \
        (lambda e: e["workloads"][workload]["value"])
    return min(rows, key=key) if rows else None


def _peer(result: dict, name: str) -> dict | None:
    return next((p for p in result["peers"] if p["peer"] == name), None)


def targets(result: dict) -> list[dict]:
    """Issue 18's targets and issue 36's (which tightened the batch-1 one and added prefill parity and compiled
    against eager), each with the measured value, the target and whether it is met. Every one is a ratio taken
    within this run: timings from different runs on this machine are not comparable."""
    out = []

    def add(what, value, target, higher_is_better=True):
        if value is not None:
            out.append({"target": what, "measured": value, "needed": (">=" if higher_is_better else "<=", target),
                        "met": value >= target if higher_is_better else value <= target})

    serving = next((e["dtype"] for e in result["engines"] if "-auto" in e["variant"]), None)
    for dtype in {"float32", serving} - {None}:
        ours, peer = _best(result, "offline-32x128", dtype), _peer(result, f"transformers-{dtype}")
        if ours and peer:
            add(f"offline 32x128, {dtype}: engine / transformers", ours["workloads"]["offline-32x128"]["value"]
                / peer["workloads"]["offline-32x128"]["value"], 1.5)
        ours = _best(result, "prefill-2k", dtype)
        if ours and peer and "prefill-2k" in peer["workloads"]:
            add(f"2K prefill, {dtype}: engine / transformers (speedup)",
                peer["workloads"]["prefill-2k"]["value"] / ours["workloads"]["prefill-2k"]["value"], 1.0)
    if (serving and result["model"] == "smollm2-135m" and serving in VLLM_CPU_QUOTED
            and (ours := _best(result, "offline-32x128", serving))):
        add(f"offline 32x128, {serving}: engine / vLLM CPU (quoted {VLLM_CPU_QUOTED[serving]:.0f} tokens/s)",
            ours["workloads"]["offline-32x128"]["value"] / VLLM_CPU_QUOTED[serving], 1.5)
    if ours := (_best(result, "decode-1", serving) or _best(result, "decode-1")):
        w = ours["workloads"]["decode-1"]
        add(f"batch-1 decode step / its bound ({ours['variant']})", w["step_s"] * 1e3 / w["decode_step_bound_ms"],
            1.25, higher_is_better=False)
        add(f"verification of 4 drafts (5 rows) / one-row step ({ours['variant']})", ours["verify_5_rows_over_1"],
            1.15, higher_is_better=False)
    if ours := _best(result, "offline-32x128"):
        add(f"batch 32: share of the roofline bound ({ours['variant']})",
            ours["workloads"]["offline-32x128"]["fraction_of_roofline"], 0.35)
    int4 = _best(result, "decode-1", int4=True)
    for dtype, need in (("float32", 2.0), (serving, 1.3)):
        base = _best(result, "decode-1", dtype) if dtype else None
        if int4 and base:
            add(f"4-bit batch-1 decode speedup over {dtype}", base["workloads"]["decode-1"]["value"]
                / int4["workloads"]["decode-1"]["value"], need)
    out += _compiled_against_eager(result)
    return out


def _compiled_against_eager(result: dict) -> list[dict]:
    """Issue 36: the best compiled variant at least as fast as the best eager one, at every workload, in the same
    dtype."""
    out = []
    for name in UNITS:
        for dtype in dict.fromkeys(e["dtype"] for e in result["engines"]):
            c, e = _best(result, name, dtype, kind="compiled"), _best(result, name, dtype, kind="eager")
            if c and e:
                ratio = _speedup(name, c["workloads"][name]["value"], e["workloads"][name]["value"])
                out.append({"target": f"{name}, {dtype}: {c['variant']} / {e['variant']} (speedup)",
                            "measured": ratio, "needed": (">=", 1.0), "met": ratio >= 1.0})
    return out


def format_result(result: dict) -> str:
    lines = [f"model {result['model']}, {result['threads']} threads, CPU busy "
             f"{100 * (result['cpu_busy_at_start'] or 0):.0f}% in the second before"]
    if (result["cpu_busy_at_start"] or 0) > 0.25:
        lines.append("WARNING: other processes were running; these timings are unreliable")
    for e in result["engines"]:
        c = e["ceilings"]
        lines.append(f"{e['variant']} ({e['dtype']}, {e['weight_MB']:.0f} MB of weights; ceilings: read "
                     f"{c['read_GBps']:.1f} GB/s, matmul {c['gemm_GFLOPs']:.0f} GFLOP/s; compile "
                     f"{e['compile_seconds']:.0f} s; verify 5 rows / 1 row {e['verify_5_rows_over_1']:.2f})")
    header = f"{'workload':<16}{'who':<24}{'measured':>12}  {'unit':<9}{'of roofline':>12}{'vs transformers':>17}"
    lines += ["", header, "-" * len(header)]
    for name, unit in UNITS.items():
        for e in result["engines"]:
            if name not in e["workloads"]:
                continue
            w = e["workloads"][name]
            peer = _peer(result, f"transformers-{e['dtype']}")
            ratio = _speedup(name, w["value"], peer["workloads"][name]["value"]) if peer else None
            lines.append(f"{name:<16}{e['variant']:<24}{w['value']:>12.2f}  {unit:<9}{w['fraction_of_roofline']:>11.0%}"
                         + (f"{ratio:>16.2f}x" if ratio else ""))
        for p in result["peers"]:
            if name in p["workloads"]:
                lines.append(f"{name:<16}{p['peer']:<24}{p['workloads'][name]['value']:>12.2f}  {unit:<9}")
    lines += ["", "targets (issues 18 and 36; measured, not asserted):"]
    for t in targets(result):
        lines.append(f"  {'met    ' if t['met'] else 'NOT met'} {t['target']}: {t['measured']:.2f} "
                     f"(needed {t['needed'][0]} {t['needed'][1]})")
    return "\n".join(lines)


def plot_fractions(result: dict):
    """Bars: each engine variant's fraction of its roofline bound on each workload."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [n for n in UNITS if any(n in e["workloads"] for e in result["engines"])]
    width = 0.8 / max(1, len(result["engines"]))
    for i, e in enumerate(result["engines"]):
        xs = [j + i * width for j, n in enumerate(names) if n in e["workloads"]]
        ax.bar(xs, [e["workloads"][n]["fraction_of_roofline"] for n in names if n in e["workloads"]], width,
               label=e["variant"])
    ax.set_xticks([j + width * (len(result["engines"]) - 1) / 2 for j in range(len(names))], names)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("bound / measured time")
    ax.set_title(f"{result['model']}: the engine's share of this machine's roofline")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
