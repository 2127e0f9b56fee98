"""`lab quant` and `lab eval`: quantize a model into a checkpoint, and evaluate a model or checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def device_arg(text: str) -> str:
    """A `--device` value checked as the parser reads it ("auto", "cpu", "cuda", "cuda:N"; CUDA only where it
    exists), so a bad one fails before any model loads."""
    from lab.workflow.run import check_device

    try:
        check_device("--device", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def layer_list(text: str) -> tuple[int, ...]:
    """`--layers 0,1,5`: decoder layer indices, checked as the parser reads them."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers {text!r}: expected comma-separated layer indices, e.g. 0,1,5") \
            from None


def _quant(args) -> int:
    from lab.quant.pipeline import QuantJob, run_quant_job

    job = QuantJob(model=args.model, method=args.method, bits=args.bits,
                   group_size=None if args.group_size == 0 else args.group_size, symmetric=args.symmetric,
                   act_order=args.act_order, calib_samples=args.calib_samples, calib_tokens=args.calib_tokens,
                   calib_mix=args.calib_mix, calib_packed=args.calib_packed, layers=args.layers)
    print(json.dumps(run_quant_job(job, args.out, device=args.device), indent=2))
    return 0


def _eval(args) -> int:
    from lab.eval.harness import evaluate
    from lab.models import load_model
    from lab.workflow.run import json_safe

    import torch

    path = Path(args.model)
    # Accuracy is a small numerical difference: evaluated in float32, whatever the serving dtype.
    from lab.quant.formats import is_quantized, load_quantized

    if is_quantized(path):  # config.json's quantization_config, or AutoGPTQ's quantize_config.json alone
        model, tok = load_quantized(path, dtype=torch.float32)
    else:
        model, tok = load_model(args.model, dtype=torch.float32)
    reference = load_model(args.reference, dtype=torch.float32)[0] if args.reference else None
    kv = None
    if args.kv_cache_dtype:
        from lab.kv.format import parse_format

        fmt, roles = parse_format(args.kv_cache_dtype)
        scales = None
        if fmt.static:
            from lab.kv.calibration import KVScales, calibrate_kv_absmax

            if args.kv_scales == "unit":
                scales = KVScales.unit(model, fmt)
            elif args.kv_scales:
                scales = KVScales.load(args.kv_scales)
            else:
                from lab.quant.calibration import build_calibration_set

                calib = build_calibration_set(tok, n_samples=32, max_tokens=512)
                scales = calibrate_kv_absmax(model, [list(x) for x in calib["input_ids"]])
        kv = (fmt, scales, roles)
    report = evaluate(model, tok, suite=args.suite, reference=reference, kv=kv)
    summary = {"ppl": report.get("ppl"), "sensitive_pass_rates": report.get("sensitive", {}).get("pass_rates")}
    # json_safe: one sequence gives NaN interval bounds, printed as null (strict JSON)
    print(json.dumps(json_safe(report if args.json else summary), indent=2, default=str))
    return 0


def add_quant(sub) -> None:
    """`lab quant [MODEL] --out DIR`"""
    q = sub.add_parser("quant", help="quantize a model's linear layers (RTN, GPTQ, AWQ) and save a checkpoint")
    q.add_argument("model", nargs="?", default="smollm2-135m")
    q.add_argument("--method", choices=["rtn", "gptq", "awq"], default="gptq")
    q.add_argument("--bits", type=int, default=4)
    q.add_argument("--group-size", type=int, default=64, help="32, 64, 128, or 0 for one scale per output channel")
    q.add_argument("--symmetric", action="store_true")
    q.add_argument("--act-order", action="store_true", help="GPTQ: quantize columns by descending Hessian diagonal")
    q.add_argument("--calib-samples", type=int, default=128)
    q.add_argument("--calib-tokens", type=int, default=512)
    q.add_argument("--calib-mix", choices=["stratified", "short_qa"], default="stratified")
    q.add_argument("--calib-packed", action="store_true",
                   help="calibrate on CALIB_SAMPLES blocks of exactly CALIB_TOKENS tokens (GPTQ's and AutoAWQ's layout)")
    q.add_argument("--layers", type=layer_list, default=None,
                   help="decoder layers to quantize, e.g. 0,1,5 (default: all); the others are saved unquantized")
    q.add_argument("--device", type=device_arg, default="auto",
                   help="where to quantize: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N")
    q.add_argument("--out", required=True, help="output directory (Hugging Face style, with quantization_config)")
    q.set_defaults(func=_quant)


def add_eval(sub) -> None:
    """`lab eval MODEL`"""
    ev = sub.add_parser("eval", help="perplexity, agreement with a reference, and the sensitive-sample checks")
    ev.add_argument("model", help="a model name or directory, or a checkpoint written by `lab quant`")
    ev.add_argument("--suite", choices=["ppl", "sensitive", "all"], default="ppl")
    ev.add_argument("--reference", default=None, help="unquantized model to compare logits and outputs against")
    ev.add_argument("--json", action="store_true", help="the full report, per-item rows included")
    ev.add_argument("--kv-cache-dtype", default=None,
                    help="run with a quantized KV cache, e.g. int4/per-token, fp8_e4m3/per-tensor, int4/per-token/"
                         "k-only, int2/per-channel/group16/window128 (KIVI) (lab.kv.format.parse_format); compared "
                         "with the exact cache")
    ev.add_argument("--kv-scales", default=None,
                    help="static formats: a KVScales file, or 'unit' for vLLM's default scale 1.0; default: "
                         "calibrate on 32 stratified calibration samples")
    ev.set_defaults(func=_eval)
