"""`lab quant`: load a model, calibrate, quantize every decoder linear with RTN, GPTQ or AWQ, and save
a Hugging Face-style checkpoint (GPTQ format for RTN/GPTQ, AWQ GEMM format for AWQ) that
`lab.quant.formats.load_quantized` reads back into the engine.

The embedding and LM head stay unquantized, as GPTQ and AWQ checkpoints leave them. Codes are
exported from the algorithms' own scales and zeros: GPTQ keeps them per linear; RTN and AWQ
weights are re-quantized with RTN, which is exact only when the fake-quantized weight is a fixed
point of RTN, so that is checked and a mismatch is an error rather than a silently different model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .formats import save_quantized
from .gptq import LINEAR_STEPS, GPTQConfig, gptq_quantize_model
from .rtn import QuantSpec, dequantize, quantize

METHODS = ("rtn", "gptq", "awq")


@dataclass
class QuantJob:
    model: str = "smollm2-135m"
    method: str = "gptq"
    bits: int = 4
    group_size: int | None = 64
    symmetric: bool = False
    act_order: bool = False
    calib_samples: int = 128
    calib_tokens: int = 512
    calib_mix: str = "stratified"
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not one of {METHODS}")
        if self.method == "awq" and self.act_order:
            raise ValueError("act_order is a GPTQ option; AWQ has no column order")


def decoder_linears(model) -> dict[str, torch.nn.Linear]:
    return {f"layers.{i}.{name}": layer.get_submodule(name)
            for i, layer in enumerate(model.layers) for step in LINEAR_STEPS for name in step}


def _rtn_codes(model, spec: QuantSpec, quantize_weights: bool) -> dict:
    """Codes of every decoder linear by RTN; with quantize_weights, also write their dequantized weights.

    Without it (AWQ: the weights are already fake-quantized), the weights must be a fixed point of RTN,
    since re-quantizing a quantized group can pick another grid (RTN widens its range to include 0)."""
    codes = {}
    for name, lin in decoder_linears(model).items():
        w = lin.weight.detach().float()
        q, scales, zeros = quantize(w, spec)
        deq = dequantize(q, scales, zeros, group_size=spec.group_size)
        if quantize_weights:
            lin.weight.data.copy_(deq.to(lin.weight.dtype))
        elif not torch.equal(deq, w):
            raise ValueError(f"{name}: the quantized weight is not on an RTN grid; cannot export its codes exactly")
        codes[name] = (q, scales, zeros, None)
    return codes


@torch.no_grad()
def run_quant_job(job: QuantJob, out_dir: str | Path, progress: bool = True) -> dict:
    """Quantize `job.model` and save it to `out_dir`; returns a summary (time, calibration, paths)."""
    from lab.models import load_model

    spec = QuantSpec(bits=job.bits, group_size=job.group_size, symmetric=job.symmetric)
    model, tok = load_model(job.model, dtype=torch.float32, device="cpu")
    calib = []
    if job.method != "rtn":
        from .calibration import build_calibration_set

        ds = build_calibration_set(tok, n_samples=job.calib_samples, max_tokens=job.calib_tokens,
                                   mix=job.calib_mix, seed=job.seed)
        calib = [list(ids) for ids in ds["input_ids"]]
    t = time.perf_counter()
    if job.method == "rtn":
        codes = _rtn_codes(model, spec, quantize_weights=True)
    elif job.method == "gptq":
        codes: dict = {}
        gptq_quantize_model(model, calib, spec, GPTQConfig(act_order=job.act_order), progress=progress, results=codes)
    else:
        from .awq import awq_quantize_model

        awq_quantize_model(model, calib, spec, progress=progress)
        codes = _rtn_codes(model, spec, quantize_weights=False)
    seconds = time.perf_counter() - t
    path = save_quantized(model, codes, spec, "awq" if job.method == "awq" else "gptq", out_dir, tokenizer=tok)
    return {"out_dir": str(path), "method": job.method, "bits": job.bits, "group_size": job.group_size,
            "quantization_seconds": seconds, "calibration_sequences": len(calib),
            "calibration_tokens": sum(map(len, calib))}
