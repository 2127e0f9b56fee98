"""The run's figure: decode GB/s against the measured copy bandwidth (and the target's line), and prefill
TFLOP/s of the Triton kernel and SDPA against the matmul rate, both over context on a log axis.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from kernels_gpu_report import g4, tokens_label
from kernels_gpu_sweep import DECODE_TARGET, Sweep


def _log_tokens_axis(ax, ticks: list[int], **labels) -> None:
    ax.set(xscale="log", **labels)
    ax.set_xticks(ticks, [tokens_label(n) for n in ticks])
    ax.minorticks_off()  # the log axis' own minor labels (2 x 10^1 ...) would sit between the token counts


def _plot_decode(ax, result: dict, sweep: Sweep) -> None:
    copy_gb = result["peers"]["copy"]["bytes_per_s"] / 1e9
    decode = result["decode"]["points"]
    main = (sweep.heads.name, "plain")
    for i, batch in enumerate(sweep.decode_batches):
        pts = sorted((p for p in decode if (p["heads"], p["kv_format"]) == main and p["batch"] == batch),
                     key=lambda p: p["context"])
        ax.plot([p["context"] for p in pts], [p["bytes_per_s"] / 1e9 for p in pts], "o-", color=f"C{i}",
                label=f"batch {batch}")
    extras = sorted({(p["heads"], p["kv_format"]) for p in decode} - {main})
    for i, group in enumerate(extras, start=len(sweep.decode_batches)):
        pts = [p for p in decode if (p["heads"], p["kv_format"]) == group]
        ax.scatter([p["context"] for p in pts], [p["bytes_per_s"] / 1e9 for p in pts], marker="x", color=f"C{i}",
                   label=f"{group[0]} {group[1]} (batch {', '.join(str(p['batch']) for p in pts)})")
    ax.axhline(copy_gb, color="k", label=f"measured copy bandwidth {g4(copy_gb)} GB/s")
    ax.axhline(DECODE_TARGET * copy_gb, color="k", ls="--", label=f"{DECODE_TARGET:.0%} of it (target)")
    _log_tokens_axis(ax, sorted({p["context"] for p in decode}), xlabel="context (tokens)",
                     ylabel="achieved GB/s (decode_traffic / time)",
                     title=f"decode attention, {sweep.heads.name} heads, {sweep.dtype}")
    ax.legend(fontsize=8)


def _plot_prefill(ax, result: dict, sweep: Sweep) -> None:
    prefill = result["prefill"]["points"]
    fresh = sorted((p for p in prefill if p["kind"] == "fresh"), key=lambda p: p["query_len"])
    chunks = [p for p in prefill if p["kind"] == "chunk"]
    for key, label, color in (("triton", "Triton paged prefill", "C0"), ("sdpa", "SDPA", "C1")):
        ax.plot([p["query_len"] for p in fresh], [p[f"{key}_flops_per_s"] / 1e12 for p in fresh], "o-",
                color=color, label=f"{label}, fresh prefill")
        ax.scatter([p["context_len"] for p in chunks], [p[f"{key}_flops_per_s"] / 1e12 for p in chunks],
                   marker="s", color=color, label=f"{label}, chunk over a prefix (at its context)")
    matmul = result["peers"]["matmul"]
    ax.axhline(matmul["flops_per_s"] / 1e12, color="k",
               label=f"{matmul['dtype']} matmul {matmul['n']}^3: {g4(matmul['flops_per_s'] / 1e12)} TFLOP/s")
    _log_tokens_axis(ax, sorted({p["context_len"] for p in prefill}), xlabel="context (tokens)",
                     ylabel="achieved TFLOP/s (prefill_flops / time)",
                     title=f"prefill attention, {sweep.heads.name} heads, {sweep.dtype}")
    ax.legend(fontsize=8)


def plot(result: dict, sweep: Sweep, path: Path) -> None:
    fig = Figure(figsize=(13, 5), layout="constrained")
    ax_decode, ax_prefill = fig.subplots(1, 2)
    _plot_decode(ax_decode, result, sweep)
    _plot_prefill(ax_prefill, result, sweep)
    if result["dry_run"]:
        fig.suptitle("DRY RUN: Triton interpreter on CPU, tiny shapes: not GPU figures", color="C3")
    fig.savefig(path, dpi=120)
