"""The `lab` console command: `lab generate`, `lab serve`, `lab bench engine|serve|quant`, the studies' CLIs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _generate(args) -> int:
    from lab.engine import LLM, SamplingParams

    llm = LLM(args.model, max_model_len=args.max_model_len)
    prompts = args.prompt
    if args.chat:
        if llm.tokenizer is None:
            raise SystemExit("--chat needs a model with a tokenizer")
        prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                     tokenize=False) for p in prompts]
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    for prompt, out in zip(args.prompt, llm.generate(prompts, params)):
        m = out.metrics
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.finish_reason, "metrics": m.as_dict()}))
            continue
        print(f"> {prompt}\n{out.text}")
        tpot = f"{1000 * m.tpot:.1f} ms" if m.tpot is not None else "n/a"
        print(f"[{len(out.prompt_token_ids)} prompt tokens ({m.num_cached_tokens} from the prefix cache), "
              f"{len(out.token_ids)} generated, finish: {out.finish_reason}; TTFT {1000 * m.ttft:.1f} ms, "
              f"TPOT {tpot}]\n")
    if not args.json:
        print(json.dumps(llm.stats()))
    return 0


def _bench_engine(args) -> int:
    from lab.bench.engine import as_dict, format_result, run_engine_bench
    from lab.provenance import provenance

    import torch

    result = run_engine_bench(num_requests=args.num_requests, max_tokens=args.max_tokens, model=args.model,
                              dtype=getattr(torch, args.dtype))
    print(format_result(result))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"result": as_dict(result), "provenance": provenance(vars(args) | {"command": "lab bench engine"})}
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


def _run(args) -> int:
    from lab.run_notebook import parse_value, run_notebook, study_notebooks

    params = {name: parse_value(value) for name, value in args.param}
    names = [p.stem for p in study_notebooks()] if args.notebook == "all" else [args.notebook]
    failed = []
    for name in names:
        print(f"running {name} ...", flush=True)
        try:
            print(run_notebook(name, params, root=args.results_dir, log_output=args.log_output))
        except ValueError:
            raise
        except Exception as e:  # a failing cell: report it, keep running the other notebooks
            print(f"{name} FAILED: {type(e).__name__}: {str(e)[-500:]}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _results(args) -> int:
    from lab.results_index import list_runs, write_index
    from lab.runs import results_root

    root = Path(args.results_dir) if args.results_dir else results_root()
    for r in list_runs(root):
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r["metrics"].items() if not isinstance(v, (list, dict)))
        print(f"{r['notebook']:28s} {r['run_id']:26s} {metrics}")
    print(f"index: {write_index(root)}")
    return 0


def _memory(args) -> int:
    from lab.memory import format_report, memory_report

    report = memory_report(args.model, weights=args.weights, kv_dtype=args.kv_dtype, seq_len=args.seq_len,
                           concurrency=args.concurrency, gpu=args.gpu, block_size=args.block_size,
                           utilization=args.utilization)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _bench_quant(args) -> int:
    from lab.bench.quant import format_result, run_quant_bench
    from lab.provenance import provenance

    result = run_quant_bench(model=args.model, gptq_blocks=args.gptq_blocks, awq_blocks=args.awq_blocks,
                             block_tokens=args.block_tokens, progress=True)
    print(format_result(result))
    if args.json:
        record = {"result": result, "provenance": provenance(vars(args) | {"command": "lab bench quant"})}
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0


def _quant(args) -> int:
    from lab.quant.pipeline import QuantJob, run_quant_job

    job = QuantJob(model=args.model, method=args.method, bits=args.bits,
                   group_size=None if args.group_size == 0 else args.group_size, symmetric=args.symmetric,
                   act_order=args.act_order, calib_samples=args.calib_samples, calib_tokens=args.calib_tokens,
                   calib_mix=args.calib_mix, calib_packed=args.calib_packed)
    print(json.dumps(run_quant_job(job, args.out), indent=2))
    return 0


def _eval(args) -> int:
    from lab.eval.harness import evaluate
    from lab.models import load_model

    path = Path(args.model)
    if (path / "config.json").exists() and "quantization_config" in json.loads((path / "config.json").read_text()):
        from lab.quant.formats import load_quantized

        model, tok = load_quantized(path)
    else:
        model, tok = load_model(args.model)
    reference = load_model(args.reference)[0] if args.reference else None
    kv = None
    if args.kv_cache_dtype:
        from lab.quant.kv import parse_format

        fmt, roles = parse_format(args.kv_cache_dtype)
        scales = None
        if fmt.static:
            from lab.quant.kv_calibration import KVScales, calibrate_kv_absmax

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
    print(json.dumps(report if args.json else summary, indent=2, default=str))
    return 0


def _replay_break_even(args) -> int:
    from dataclasses import asdict

    from lab.hardware import GPUS
    from lab.memory import ModelShape
    from lab.replay.cost import break_even_table, window_cost

    for name in args.hardware:
        if name not in GPUS:
            raise ValueError(f"unknown hardware {name!r}; known: {', '.join(sorted(GPUS))}")
    rows = break_even_table(args.model, args.hardware, args.window, args.prefix, args.efficiency)
    if args.json:
        costs = {m: asdict(window_cost(ModelShape.load(m), args.window, args.prefix)) for m in args.model}
        print(json.dumps({"window": args.window, "prefix": args.prefix, "efficiency": args.efficiency,
                          "costs": costs, "verdicts": [asdict(r) for r in rows]}, indent=2))
        return 0
    print(f"recompute {args.window} tokens after a {args.prefix}-token prefix (at {args.efficiency:.0%} of peak "
          f"FLOP/s, reading the weights and the prefix's KV), or load their KV?")
    print(f"{'model':<14} {'hardware':<15} {'link':<34} {'load ms':>9} {'recompute ms':>13} {'B* GB/s':>9}  winner")
    for r in rows:
        print(f"{r.model:<14} {r.hardware:<15} {r.link:<34} {1e3 * r.load_s:>9.3f} {1e3 * r.recompute_s:>13.3f} "
              f"{r.crossover_bandwidth / 1e9:>9.2f}  {r.winner}")
    return 0


def _spec(args) -> int:
    import torch

    from lab.models import load_model
    from lab.spec.prompts import LAB_PROMPTS
    from lab.studies import spec_acceptance as study

    p = study.SpecParams(DATA=args.data or "", PER_CATEGORY=args.per_category, MAX_TOKENS=args.max_tokens,
                         DRAFTERS=(args.drafter,), K=args.k, DRAFT_LAYERS=args.draft_layers,
                         DRAFT_QUANT=args.draft_quant, DRAFT_BITS=args.draft_bits, SWEEP_DRAFTERS=(),
                         SPEC_BENCH_DRAFTERS=(), REPEATS=args.repeats)
    prompts = study.task_prompts(p)  # a bad file is refused before the model loads
    model, tok = load_model(args.model, dtype=torch.float32, device="cpu")
    drafts = study.draft_models(p, model, tok)
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    table, _, costs = study.study(p, model, tok, prompts, p.DRAFTERS, p.K, drafts, log)
    table = table.drop(columns=["lossless"]).assign(lossless=table["lossless"])
    if args.json:
        print(json.dumps({"drafter": args.drafter, "k": args.k, "data": args.data or str(LAB_PROMPTS),
                          "target_step_s": costs[args.drafter].target_step_s,
                          "categories": table.to_dict(orient="records")}, indent=2, default=float))
        return 0
    cols = ["category", "requests", "a", "accepted/drafted (vLLM)", "mean_accepted_tokens_per_step", "c_effective",
            "v(k)", "predicted_article", "predicted_measured_costs", "measured_speedup", "lossless"]
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


def _serve(args) -> int:
    from lab.engine import LLM
    from lab.serve import serve

    speculative = None
    if args.speculative:
        from lab.spec import SpeculativeConfig
        speculative = SpeculativeConfig(k=args.num_speculative_tokens, method=args.speculative)
    llm = LLM(args.model, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
              enable_prefix_caching=not args.no_prefix_caching, enable_chunked_prefill=not args.no_chunked_prefill,
              kv_cache_dtype=args.kv_cache_dtype, speculative=speculative)
    if args.warmup:
        from lab.engine import SamplingParams
        llm.generate([[1] * 16], SamplingParams(max_tokens=2, ignore_eos=True))  # first-step costs paid here
    serve(llm, args.served_model_name or args.model, args.host, args.port)
    return 0


def _length(text: str):
    from lab.bench.serve import LengthDist

    parts = [int(x) for x in text.split(",")]
    if len(parts) == 1:
        return LengthDist(parts[0], parts[0], parts[0], fixed=True)
    if len(parts) != 3:
        raise ValueError(f"a length is N (fixed) or P50,P90,P99 (log-normal), got {text!r}")
    return LengthDist(*parts)


def _bench_serve(args) -> int:
    import math

    from lab.bench.serve import LoadConfig, run_load_sync

    cfg = LoadConfig(url=args.url.rstrip("/"), model=args.model, num_requests=args.num_requests,
                     rate=math.inf if args.rate in ("inf", "0") else float(args.rate), arrivals=args.arrivals,
                     max_concurrency=args.max_concurrency, input_len=_length(args.input_len),
                     output_len=_length(args.output_len), system_prompt_tokens=args.system_prompt_tokens,
                     max_model_len=args.max_model_len, vocab_size=args.vocab_size, duration_s=args.duration,
                     slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot, seed=args.seed,
                     scrape_interval_s=args.scrape_interval or None)
    report = run_load_sync(cfg)
    summary = report.summary()
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2, default=float) + "\n")
    if args.plot:
        from lab.bench.serve import plot_dashboard
        plot_dashboard(report, args.url).savefig(args.plot, dpi=110, bbox_inches="tight")
    width = max(map(len, summary))
    for k, v in summary.items():
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0 if summary["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lab", description="Inference Lab: a reference engine and studies.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one or more prompts and print the metrics")
    gen.add_argument("prompt", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--model", default="smollm2-135m", help="name, HF directory, .gguf path or random:<preset>")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-model-len", type=int, default=2048)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                     help="wrap each prompt in the model's chat template (default: on)")
    gen.add_argument("--json", action="store_true", help="one JSON line per prompt")
    gen.set_defaults(func=_generate)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    eng = bench_sub.add_parser("engine", help="the lab engine vs transformers.generate on one offline workload")
    eng.add_argument("--model", default="smollm2-135m")
    eng.add_argument("--num-requests", type=int, default=32)
    eng.add_argument("--max-tokens", type=int, default=128)
    eng.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                     help="weights and activations of both engines (default float32, the reference workload)")
    eng.add_argument("--json", default=None, help="also write the result with provenance to this JSON file")
    eng.set_defaults(func=_bench_engine)
    bs = bench_sub.add_parser("serve", help="load an OpenAI-compatible server (the lab's, vLLM, SGLang): TTFT, "
                                            "TPOT, percentiles, throughput, goodput (lab.bench.serve)")
    bs.add_argument("--url", default="http://127.0.0.1:8000")
    bs.add_argument("--model", default="smollm2-135m", help="the served model name")
    bs.add_argument("--num-requests", type=int, default=64)
    bs.add_argument("--rate", default="inf", help="requests per second ('inf': all at once)")
    bs.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    bs.add_argument("--max-concurrency", type=int, default=None)
    bs.add_argument("--input-len", default="128,384,768", help="N (fixed) or P50,P90,P99 of a log-normal")
    bs.add_argument("--output-len", default="32,64,96", help="N (fixed) or P50,P90,P99 of a log-normal")
    bs.add_argument("--system-prompt-tokens", type=int, default=0, help="a prefix shared by every request")
    bs.add_argument("--max-model-len", type=int, default=2048, help="the server's; every request must fit")
    bs.add_argument("--vocab-size", type=int, default=49152, help="prompt token ids are drawn below this")
    bs.add_argument("--duration", type=float, default=600.0, help="seconds; unfinished requests are cancelled")
    bs.add_argument("--slo-ttft", type=float, default=2.0, help="goodput: TTFT at most this many seconds")
    bs.add_argument("--slo-tpot", type=float, default=0.2, help="goodput: TPOT at most this many seconds")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--scrape-interval", type=float, default=0.5, help="seconds between /metrics polls (0: none)")
    bs.add_argument("--json", default=None, help="write the report (config, summary, requests, scrapes) here")
    bs.add_argument("--plot", default=None, help="write the dashboard (latency, throughput, engine state) PNG here")
    bs.set_defaults(func=_bench_serve)

    bq = bench_sub.add_parser("quant", help="GPTQ and AWQ time on the whole model at the reference sizes")
    bq.add_argument("--model", default="smollm2-135m")
    bq.add_argument("--gptq-blocks", type=int, default=128)
    bq.add_argument("--awq-blocks", type=int, default=32)
    bq.add_argument("--block-tokens", type=int, default=512)
    bq.add_argument("--json", default=None, help="also write the result and its provenance here")
    bq.set_defaults(func=_bench_quant)

    run = sub.add_parser("run", help="execute a study notebook (or 'all') through papermill into results/")
    run.add_argument("notebook", help="e.g. 00_engine_tour, or 'all' for every study notebook")
    run.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="set a parameter (a Python literal, else a string); repeatable")
    run.add_argument("--results-dir", default=None, help="where run directories go (default: results/)")
    run.add_argument("--log-output", action="store_true", help="stream the notebook's output to this terminal")
    run.set_defaults(func=_run)

    mem = sub.add_parser("memory", help="memory account of a model: parameters, weights, KV cache, capacity")
    mem.add_argument("model", help="a preset (e.g. llama-3-70b) or a config.json path")
    mem.add_argument("--weights", default="bf16", help="fp32, bf16, fp8, int8, int4-g128[-asym], gguf-q4_0, ...")
    mem.add_argument("--kv-dtype", default="bf16", help="bf16, fp8, int8, int4, int2")
    mem.add_argument("--seq-len", type=int, default=8192)
    mem.add_argument("--concurrency", type=int, default=1)
    mem.add_argument("--gpu", default=None, help="a100-sxm-80gb, h100-sxm, h200, l40s, rtx-4090, ...")
    mem.add_argument("--block-size", type=int, default=16)
    mem.add_argument("--utilization", type=float, default=0.9)
    mem.add_argument("--json", action="store_true")
    mem.set_defaults(func=_memory)

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
    q.add_argument("--out", required=True, help="output directory (Hugging Face style, with quantization_config)")
    q.set_defaults(func=_quant)

    ev = sub.add_parser("eval", help="perplexity, agreement with a reference, and the sensitive-sample checks")
    ev.add_argument("model", help="a model name or directory, or a checkpoint written by `lab quant`")
    ev.add_argument("--suite", choices=["ppl", "sensitive", "all"], default="ppl")
    ev.add_argument("--reference", default=None, help="unquantized model to compare logits and outputs against")
    ev.add_argument("--json", action="store_true", help="the full report, per-item rows included")
    ev.add_argument("--kv-cache-dtype", default=None,
                    help="run with a quantized KV cache, e.g. int4/per-token, fp8_e4m3/per-tensor, int4/per-token/"
                         "k-only, int2/per-channel/group16/window128 (KIVI) (lab.quant.kv.parse_format); compared "
                         "with the exact cache")
    ev.add_argument("--kv-scales", default=None,
                    help="static formats: a KVScales file, or 'unit' for vLLM's default scale 1.0; default: "
                         "calibrate on 32 stratified calibration samples")
    ev.set_defaults(func=_eval)

    rp = sub.add_parser("replay", help="replay (recompute a KV window vs load it)")
    rp_sub = rp.add_subparsers(dest="replay", required=True)
    be = rp_sub.add_parser("break-even", help="which side wins per model, accelerator and link (lab.replay.cost)")
    be.add_argument("--model", action="append", default=None,
                    help="a preset or config.json path; repeatable (default: llama-3-8b, llama-2-7b, deepseek-v3)")
    be.add_argument("--hardware", action="append", default=None, help="a GPU of lab.hardware; repeatable "
                                                                      "(default: h100-sxm)")
    be.add_argument("--window", type=int, default=64)
    be.add_argument("--prefix", type=int, default=32768)
    be.add_argument("--efficiency", type=float, default=0.5, help="achieved share of peak FLOP/s (the article's 0.5)")
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=_replay_break_even)

    sp = sub.add_parser("spec", help="speculative decoding: acceptance and speedup per task category, measured "
                                     "at batch 1 against plain decoding (lab.studies.spec_acceptance)")
    sp.add_argument("--drafter", choices=("ngram", "layerskip", "quantized"), default="ngram")
    sp.add_argument("--k", type=int, default=4, help="drafts per round")
    sp.add_argument("--data", default=None, help="a JSONL of prompts: the lab's format (id, category, prompt) or "
                                                 "Spec-Bench's question.jsonl; default: calibration_data/"
                                                 "spec_prompts.jsonl")
    sp.add_argument("--per-category", type=int, default=5)
    sp.add_argument("--max-tokens", type=int, default=64)
    sp.add_argument("--draft-layers", type=int, default=10, help="layerskip: the target's first N layers")
    sp.add_argument("--draft-quant", default="rtn", help="quantized: rtn, gptq or awq")
    sp.add_argument("--draft-bits", type=int, default=4)
    sp.add_argument("--repeats", type=int, default=5, help="timing repeats of the step-cost forwards")
    sp.add_argument("--model", default="smollm2-135m")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=_spec)

    sv = sub.add_parser("serve", help="serve a model behind an OpenAI-compatible HTTP API (lab.serve)")
    sv.add_argument("--model", default="smollm2-135m")
    sv.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--max-model-len", type=int, default=2048)
    sv.add_argument("--max-num-seqs", type=int, default=32)
    sv.add_argument("--max-num-batched-tokens", type=int, default=2048)
    sv.add_argument("--num-kv-blocks", type=int, default=None)
    sv.add_argument("--no-prefix-caching", action="store_true")
    sv.add_argument("--no-chunked-prefill", action="store_true")
    sv.add_argument("--kv-cache-dtype", default="auto", help="auto, or a lab.quant.kv format: fp8_e4m3, int8, ...")
    sv.add_argument("--speculative", choices=("ngram", "layerskip", "quantized"), default=None,
                    help="speculative decoding for every request (lab.spec)")
    sv.add_argument("--num-speculative-tokens", type=int, default=4, help="k: drafts per round")
    sv.add_argument("--warmup", action="store_true", help="run one tiny request before accepting traffic")
    sv.set_defaults(func=_serve)

    res = sub.add_parser("results", help="list study runs with their key metrics and refresh results/README.md")
    res.add_argument("--results-dir", default=None)
    res.set_defaults(func=_results)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "replay", None) == "break-even":
        args.model = args.model or ["llama-3-8b", "llama-2-7b", "deepseek-v3"]
        args.hardware = args.hardware or ["h100-sxm"]
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
