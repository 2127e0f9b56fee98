"""GPTQModel beside the lab's GPTQ on one model, in one run (issue 37 item 3; `lab bench quant` calls it).

Both quantize the same weights (the unquantized model, exported to a Hugging Face directory for GPTQModel) on the
same calibration blocks (the token ids the lab's GPTQ calibrated on), at the same bits, group size, grid (symmetric
or not), act-order and dampening (`lab.quant.gptq.GPTQConfig`); GPTQModel's group-aware reordering is off so both
run GPTQ as the paper states it (`lab.quant.gptqmodel_peer.quantize_task`). Each result is read back from its own
checkpoint (`load_quantized`), so both carry float16 scales as the format stores them. Measured:

- time: the lab's quantization (`quantize_model`'s seconds) and GPTQModel's `quantize()` call alone (its import,
  load and save are left out; the child process's whole wall time is reported beside it);
- per-layer reconstruction error: per decoder layer, sum over its four linears of ||X (W - Q)^T||^2 over
  ||X W^T||^2, X the inputs each linear receives in the UNQUANTIZED model on the first `recon_blocks` calibration
  blocks (the quantity GPTQ minimizes, on inputs that favour neither quantizer's order), pooled over layers with a
  bootstrap interval over layers (`lab.stats.intervals.ratio_interval`);
- perplexity on the quantization study's two held-out domains, with intervals: added by `lab.bench.quant`
  (`heldout_perplexity`), since lab.eval and lab.studies import lab.quant and lab.quant must not import them.

The embedded SmolLM2-135M is a dequantized Q4_1 GGUF: its linears already sit on a 4-bit grid of 32 columns, so on
it both quantizers measure how far another 4-bit grid lies from that one, not what 4 bits cost a 16-bit model
(docs/studies/02_quantization_accuracy.md). `SUBJECT_NOTES` says so in the output.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import gptqmodel_peer
from .layerwise import LINEAR_STEPS, CalibrationPass

SUBJECT_NOTES = {"smollm2-135m": "its linears are a dequantized Q4_1 GGUF, already on a 4-bit grid of 32 columns: "
                                 "the errors here are the distance to that grid, not what 4 bits cost a 16-bit model"}


def subject_note(model: str) -> str:
    if model.startswith("random:"):
        return "random weights: errors and perplexities say nothing about a trained model's quality"
    return SUBJECT_NOTES.get(str(model), "")


@torch.no_grad()
def layer_output_errors(reference: nn.Module, quantized: dict[str, nn.Module], calib: list[list[int]],
                        layers: tuple[int, ...] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(||X W^T||^2 per layer, {label: ||X (W - Q)^T||^2 per layer}) over each layer's four linears, X their inputs
    in `reference` on `calib`; one entry per layer of `layers` (None: all)."""
    cal = CalibrationPass(reference, calib)
    norms, errors = [], {label: [] for label in quantized}
    for i, layer in enumerate(reference.layers):
        if layers is not None and i not in layers:
            cal.advance(layer)
            continue
        inputs, outputs = cal.capture(layer, list(LINEAR_STEPS))
        norm, err = 0.0, dict.fromkeys(quantized, 0.0)
        for name in LINEAR_STEPS:
            x = torch.cat(inputs[name]).float()
            w = layer.get_submodule(name).weight.float()
            norm += float((x @ w.t()).pow(2).sum())
            for label, model in quantized.items():
                q = model.layers[i].get_submodule(name).weight.float().to(w.device)
                err[label] += float((x @ (w - q).t()).pow(2).sum())
        norms.append(norm)
        for label in quantized:
            errors[label].append(err[label])
        cal.hidden = outputs  # the next layer's inputs, through this unquantized layer
    return np.array(norms), {label: np.array(v) for label, v in errors.items()}


def export_reference(reference, tokenizer, path: Path) -> Path:
    """The unquantized model as a Hugging Face directory (transformers' class, float32) with its tokenizer."""
    from lab.models.hf_export import to_transformers

    to_transformers(reference).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def compare(reference, tokenizer, lab_model, lab_codes: dict, lab_seconds: float, spec, act_order: bool,
            calib: list[list[int]], layers: tuple[int, ...] | None = None, recon_blocks: int = 16,
            device: str = "cpu") -> tuple[dict, dict]:
    """GPTQModel quantizes `reference` as the lab did (`lab_codes` of `lab_model`, in `lab_seconds`); both are timed
    and their per-layer output errors measured (see the module docstring). Returns (result, {"lab": model,
    "gptqmodel": model}, each read back from its checkpoint, for the held-out perplexity that `lab.bench.quant`
    adds), or ({"status": why not}, {}) when GPTQModel cannot run here."""
    from .formats import load_quantized, save_quantized
    from .gptq import GPTQConfig

    missing = gptqmodel_peer.available()
    if missing:
        return {"status": missing}, {}
    damp = GPTQConfig().percdamp
    with tempfile.TemporaryDirectory(prefix="gptqmodel-compare-") as tmp:
        hf_dir = export_reference(reference, tokenizer, Path(tmp) / "reference")
        start = time.perf_counter()
        peer = gptqmodel_peer.quantize(hf_dir, Path(tmp) / "gptqmodel", calib, spec.bits, spec.group_size,
                                       spec.symmetric, act_order, damp, layers=layers, device=device)
        wall = time.perf_counter() - start
        where = reference.embed_tokens.weight.device
        theirs, _ = load_quantized(Path(tmp) / "gptqmodel", dtype=torch.float32, device=where)
        ours, _ = load_quantized(save_quantized(lab_model, lab_codes, spec, "gptq", Path(tmp) / "lab"),
                                 dtype=torch.float32, device=where)
    models = {"lab": ours, "gptqmodel": theirs}
    norms, errors = layer_output_errors(reference, models, calib[:recon_blocks], layers)
    return {"status": f"GPTQModel {peer['version']} ran", "settings": {"damp_percent": damp, "act_order": act_order,
            "sym": spec.symmetric, "group_aware_reordering": False}, "quantize_config": peer["quantize_config"],
            "lab_seconds": lab_seconds, "gptqmodel_seconds": peer["seconds"], "gptqmodel_wall_seconds": wall,
            "lab_over_gptqmodel": lab_seconds / peer["seconds"], "recon_blocks": len(calib[:recon_blocks]),
            **_errors_summary(norms, errors)}, models


def _errors_summary(norms: np.ndarray, errors: dict[str, np.ndarray]) -> dict:
    from lab.stats.intervals import ratio_interval

    return {"layer_relative_error": {label: (e / norms).tolist() for label, e in errors.items()},
            "pooled_relative_error": {label: ratio_interval(e, norms).columns("value")
                                      for label, e in errors.items()}}


def format_comparison(r: dict, model: str) -> list[str]:
    """The report's lines for `compare`'s result."""
    if "lab_seconds" not in r:
        return [f"GPTQModel: not run: {r['status']}"]
    note = subject_note(model)
    lines = [f"GPTQModel: {r['status']} beside the lab's GPTQ on {model} (same calibration, bits, group, grid, "
             f"damp {r['settings']['damp_percent']}, GAR off)" + (f"; NOTE {note}" if note else ""),
             f"  time: lab {r['lab_seconds']:.1f} s   GPTQModel {r['gptqmodel_seconds']:.1f} s (quantize call; "
             f"child process {r['gptqmodel_wall_seconds']:.1f} s)   lab/GPTQModel {r['lab_over_gptqmodel']:.2f}"]
    for label, iv in r["pooled_relative_error"].items():
        per_layer = " ".join(f"{v:.3g}" for v in r["layer_relative_error"][label])
        lines.append(f"  output error {label:9s} pooled {_iv(iv)}   per layer: {per_layer}")
    for domain, row in r.get("perplexity", {}).items():
        lines.append(f"  perplexity {domain} ({row['sequences']} seqs): reference {_iv(row['reference'])}   "
                     f"lab {_iv(row['lab'])}   GPTQModel {_iv(row['gptqmodel'])}   "
                     f"GPTQModel/lab {_iv(row['gptqmodel_over_lab'])}")
    return lines


def _iv(c: dict) -> str:
    return f"{c['value']:.4g} ({c['value_low']:.4g} to {c['value_high']:.4g})"
