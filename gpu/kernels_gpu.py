"""GPU benchmark of the lab's Triton attention kernels against what the same GPU measurably does.

Decode attention reads each context token's K and V once and does G FLOPs per byte of a bf16 cache (each of
the G query heads sharing a KV head does one multiply-add per element), far below any GPU's ridge point, so its
ceiling is memory bandwidth: the figure of merit is bytes moved per second (`decode_traffic`) as a fraction of
bandwidth. Flash-Decoding (Dao, Haziza, Massa and Sizov, 2023, "Flash-Decoding for long-context inference")
splits the context across programs precisely so that one sequence can keep the whole memory system busy, and
FlashInfer (Ye et al., 2025, arXiv:2501.01005) reports its decode kernels by the bandwidth they achieve. The
peer here is not the datasheet's number, which real access patterns fall short of, but a large `copy_` timed
in the same run (bytes read + bytes written, as STREAM counts them): the target is >= 85% of it from 16K
tokens of context up, where the context's bytes dwarf the fixed costs of a call.

Prefill attention is compute-bound (a query tile is reused against every key tile), so its figure of merit is
FLOP/s (`prefill_flops`), set against the bf16 matmul rate measured in the same run (the tensor cores'
practical ceiling) and against `torch.nn.functional.scaled_dot_product_attention` (PyTorch's fused
FlashAttention/cuDNN kernels) on the same q, k and v in the contiguous [batch, heads, tokens, head_dim] layout
those kernels want. The target is >= 70% of SDPA's rate.

Every kernel is first checked against its PyTorch reference on a small shape (a fast wrong kernel is
worthless); the errors are in the JSON. Times are medians over repetitions, each after a write of a buffer
larger than L2 so that no run reads K/V left in cache by the previous one (a model's other layers would have
evicted it). They are times of the public calls with validate=False, as the engine calls them: the checks that
read lengths and block ids back from the device (a host sync each) run in the correctness checks, not in the
timed calls. Each API's floor, its time on one block of tokens, is measured too, so that short points can be
read against it.

    python gpu/kernels_gpu.py               # one GPU, a few minutes: results/kernels_gpu/kernels_gpu.{json,png}
    python gpu/kernels_gpu.py --dry-run     # the same code path on tiny shapes in Triton's CPU interpreter

The dry run's numbers are interpreter timings, not GPU figures: it checks that the script, the kernels'
correctness checks, the JSON and the plot work where no GPU is available.

This file is the entry point; its parts are the sibling modules kernels_gpu_*.py (imported by their top-level
names, as the script's folder is first on sys.path): the sweep, timing and the peers, caches, decode, prefill,
the report (targets and printed summary) and the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from kernels_gpu_decode import bench_decode
from kernels_gpu_plot import plot
from kernels_gpu_prefill import bench_prefill
from kernels_gpu_report import evaluate_targets, g4, print_summary
from kernels_gpu_sweep import DRY_RUN_SWEEP, GPU_SWEEP, Sweep
from kernels_gpu_timing import Bench, measure_copy, measure_matmul
from lab.bench.caselog import CaseLog
from lab.workflow.provenance import cpu_model, provenance
from lab.workflow.run import json_safe

# Modules that import triton (lab.kernels, torch.nn.attention.bias) are imported inside the functions that use
# them: the dry run must set TRITON_INTERPRET before triton's first import, which reads it once.

ROOT = Path(__file__).resolve().parents[1]


def run(sweep: Sweep, dry_run: bool, log: CaseLog | None = None) -> dict:
    torch.manual_seed(0)
    started = time.perf_counter()
    bench = Bench.create(sweep, log)
    device_name = (torch.cuda.get_device_name(bench.device) if bench.cuda
                   else f"CPU, Triton interpreter ({cpu_model()})")
    print(f"device: {device_name}{' (DRY RUN: not GPU figures)' if dry_run else ''}")
    copy, matmul = measure_copy(bench), measure_matmul(bench)
    bench.log.write("peers", {"copy": copy, "matmul": matmul})
    print(f"copy bandwidth: {g4(copy['bytes_per_s'] / 1e9)} GB/s (best of {sweep.repeats}, "
          f"{copy['buffer_bytes'] / 1024**2:.0f} MiB read + written)")
    print(f"{sweep.dtype} matmul: {g4(matmul['flops_per_s'] / 1e12)} TFLOP/s ({matmul['n']}^3, "
          f"best of {sweep.repeats})")
    print(f"\ndecode (peer: copy bandwidth above; times are medians of {sweep.repeats})")
    decode, decode_checks = bench_decode(bench, copy["bytes_per_s"])
    print(f"  decode API floor (batch 1, one block of context): {g4(decode['floor']['ms'])} ms")
    print("\nprefill (peers: SDPA on the same q/k/v, measured here; the matmul rate above)")
    prefill, prefill_checks = bench_prefill(bench, matmul["flops_per_s"])
    print(f"  prefill API floor (one block of tokens): {g4(prefill['floor']['triton_ms'])} ms, "
          f"SDPA {g4(prefill['floor']['sdpa_ms'])} ms")
    result = {
        "benchmark": "kernels_gpu", "dry_run": dry_run,
        "note": ("dry run: Triton's CPU interpreter on tiny float32 shapes; the numbers check the code path and "
                 "are not GPU figures") if dry_run else "measured on the GPU named in `device`",
        "device": device_name, "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "method": (f"kernels and SDPA: median of {sweep.repeats} calls of the public API ({sweep.warmup} untimed "
                   f"first), each after writing a {sweep.flush_bytes / 1024**2:g} MiB buffer to evict cached "
                   f"data, timed with {'CUDA events' if bench.cuda else 'perf_counter'}; copy and matmul: the "
                   f"best of as many"),
        "provenance": provenance({"sweep": asdict(sweep), "dry_run": dry_run}),
        "peers": {"copy": copy, "matmul": matmul}, "checks": decode_checks + prefill_checks,
        "decode": decode, "prefill": prefill,
    }
    result["targets"] = evaluate_targets(result, sweep)
    result["wall_seconds"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on CPU in Triton's interpreter: checks the code path, not a GPU figure")
    parser.add_argument("--out", type=Path, help="output folder (default: results/kernels_gpu/, or "
                                                 "results/kernels_gpu_dry_run/ with --dry-run)")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        print("gpu/kernels_gpu.py measures a GPU, and CUDA is not available here. Run it on a machine with an "
              "NVIDIA GPU, or use --dry-run for the CPU check of the same code path on tiny shapes.", file=sys.stderr)
        return 2
    out = args.out or ROOT / "results" / ("kernels_gpu_dry_run" if args.dry_run else "kernels_gpu")
    sweep = DRY_RUN_SWEEP if args.dry_run else GPU_SWEEP
    out.mkdir(parents=True, exist_ok=True)
    result = run(sweep, args.dry_run, CaseLog(out / "kernels_gpu.jsonl"))
    print_summary(result)
    (out / "kernels_gpu.json").write_text(json.dumps(json_safe(result), indent=1, allow_nan=False) + "\n")
    plot(result, sweep, out / "kernels_gpu.png")
    print(f"\nwrote {out / 'kernels_gpu.json'} and {out / 'kernels_gpu.png'} ({result['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
