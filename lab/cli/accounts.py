"""`lab memory` and `lab replay break-even`: accounts computed from a model's shape and a device's figures,
without running the model.
"""

from __future__ import annotations

import json


def _memory(args) -> int:
    from lab.memory import format_report, memory_report

    report = memory_report(args.model, weights=args.weights, kv_dtype=args.kv_dtype, seq_len=args.seq_len,
                           concurrency=args.concurrency, gpu=args.gpu, block_size=args.block_size,
                           utilization=args.utilization)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _replay_break_even(args) -> int:
    from dataclasses import asdict

    from lab.machine.hardware import GPUS
    from lab.memory import ModelShape
    from lab.replay.cost import break_even_table, window_cost

    args.model = args.model or ["llama-3-8b", "llama-2-7b", "deepseek-v3"]  # `append` options: defaults set here
    args.hardware = args.hardware or ["h100-sxm"]
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


def add_memory(sub) -> None:
    """`lab memory MODEL`"""
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


def add_replay(sub) -> None:
    """`lab replay break-even`"""
    rp = sub.add_parser("replay", help="replay (recompute a KV window vs load it)")
    rp_sub = rp.add_subparsers(dest="replay", required=True)
    be = rp_sub.add_parser("break-even", help="which side wins per model, accelerator and link (lab.replay.cost)")
    be.add_argument("--model", action="append", default=None,
                    help="a preset or config.json path; repeatable (default: llama-3-8b, llama-2-7b, deepseek-v3)")
    be.add_argument("--hardware", action="append", default=None, help="a GPU of lab.machine.hardware; repeatable "
                                                                      "(default: h100-sxm)")
    be.add_argument("--window", type=int, default=64)
    be.add_argument("--prefix", type=int, default=32768)
    be.add_argument("--efficiency", type=float, default=0.5, help="achieved share of peak FLOP/s (the article's 0.5)")
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=_replay_break_even)
