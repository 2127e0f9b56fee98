"""`lab bench quant`: quantization time of the whole model at the sizes the GPTQ and AWQ references use.

GPTQ with 128 calibration blocks of 512 tokens, AWQ (20-point scale grid and clip search) with 32 blocks of
512 tokens, both at 4 bits, group size 64, on SmolLM2-135M. The blocks are cut from the stratified calibration
text (`lab.quant.calibration.pack_blocks`). Targets on a 2-core CPU (issue 5): GPTQ under 5 minutes, AWQ under
10. AutoAWQ cannot run the whole lab model (its pipeline wants a Hugging Face model class and hub data);
where it imports, its scale and clip searches (where its time goes) are timed beside the lab's on the same
layer and inputs (`autoawq_peer_timing`); where it does not, the reason is recorded, never a number.
GPTQModel (the maintained successor of AutoGPTQ) runs whole: it quantizes the same model on the same calibration
blocks at the same settings as the lab's GPTQ, and both are measured side by side (time, per-layer output error,
held-out perplexity with intervals: `lab.quant.gptqmodel_compare`); where it cannot run, the reason is printed.

The time is dominated by float32 matrix products (AWQ evaluates its inspected block 21 times per scaling
group), so the report also gives the device it ran on (`--device`: the CPU or a CUDA device), that device's
measured float32 GEMM rate and the share of CPU busy before the run: timings taken beside another job mean little.
The targets are the 2-core CPU's; on a GPU the ratio to them is shown all the same.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from lab.bench.engine import cpu_busy_fraction
from lab.machine.hardware import probe_inference

TARGETS_S = {"gptq": 300.0, "awq": 600.0}
# The quantization study's held-out domains and their `heldout_texts` sources (lab.studies.quant_accuracy's
# DOMAIN_SOURCES, restated because lab.studies imports lab.bench; a test keeps the two equal).
HELDOUT_DOMAINS = {"code": "stdlib", "prose": "readme"}


@dataclass
class QuantBenchRow:
    method: str
    layers: int
    calib_blocks: int
    calib_tokens: int
    seconds: float
    target_seconds: float
    ratio_to_target: float


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@torch.no_grad()
def autoawq_peer_timing(model: str, blocks: int, block_tokens: int, layer: int = 0, device: str = "cpu") -> list[dict]:
    """The lab's AWQ searches and AutoAWQ's on the same layer, inputs and machine, one after the other:
    the norm -> gate_up scale search (inspecting the MLP), the up -> down scale search, and the o_proj clip
    search on AutoAWQ's 10-ratio grid. (AutoAWQ's whole-model pipeline needs a Hugging Face model class
    and hub data; these searches are where its time goes.)"""
    import copy

    from torch import nn

    from lab.models import load_model
    from lab.quant import autoawq_peer as peer
    from lab.quant.awq import search_clip, search_scales
    from lab.quant.layerwise import CalibrationPass
    from lab.quant.pipeline import QuantJob, calibration_token_ids
    from lab.quant.rtn import QuantSpec

    net, tok = load_model(model, dtype=torch.float32, device=device)
    job = QuantJob(model=model, method="awq", calib_samples=blocks, calib_tokens=block_tokens, calib_packed=True)
    cal = CalibrationPass(net, calibration_token_ids(tok, job))
    for i in range(layer):
        cal.advance(net.layers[i])
    names = ["mlp.gate_up_proj", "mlp.down_proj", "self_attn.o_proj"]
    inputs, _ = cal.capture(net.layers[layer], names)
    x = {n: torch.cat(v) for n, v in inputs.items()}
    spec = QuantSpec(4, 64)
    mlp = copy.deepcopy(net.layers[layer].mlp)
    mlp.gate_up_proj, mlp.down_proj = peer.plain_linear(mlp.gate_up_proj), peer.plain_linear(mlp.down_proj)
    probe = copy.deepcopy(mlp)

    def mlp_block(ws):
        probe.gate_up_proj.weight.data.copy_(ws[0])
        return probe(x["mlp.gate_up_proj"])

    def autoawq_mlp():
        inspected = peer.copying_state_dict(copy.deepcopy(mlp))
        return peer.search_scales(x["mlp.gate_up_proj"], [inspected.gate_up_proj], inspected, duo_scaling=True)

    down = mlp.down_proj
    o_w = net.layers[layer].self_attn.o_proj.weight.detach().float().contiguous()
    cases = {
        "gate_up scale search (MLP inspected)": (
            lambda: search_scales(x["mlp.gate_up_proj"], [mlp.gate_up_proj.weight], mlp_block, spec, 20, True),
            autoawq_mlp),
        "down scale search": (
            lambda: search_scales(x["mlp.down_proj"], [down.weight],
                                  lambda ws: nn.functional.linear(x["mlp.down_proj"], ws[0]), spec, 20, True),
            lambda: peer.search_scales(x["mlp.down_proj"], [peer.copying_state_dict(copy.deepcopy(down))],
                                       duo_scaling=True)),
        "o_proj clip search (10 ratios)": (
            lambda: search_clip(o_w, x["self_attn.o_proj"], spec, n_grid=10, max_shrink=0.45, n_tokens=512),
            lambda: peer.clip_thresholds(o_w.clone(), x["self_attn.o_proj"])),
    }
    rows = []
    for name, (ours, theirs) in cases.items():
        lab_s, ref_s = _timed(ours), _timed(theirs)
        rows.append({"search": name, "tokens": x["mlp.down_proj"].shape[0], "lab_seconds": lab_s,
                     "autoawq_seconds": ref_s, "lab_over_autoawq": lab_s / ref_s})
    return rows


def heldout_perplexity(reference, models: dict, tokenizer, sequences: int, tokens: int) -> dict:
    """Perplexity of the reference and of each of `models` on the quantization study's held-out domains (code:
    standard-library files, prose: READMEs), with intervals over sequences, and GPTQModel's over the lab's on the
    same sequences (a paired ratio, null 1)."""
    from lab.eval.harness import heldout_texts
    from lab.eval.scores import ReferenceLogProbs, paired, score_sequences

    out = {}
    for domain, source in HELDOUT_DOMAINS.items():
        seqs = heldout_texts(tokenizer, sequences, tokens, 0, source=source)
        kept = ReferenceLogProbs(reference)  # the reference runs once a sequence, not once per model scored
        scores = {label: score_sequences(reference, m, seqs, cache=kept)
                  for label, m in {"reference": reference, **models}.items()}
        row = {label: s.perplexity().columns("value") for label, s in scores.items()}
        row["gptqmodel_over_lab"] = paired(scores["gptqmodel"], scores["lab"], "perplexity").columns("value")
        out[domain] = {**row, "sequences": len(seqs)}
    return out


def gptqmodel_side_by_side(reference, tokenizer, lab_model, lab_codes: dict, lab_seconds: float, spec, act_order,
                           calib: list[list[int]], layers=None, heldout_sequences: int = 16, heldout_tokens: int = 512,
                           recon_blocks: int = 16, device: str = "cpu") -> dict:
    """GPTQModel beside the lab's GPTQ (`lab.quant.gptqmodel_compare.compare`: time, per-layer output error) plus
    held-out perplexity; {"status": why not} where GPTQModel cannot run."""
    from lab.quant.gptqmodel_compare import compare

    result, models = compare(reference, tokenizer, lab_model, lab_codes, lab_seconds, spec, act_order, calib, layers,
                             recon_blocks, device)
    if models:
        result["perplexity"] = heldout_perplexity(reference, models, tokenizer, heldout_sequences, heldout_tokens)
    return result


def run_quant_bench(model: str = "smollm2-135m", gptq_blocks: int = 128, awq_blocks: int = 32,
                    block_tokens: int = 512, bits: int = 4, group_size: int = 64, progress: bool = False,
                    device: str = "auto", layers: tuple[int, ...] | None = None, gptqmodel: bool = True,
                    heldout_sequences: int = 16, heldout_tokens: int = 512) -> dict:
    """GPTQ then AWQ on `device` ("auto": CUDA when present, else the CPU; checked before any model loads).
    `layers` quantizes only those decoder layers (a quick run); the whole-model targets are then pro-rated by
    the share of layers quantized (every decoder layer has the same shapes, so each costs about the same).
    `gptqmodel`: GPTQModel quantizes the same model on the same blocks beside the lab's GPTQ, and both are measured
    (`lab.quant.gptqmodel_compare`; perplexity on `heldout_sequences` of `heldout_tokens` per held-out domain)."""
    from lab.models import load_model
    from lab.quant.pipeline import QuantJob, calibration_token_ids, quantize_model
    from lab.workflow.run import check_device, resolve_device

    check_device("device", device)
    where = str(resolve_device(device))
    busy = cpu_busy_fraction()
    rows, gptq_run = [], None
    for method, blocks in (("gptq", gptq_blocks), ("awq", awq_blocks)):
        net, tok = load_model(model, dtype=torch.float32, device=where)
        job = QuantJob(model=model, method=method, bits=bits, group_size=group_size, calib_samples=blocks,
                       calib_tokens=block_tokens, calib_packed=True, layers=layers)
        codes, summary = quantize_model(job, net, tok, progress=progress)
        seconds = summary["quantization_seconds"]
        target = TARGETS_S[method] * summary["layers"] / len(net.layers)
        rows.append(QuantBenchRow(method, summary["layers"], blocks, block_tokens, seconds, target, seconds / target))
        if method == "gptq":
            gptq_run = (net, codes, seconds, job)
    side_by_side = {"status": "not asked (gptqmodel=False)"}
    if gptqmodel:
        lab_net, codes, seconds, job = gptq_run
        reference, tok = load_model(model, dtype=torch.float32, device=where)
        side_by_side = gptqmodel_side_by_side(reference, tok, lab_net, codes, seconds, job.spec(), job.act_order,
                                              calibration_token_ids(tok, job), layers, heldout_sequences,
                                              heldout_tokens, device=where)
        side_by_side["subject"] = model
    from lab.quant import autoawq_peer

    missing = autoawq_peer.available()
    peer_rows = [] if missing else autoawq_peer_timing(model, awq_blocks, block_tokens, device=where)
    ceilings = probe_inference(torch.float32, where)  # the GEMM rate of the device the timings ran on
    return {"model": model, "bits": bits, "group_size": group_size, "model_layers": len(net.layers),
            "rows": [asdict(r) for r in rows],
            "autoawq": missing or "AutoAWQ 0.2.9 imports: its searches timed on the same layer and inputs",
            "autoawq_peer": peer_rows, "gptqmodel": side_by_side, "device": where, "device_name": ceilings.name,
            "gemm_gflops_fp32": ceilings.peak_flops / 1e9, "threads": torch.get_num_threads(),
            "cpu_busy_at_start": busy}


def format_result(r: dict) -> str:
    lines = [f"{r['model']} w{r['bits']}g{r['group_size']} on {r['device']} ({r['device_name']}), "
             f"{r['threads']} threads, fp32 GEMM {r['gemm_gflops_fp32']:.0f} GFLOP/s"]
    for row in r["rows"]:
        verdict = "within" if row["seconds"] <= row["target_seconds"] else "OVER"
        part = "" if row["layers"] == r["model_layers"] else f", {row['layers']} of {r['model_layers']} layers"
        lines.append(f"{row['method']:5s} {row['calib_blocks']:4d} x {row['calib_tokens']} tokens{part}: "
                     f"{row['seconds']:7.1f} s   target {row['target_seconds']:.0f} s   "
                     f"ratio {row['ratio_to_target']:.2f} ({verdict})")
    lines.append(f"AutoAWQ: {r['autoawq']}")
    for row in r["autoawq_peer"]:
        lines.append(f"  {row['search']:38s} lab {row['lab_seconds']:6.2f} s   AutoAWQ {row['autoawq_seconds']:6.2f} s"
                     f"   lab/AutoAWQ {row['lab_over_autoawq']:.2f}")
    if r.get("gptqmodel") is not None:  # results from before the GPTQModel side by side have none
        from lab.quant.gptqmodel_compare import format_comparison

        lines += format_comparison(r["gptqmodel"], r["model"])
    if r["cpu_busy_at_start"] is not None and r["cpu_busy_at_start"] > 0.25:
        lines.append(f"WARNING: the CPU was {100 * r['cpu_busy_at_start']:.0f}% busy before the run")
    return "\n".join(lines)
