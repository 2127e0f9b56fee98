"""`lab quant`: load a model, calibrate, quantize every decoder linear with RTN, GPTQ or AWQ, and save
a Hugging Face-style checkpoint (GPTQ format for RTN/GPTQ, AWQ GEMM format for AWQ) that
`lab.quant.formats.load_quantized` reads back into the engine.

llama.cpp's block grids are methods too (`GGUF_METHODS`: "gguf-q4_0", "gguf-q4_1", "gguf-q8_0",
`lab.quant.gguf_grids`), at the bits of their grid and blocks of 32 columns (`gguf_spec`); like RTN they need no
calibration. They are studied in memory: a GPTQ or AWQ checkpoint cannot store Q4_1's float minimum per block,
so `checkpoint_format` refuses them (llama.cpp's own tools write GGUF files).

The embedding and LM head stay unquantized, as GPTQ and AWQ checkpoints leave them. Codes are
exported from each algorithm's own scales and zeros (GPTQ's per column block, AWQ's of the scaled
and clipped weight), never re-derived from quantized weights, which could land on another grid.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .formats import save_quantized
from .gguf_grids import BLOCK, GRIDS, dequantize_gguf, quantize_gguf
from .gptq import GPTQConfig, gptq_quantize_model
from .layerwise import LINEAR_STEPS, check_linears
from .rtn import QuantSpec, dequantize, quantize

GGUF_METHODS = tuple(f"gguf-{g}" for g in GRIDS)
METHODS = ("rtn", "gptq", "awq", *GGUF_METHODS)


def gguf_spec(method: str) -> QuantSpec | None:
    """The bits and group size of a GGUF method ("gguf-q4_1": 4 bits, blocks of 32), else None."""
    if method not in GGUF_METHODS:
        return None
    return QuantSpec(GRIDS[method.removeprefix("gguf-")].bits, BLOCK)


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
    # False: the set's own samples (variable lengths up to calib_tokens, stratified by length bucket);
    # True: calib_samples blocks of exactly calib_tokens cut from a 512-sample set (GPTQ's and AutoAWQ's layout).
    calib_packed: bool = False
    seed: int = 0
    # Decoder layers to quantize (None: all). The others stay unquantized and are saved so: a study of one
    # layer's sensitivity, or a quick check of the pipeline (calibration still flows through every layer).
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not one of {METHODS}")
        if self.layers is not None:
            self.layers = tuple(self.layers)
            if not self.layers or any(not isinstance(i, int) or i < 0 for i in self.layers):
                raise ValueError(f"layers={self.layers!r} must be None (all) or non-negative layer indices")
        if self.method == "awq" and self.act_order:
            raise ValueError("act_order is a GPTQ option; AWQ has no column order")
        own = gguf_spec(self.method)
        if own is not None and (self.bits, self.group_size) != (own.bits, own.group_size):
            raise ValueError(f"{self.method} stores {own.bits} bits in blocks of {own.group_size} columns: set bits="
                             f"{own.bits}, group_size={own.group_size} (got {self.bits}, {self.group_size})")
        self.spec()  # bits and group size checked here, before any model is loaded

    def spec(self) -> QuantSpec:
        return QuantSpec(bits=self.bits, group_size=self.group_size, symmetric=self.symmetric)


def decoder_linears(model, layers: tuple[int, ...] | None = None) -> dict[str, torch.nn.Linear]:
    """The decoder linears by lab module name, of `layers` (None: every layer; an index past the model's
    last layer is refused, and so is a mixture of experts: `check_linears`)."""
    check_linears(model)
    n = len(model.layers)
    if layers is not None and max(layers) >= n:
        raise ValueError(f"layers={layers!r}: the model has {n} decoder layers (indices 0 to {n - 1})")
    return {f"layers.{i}.{name}": layer.get_submodule(name)
            for i, layer in enumerate(model.layers) if layers is None or i in layers for name in LINEAR_STEPS}


def _rtn_codes(model, spec: QuantSpec, layers: tuple[int, ...] | None = None) -> dict:
    """RTN codes of every decoder linear, writing their dequantized weights into the model.

    The codes come from the original weights: re-quantizing already quantized weights can pick
    another grid (RTN widens a group's range to include 0), so codes are never re-derived."""
    codes = {}
    for name, lin in decoder_linears(model, layers).items():
        q, scales, zeros = quantize(lin.weight.detach().float(), spec)
        lin.weight.data.copy_(dequantize(q, scales, zeros, group_size=spec.group_size).to(lin.weight.dtype))
        codes[name] = (q, scales, zeros, None)
    return codes


def _gguf_codes(model, method: str, layers: tuple[int, ...] | None = None) -> dict:
    """(codes, d, m) of every decoder linear on GGUF grid `method` (`quantize_gguf`), writing the weights as GGUF
    reads them back into the model."""
    grid = method.removeprefix("gguf-")
    codes = {}
    for name, lin in decoder_linears(model, layers).items():
        q, d, m = quantize_gguf(lin.weight, grid)
        lin.weight.data.copy_(dequantize_gguf(q, d, m, grid).to(lin.weight.dtype))
        codes[name] = (q, d, m)
    return codes


def _calibration(tokenizer, job: QuantJob) -> tuple[list[list[int]], dict[str, int]]:
    """What `job` calibrates on: the token ids (samples, or packed blocks) and the tokens per task ("code",
    "docs", "chat", "spec_bench/<category>", ...) in them; packed blocks take the samples' tokens in order."""
    from .calibration import PACK_POOL_SAMPLES, build_calibration_set, pack_blocks

    n = PACK_POOL_SAMPLES if job.calib_packed else job.calib_samples
    ds = build_calibration_set(tokenizer, n_samples=n, max_tokens=job.calib_tokens, mix=job.calib_mix, seed=job.seed)
    ids = [list(x) for x in ds["input_ids"]]
    left = job.calib_samples * job.calib_tokens if job.calib_packed else None
    tasks: dict[str, int] = {}
    for task, k in zip(ds["task"], ds["n_tokens"]):
        take = k if left is None else min(k, left)
        tasks[task] = tasks.get(task, 0) + take
        if left is not None:
            left -= take
            if not left:
                break
    return (pack_blocks(ids, job.calib_samples, job.calib_tokens) if job.calib_packed else ids), tasks


def calibration_token_ids(tokenizer, job: QuantJob) -> list[list[int]]:
    return _calibration(tokenizer, job)[0]


@torch.no_grad()
def quantize_model(job: QuantJob, model, tokenizer, progress: bool = True) -> tuple[dict, dict]:
    """Quantize `model` in place as `job` says (its `model` field is not read): returns the codes of
    every decoder linear, for `save_quantized`, and a summary (time, calibration size, tokens per task)."""
    decoder_linears(model, job.layers)  # a layer past the model's last is refused before calibration
    calibrated = job.method in ("gptq", "awq")
    calib, tasks = _calibration(tokenizer, job) if calibrated else ([], {})
    spec = job.spec()
    layers = None if job.layers is None else list(job.layers)
    t = time.perf_counter()
    if job.method == "rtn":
        codes = _rtn_codes(model, spec, job.layers)
    elif job.method in GGUF_METHODS:
        codes = _gguf_codes(model, job.method, job.layers)
    elif job.method == "gptq":
        codes: dict = {}
        gptq_quantize_model(model, calib, spec, GPTQConfig(act_order=job.act_order), layers=layers,
                            progress=progress, results=codes)
    else:
        from .awq import awq_quantize_model

        codes = {}
        awq_quantize_model(model, calib, spec, layers=layers, progress=progress, results=codes)
    summary = {"method": job.method, "bits": job.bits, "group_size": job.group_size,
               "layers": len(model.layers) if job.layers is None else len(set(job.layers)),
               "quantization_seconds": time.perf_counter() - t, "calibration_sequences": len(calib),
               "calibration_tokens": sum(map(len, calib)), "calibration_tasks": tasks}
    return codes, summary


def checkpoint_format(job: QuantJob) -> str:
    """AWQ results are saved in the AWQ GEMM format; RTN and GPTQ in the GPTQ format; GGUF grids in neither."""
    if job.method in GGUF_METHODS:
        raise ValueError(f"{job.method}: a GPTQ or AWQ checkpoint cannot store a GGUF grid (Q4_1's float minimum, "
                         f"Q4_0's offset codes); the GGUF methods are studied in memory")
    return "awq" if job.method == "awq" else "gptq"


def run_quant_job(job: QuantJob, out_dir: str | Path, progress: bool = True, device: str = "auto") -> dict:
    """`lab quant`: quantize `job.model` on `device` ("auto": CUDA when present, else the CPU; checked before
    the model loads) and save it to `out_dir`; returns the summary, the path and the device it ran on."""
    from lab.models import load_model
    from lab.workflow.run import check_device, resolve_device

    check_device("device", device)
    fmt = checkpoint_format(job)  # a GGUF grid is refused before the model loads
    # float32 on every device: the algorithms' statistics (Hessians, scale searches) want its precision.
    model, tok = load_model(job.model, dtype=torch.float32, device=resolve_device(device))
    codes, summary = quantize_model(job, model, tok, progress)
    path = save_quantized(model, codes, job.spec(), fmt, out_dir, tokenizer=tok)
    return {"out_dir": str(path), "device": str(model.embed_tokens.weight.device), **summary}
