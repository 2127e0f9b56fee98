"""`lab bench engine|serve|quant|machine`: the benchmarks of `lab.bench`, with provenance when written to JSON."""

from __future__ import annotations

import json
from pathlib import Path


def _bench_engine(args) -> int:
    from lab.bench.caselog import CaseLog
    from lab.bench.engine import run_engine_bench
    from lab.bench.engine_report import format_result, plot_fractions, targets
    from lab.workflow.provenance import provenance

    peers = [p for p in args.peer.split(",") if p]
    if unknown := [p for p in peers if p != "vllm"]:
        raise ValueError(f"--peer {','.join(unknown)}: the peers run in the same process tree are of ['vllm'] "
                         f"(a running server: --peer-url)")
    if peers:
        from lab.bench.vllm_peer import vllm_python

        vllm_python()  # refused before anything is built, with what to run
    result = run_engine_bench(model=args.model, variants=args.variants.split(","), workloads=args.workloads.split(","),
                              transformers_dtypes=[d for d in args.transformers.split(",") if d],
                              peer_url=args.peer_url, peer_model=args.peer_model, scale=args.scale,
                              max_tokens=args.max_tokens, profile_dir=args.profile,
                              log=CaseLog(Path(args.json).with_suffix(".jsonl") if args.json else None),
                              backends=tuple(b for b in args.backend.split(",") if b), rounds=args.rounds,
                              vllm_dtypes=[d for d in args.peer_dtypes.split(",") if d] if peers else ())
    result["targets"] = targets(result)
    print(format_result(result))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"result": result, "provenance": provenance(vars(args) | {"command": "lab bench engine"})}
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {path}")
    if args.plot:
        plot_fractions(result).savefig(args.plot, dpi=110, bbox_inches="tight")
        print(f"wrote {args.plot}")
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
        from lab.bench.dashboard import plot_dashboard
        plot_dashboard(report, args.url).savefig(args.plot, dpi=110, bbox_inches="tight")
    width = max(map(len, summary))
    for k, v in summary.items():
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0 if summary["ok"] else 1


def _bench_quant(args) -> int:
    from lab.bench.quant import format_result, run_quant_bench
    from lab.workflow.provenance import provenance

    result = run_quant_bench(model=args.model, gptq_blocks=args.gptq_blocks, awq_blocks=args.awq_blocks,
                             block_tokens=args.block_tokens, progress=True, device=args.device, layers=args.layers)
    print(format_result(result))
    if args.json:
        record = {"result": result, "provenance": provenance(vars(args) | {"command": "lab bench quant"})}
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0


def _bench_machine(args) -> int:
    """This machine's ceilings now (`lab.machine.hardware.probe_inference`): what a time measured in this hour is
    to be read beside, since this machine's speed moves 2x between hours."""
    import torch

    from lab.machine.hardware import cpu_model, cpu_signature, describe_cpu, probe_inference
    from lab.models.loader import default_dtype, parse_dtype

    for name in args.dtypes.split(","):
        dtype = parse_dtype(name) or default_dtype("cpu")  # "auto": the serving dtype
        h = probe_inference(dtype, seconds_budget=args.seconds)
        print(f"machine probe ({str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads): matmul "
              f"{h.peak_flops / 1e9:.0f} GFLOP/s, weight-shaped GEMV read {h.mem_bandwidth / 1e9:.1f} GB/s")
    print(f"  on {describe_cpu(cpu_model(), cpu_signature())}")  # the name alone hides AMX
    return 0


def add_bench(sub) -> None:
    """`lab bench engine|serve|quant`"""
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    from lab.bench.engine import VARIANTS
    from lab.bench.workloads import WORKLOADS

    eng = bench_sub.add_parser("engine", help="the engine against this machine's roofline and its peers "
                                              "(transformers; any OpenAI-compatible server) on three workloads")
    eng.add_argument("--model", default="smollm2-135m")
    eng.add_argument("--variants", default=",".join(VARIANTS), help=f"engine variants, of {list(VARIANTS)}")
    eng.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {list(WORKLOADS)}")
    eng.add_argument("--transformers", default="float32,auto",
                     help="dtypes to run transformers.generate in ('' for none; auto: the serving dtype)")
    eng.add_argument("--peer-url", default=None, help="also time an OpenAI-compatible server (e.g. a vLLM you "
                                                      "started) on the same workloads")
    eng.add_argument("--peer", default="", help="peers run beside the engine in the same rounds: vllm (vLLM's CPU "
                                                "build in its own environment: `make vllm`)")
    eng.add_argument("--peer-dtypes", default="auto", help="the dtypes --peer runs in (auto: the serving dtype)")
    eng.add_argument("--rounds", type=int, default=3, help="every contender is timed once a round, interleaved; "
                                                            "each ratio is the median over rounds, with its span")
    eng.add_argument("--peer-model", default=None, help="the model name that server serves (default --model)")
    eng.add_argument("--scale", type=float, default=1.0, help="shrink the long prompt, the verification's "
                     "256-token context and the 3-s ceilings probe (smoke runs)")
    eng.add_argument("--max-tokens", type=int, default=None, help="cap every workload's tokens out (smoke runs)")
    eng.add_argument("--backend", default="torch", help="attention backend(s), of torch,triton (comma-separated: "
                                                        "each variant on each; triton times the lab's kernels)")
    eng.add_argument("--json", default=None, help="also write the result with provenance to this JSON file, and "
                                                  "each workload as it finishes to the same name in .jsonl")
    eng.add_argument("--plot", default=None, help="write the fractions of the roofline as a PNG here")
    eng.add_argument("--profile", default=None, metavar="DIR",
                     help="after timing, run each engine workload once under torch.profiler and write its "
                          "per-operator breakdown (<variant>__<workload>.csv and .txt) here, then once under "
                          "cProfile for its Python by source file (<variant>__<workload>__python.csv)")
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

    bm = bench_sub.add_parser("machine", help="this machine's ceilings now (matmul GFLOP/s, GEMV read GB/s): "
                                              "read a time measured this hour beside them")
    bm.add_argument("--dtypes", default="bfloat16", help="comma-separated dtypes to probe")
    bm.add_argument("--seconds", type=float, default=2.0, help="probe budget per dtype")
    bm.set_defaults(func=_bench_machine)

    from lab.cli.quant import device_arg, layer_list

    bq = bench_sub.add_parser("quant", help="GPTQ and AWQ time on the whole model at the reference sizes")
    bq.add_argument("--model", default="smollm2-135m")
    bq.add_argument("--gptq-blocks", type=int, default=128)
    bq.add_argument("--awq-blocks", type=int, default=32)
    bq.add_argument("--block-tokens", type=int, default=512)
    bq.add_argument("--device", type=device_arg, default="auto",
                    help="where to quantize: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N")
    bq.add_argument("--layers", type=layer_list, default=None,
                    help="quantize only these decoder layers, e.g. 0,1 (a quick run; the targets are pro-rated)")
    bq.add_argument("--json", default=None, help="also write the result and its provenance here")
    bq.set_defaults(func=_bench_quant)
