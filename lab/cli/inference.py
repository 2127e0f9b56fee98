"""`lab generate` and `lab serve`: the engine on prompts given on the command line, or behind an HTTP API."""

from __future__ import annotations

import argparse
import json


def _generate(args) -> int:
    from lab.engine import LLM, SamplingParams

    llm = LLM(args.model, max_model_len=args.max_model_len, dtype=args.dtype, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size, pipeline_parallel_size=args.pipeline_parallel_size)
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


def _serve(args) -> int:
    from lab.engine import LLM
    from lab.kv.format import parse_kv_cache_dtype
    from lab.serve import serve

    kv_format = parse_kv_cache_dtype(args.kv_cache_dtype)  # a bad format is refused before the model loads
    speculative = None
    if args.speculative:
        from lab.speculative import SpeculativeConfig
        speculative = SpeculativeConfig(k=args.num_speculative_tokens, method=args.speculative)
    llm = LLM(args.model, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
              enable_prefix_caching=not args.no_prefix_caching, enable_chunked_prefill=not args.no_chunked_prefill,
              kv_cache_dtype="auto" if kv_format is None else kv_format, speculative=speculative, dtype=args.dtype,
              enforce_eager=args.enforce_eager, tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    return serve(llm, args.served_model_name or args.model, args.host, args.port, warmup=args.warmup,
                 drain_timeout_s=args.drain_timeout, step_timeout_s=args.step_timeout,
                 failure_grace_s=args.failure_grace, exit_on_failure=not args.stay_up_on_failure)


def _engine_arguments(parser) -> None:
    """The options `lab generate` and `lab serve` share, spelled as vLLM spells them."""
    from lab.engine.config import DTYPES

    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bfloat16 where the CPU has bf16 matrix instructions (or on CUDA), else float32")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True,
                        help="eager steps (the default); --no-enforce-eager compiles them with torch.compile")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="split every layer over N processes (lab.parallel; gloo on the CPU, NCCL on CUDA)")
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                        help="split the layers into N stages, one process each (lab.parallel.pipeline)")


def add_generate(sub) -> None:
    """`lab generate PROMPT...`"""
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
    _engine_arguments(gen)
    gen.set_defaults(func=_generate)


def add_serve(sub) -> None:
    """`lab serve`"""
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
    sv.add_argument("--kv-cache-dtype", default="auto", help="auto, or a lab.kv format: fp8_e4m3, int8, ...")
    sv.add_argument("--speculative", choices=("ngram", "layerskip", "quantized"), default=None,
                    help="speculative decoding for every request (lab.speculative)")
    sv.add_argument("--num-speculative-tokens", type=int, default=4, help="k: drafts per round")
    sv.add_argument("--warmup", action="store_true",
                    help="run one tiny request first; /ready answers 503 until it has run, /health 200 throughout")
    sv.add_argument("--drain-timeout", type=float, default=30.0,
                    help="seconds SIGTERM lets the requests in flight run before aborting them (match Kubernetes' "
                         "terminationGracePeriodSeconds, less a few seconds)")
    sv.add_argument("--step-timeout", type=float, default=60.0,
                    help="a step running longer is a hang: the server reports itself failed")
    sv.add_argument("--failure-grace", type=float, default=5.0,
                    help="seconds the server answers 503 after its engine failed, before it exits with status 1")
    sv.add_argument("--stay-up-on-failure", action="store_true",
                    help="after an engine failure keep answering 503 instead of exiting (for debugging)")
    _engine_arguments(sv)
    sv.set_defaults(func=_serve)
