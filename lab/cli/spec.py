"""`lab spec`: speculative decoding's acceptance and speedup per task category (`lab.studies.spec_acceptance`)."""

from __future__ import annotations

import json
import sys


def _spec(args) -> int:
    import torch

    from lab.models import load_model
    from lab.speculative.prompts import LAB_PROMPTS
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


def add_spec(sub) -> None:
    """`lab spec`"""
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
