"""`lab bench engine`: the lab engine against `transformers.generate` on one offline workload.

Both run in the same process, on the same weights, the same chat-formatted prompts and the same
number of new tokens (greedy, EOS ignored), so the ratio of their tokens/s is a fair comparison.
The machine's fp32 GEMM rate is measured in the same run and the engine's achieved FLOP/s (2 x
matmul parameters x tokens, plus attention) is reported as a fraction of it: how far the engine is
from what the hardware does on large matrices.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "compound interest", "the immune system",
    "plate tectonics", "how vaccines work", "the Roman Empire", "machine learning", "climate change",
    "the water cycle", "supply and demand", "quantum entanglement", "the printing press", "DNA replication",
    "the stock market", "volcanoes", "the theory of evolution", "renewable energy", "the human brain",
    "the Internet", "jazz music", "the Great Wall of China", "antibiotics", "electric cars",
    "the Moon landing", "coral reefs", "inflation", "the Renaissance", "earthquakes", "honeybees", "tides",
]


def workload_prompts(tokenizer, n: int) -> list[str]:
    """n chat-formatted questions (cycling through TOPICS), as a user would send them."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} in a few "
                                            f"sentences."}], add_generation_prompt=True, tokenize=False)
            for i in range(n)]


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """Share of all CPUs' time spent busy over `seconds` (from /proc/stat; None where it does not exist)."""
    def snapshot():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    try:
        idle0, total0 = snapshot()
        time.sleep(seconds)
        idle1, total1 = snapshot()
    except OSError:
        return None
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def measure_gemm_flops(n: int = 1024, repeats: int = 10, dtype=torch.float32) -> float:
    """Achieved FLOP/s of an n x n x n matmul on this machine's default device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - t)


def forward_flops(model, num_tokens: int, total_context: int) -> float:
    """2 x (matmul parameters) per token, the LM head counted only for sampled rows, plus attention.

    `total_context` is the sum over processed tokens of the number of keys each attended to.
    """
    c = model.config
    per_layer = sum(m.weight.numel() for m in (model.layers[0].self_attn.qkv_proj, model.layers[0].self_attn.o_proj,
                                              model.layers[0].mlp.gate_up_proj, model.layers[0].mlp.down_proj))
    attn = 4 * c.num_attention_heads * c.head_dim * total_context * c.num_hidden_layers  # QK^T and PV
    return 2 * per_layer * c.num_hidden_layers * num_tokens + attn


@dataclass
class EngineBenchResult:
    num_requests: int
    max_tokens: int
    dtype: str
    prompt_tokens: int
    engine_seconds: float
    engine_tokens_per_s: float
    transformers_seconds: float
    transformers_tokens_per_s: float
    ratio: float
    gemm_flops: float
    engine_flops: float
    engine_fraction_of_gemm: float
    torch_threads: int
    cpu_busy_at_start: float | None  # share of CPU time busy in the second before: timings mean little when high


def run_engine_bench(num_requests: int = 32, max_tokens: int = 128, model: str = "smollm2-135m",
                     dtype: torch.dtype = torch.float32) -> EngineBenchResult:
    from transformers import AutoModelForCausalLM

    from lab.engine import LLM, SamplingParams
    from lab.models import resolve_model_dir

    busy = cpu_busy_fraction()
    llm = LLM(model, dtype=dtype, max_num_seqs=num_requests, num_kv_blocks=num_requests * 64)
    tok = llm.tokenizer
    prompts = workload_prompts(tok, num_requests)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    llm.block_manager.reset_prefix_cache()  # no hits carried over from the warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    engine_s = time.perf_counter() - t
    n_prompt = sum(len(o.prompt_token_ids) for o in outs)
    new_tokens = sum(len(o.token_ids) for o in outs)
    # Keys attended: each prompt token sees its prefix, each decode token its whole context.
    context = sum(p * (p + 1) // 2 + sum(p + i for i in range(1, len(o.token_ids)))
                  for o in outs for p in [len(o.prompt_token_ids)])
    engine_flops = forward_flops(llm.model, n_prompt + new_tokens - num_requests, context) / engine_s

    hf = AutoModelForCausalLM.from_pretrained(resolve_model_dir(model), dtype=dtype).eval()
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        hf.generate(**tok(prompts[:2], return_tensors="pt", padding=True, add_special_tokens=False),
                    max_new_tokens=4, do_sample=False)  # warm-up
        t = time.perf_counter()
        hf_out = hf.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
        hf_s = time.perf_counter() - t
    hf_new = (hf_out.shape[1] - batch["input_ids"].shape[1]) * num_requests
    gemm = measure_gemm_flops(dtype=dtype)
    return EngineBenchResult(
        num_requests=num_requests, max_tokens=max_tokens, dtype=str(dtype).removeprefix("torch."),
        prompt_tokens=n_prompt,
        engine_seconds=engine_s, engine_tokens_per_s=new_tokens / engine_s,
        transformers_seconds=hf_s, transformers_tokens_per_s=hf_new / hf_s,
        ratio=(new_tokens / engine_s) / (hf_new / hf_s), gemm_flops=gemm, engine_flops=engine_flops,
        engine_fraction_of_gemm=engine_flops / gemm, torch_threads=torch.get_num_threads(),
        cpu_busy_at_start=busy,
    )


def format_result(r: EngineBenchResult) -> str:
    busy = r.cpu_busy_at_start is not None and r.cpu_busy_at_start > 0.25
    return "\n".join([
        f"workload: {r.num_requests} requests x {r.max_tokens} new tokens, greedy, {r.dtype}, "
        f"{r.prompt_tokens} prompt tokens",
        f"lab engine    : {r.engine_tokens_per_s:8.1f} tokens/s ({r.engine_seconds:.2f} s)",
        f"transformers  : {r.transformers_tokens_per_s:8.1f} tokens/s ({r.transformers_seconds:.2f} s)",
        f"ratio         : {r.ratio:8.2f}x (engine / transformers)",
        f"GEMM rate     : {r.gemm_flops / 1e9:8.1f} GFLOP/s ({r.dtype} 1024^3 matmul, {r.torch_threads} threads)",
        f"engine FLOP/s : {r.engine_flops / 1e9:8.1f} GFLOP/s = {100 * r.engine_fraction_of_gemm:.0f}% of the GEMM rate",
        f"CPU busy      : {100 * (r.cpu_busy_at_start or 0):7.0f}% in the second before the run"
        + (" -- WARNING: other processes were running; OpenMP threads contend and these timings are unreliable"
           if busy else ""),
    ])


def as_dict(r: EngineBenchResult) -> dict:
    return asdict(r)
