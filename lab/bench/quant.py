"""`lab bench quant`: quantization time of the whole model at the sizes the GPTQ and AWQ references use.

GPTQ with 128 calibration blocks of 512 tokens, AWQ (20-point scale grid and clip search) with 32 blocks of
512 tokens, both at 4 bits, group size 64, on SmolLM2-135M. The blocks are cut from the stratified calibration
text (`lab.quant.calibration.pack_blocks`). Targets on a 2-core CPU (issue 5): GPTQ under 5 minutes, AWQ under
10. AutoAWQ, where it imports, is timed on the same model, inputs and machine; where it does not, the reason is
recorded, never a number.

The time is dominated by float32 matrix products (AWQ evaluates its inspected block 21 times per scaling
group), so the report also gives the machine's measured GEMM rate and the share of CPU busy before the run:
timings taken beside another job mean little.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from lab.bench.engine import cpu_busy_fraction, measure_gemm_flops

TARGETS_S = {"gptq": 300.0, "awq": 600.0}


@dataclass
class QuantBenchRow:
    method: str
    calib_blocks: int
    calib_tokens: int
    seconds: float
    target_seconds: float
    ratio_to_target: float


def autoawq_status() -> str:
    """Why AutoAWQ cannot be timed here (empty string when it imports)."""
    try:
        import awq  # noqa: F401
    except Exception as exc:  # an ImportError, or a deprecated package failing beside transformers 5
        return f"AutoAWQ does not import here ({type(exc).__name__}: {str(exc)[:200]}); no peer timing"
    return ""


def run_quant_bench(model: str = "smollm2-135m", gptq_blocks: int = 128, awq_blocks: int = 32,
                    block_tokens: int = 512, bits: int = 4, group_size: int = 64, progress: bool = False) -> dict:
    from lab.models import load_model
    from lab.quant.pipeline import QuantJob, quantize_model

    busy = cpu_busy_fraction()
    rows = []
    for method, blocks in (("gptq", gptq_blocks), ("awq", awq_blocks)):
        net, tok = load_model(model, dtype=torch.float32, device="cpu")
        job = QuantJob(model=model, method=method, bits=bits, group_size=group_size, calib_samples=blocks,
                       calib_tokens=block_tokens, calib_packed=True)
        _, summary = quantize_model(job, net, tok, progress=progress)
        seconds = summary["quantization_seconds"]
        rows.append(QuantBenchRow(method, blocks, block_tokens, seconds, TARGETS_S[method],
                                  seconds / TARGETS_S[method]))
    return {"model": model, "bits": bits, "group_size": group_size, "rows": [asdict(r) for r in rows],
            "autoawq": autoawq_status() or "imports (peer timing not implemented in this run)",
            "gemm_gflops_fp32": measure_gemm_flops() / 1e9, "threads": torch.get_num_threads(),
            "cpu_busy_at_start": busy}


def format_result(r: dict) -> str:
    lines = [f"{r['model']} w{r['bits']}g{r['group_size']}, {r['threads']} threads, "
             f"fp32 GEMM {r['gemm_gflops_fp32']:.0f} GFLOP/s"]
    for row in r["rows"]:
        verdict = "within" if row["seconds"] <= row["target_seconds"] else "OVER"
        lines.append(f"{row['method']:5s} {row['calib_blocks']:4d} x {row['calib_tokens']} tokens: "
                     f"{row['seconds']:7.1f} s   target {row['target_seconds']:.0f} s   "
                     f"ratio {row['ratio_to_target']:.2f} ({verdict})")
    lines.append(f"AutoAWQ: {r['autoawq']}")
    if r["cpu_busy_at_start"] is not None and r["cpu_busy_at_start"] > 0.25:
        lines.append(f"WARNING: the CPU was {100 * r['cpu_busy_at_start']:.0f}% busy before the run")
    return "\n".join(lines)
