"""The engine tour (notebook 00): one batch of requests followed through tokenize, schedule, allocate,
prefill, decode and a prefix-cache hit on a repeated system prompt, with the KV pool over time.

The notebook only calls these functions; every number it shows is measured on the lab engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from lab.engine import LLM, SamplingParams
from lab.engine.trace import traced_generate
from lab.figures.style import PALETTE, legend_outside
from lab.workflow.run import as_tuple, check_device, check_model, check_range, resolve_device

SYSTEM_PROMPT = ("You are a concise assistant for an inference-optimization lab. Answer in at most three "
                 "sentences, prefer numbers to adjectives, and say when you are unsure.")
QUESTIONS = [
    "What is a KV cache?", "Why is decoding memory-bound?", "What does paged attention change?",
    "What is continuous batching?", "Why chunk a long prefill?", "What is prefix caching good for?",
    "When does recomputation beat loading?", "What limits speculative decoding?",
    "What is time to first token?", "What is goodput?", "Why quantize weights to 4 bits?",
    "Is an FP8 KV cache safe?",
]


@dataclass
class TourParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where the engine runs: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"
    MODEL: str = "smollm2-135m"
    NUM_REQUESTS: int = 8
    MAX_TOKENS: int = 48
    BLOCK_SIZE: int = 16
    NUM_KV_BLOCKS: int = 20  # small on purpose: the pool fills and the scheduler has to preempt
    MAX_NUM_SEQS: int = 4
    MAX_NUM_BATCHED_TOKENS: int = 64
    TTFT_REPEATS: int = 5  # alone-request TTFT, prefix miss then hit
    BUDGETS: tuple = (16, 32, 64, 128, 256)  # the token-budget sweep (and the widget's slider)
    # The tour is short at reference size already; smoke is seconds: few requests, few tokens. gpu: the tour at
    # serving batch: every question running at once with up to 64-token answers, a pool that still fills and
    # preempts (40 blocks; unbounded, the batch peaks near 55 as most answers stop early), token budgets up to
    # 2048 a step, and TTFT medians over 20 repeats, which a GPU's small run-to-run spread lets show a prefix
    # hit's saving. ~12 s on one H200: 6 batches of 70-110 SmolLM2 steps (counted on the CPU) at ~6 ms, 40
    # one-step TTFT requests; 8 s start.
    PRESETS: ClassVar[dict] = {
        "quick": {"TTFT_REPEATS": 3, "BUDGETS": (16, 64, 256)},
        "smoke": {"NUM_REQUESTS": 3, "MAX_TOKENS": 8, "TTFT_REPEATS": 1, "BUDGETS": (16, 64)},
        "gpu": {"NUM_REQUESTS": len(QUESTIONS), "MAX_TOKENS": 64, "NUM_KV_BLOCKS": 40,
                "MAX_NUM_SEQS": len(QUESTIONS), "MAX_NUM_BATCHED_TOKENS": 256, "TTFT_REPEATS": 20,
                "BUDGETS": (32, 256, 2048)},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_model("MODEL", self.MODEL, self.DEVICE, needs_tokenizer="the tour's requests are text",
                    needs_chat_template="the tour's requests are chat conversations")
        check_range("NUM_REQUESTS", self.NUM_REQUESTS, 1, len(QUESTIONS), int)
        check_range("MAX_TOKENS", self.MAX_TOKENS, 1, 1024, int)
        check_range("BLOCK_SIZE", self.BLOCK_SIZE, 1, 256, int)
        check_range("NUM_KV_BLOCKS", self.NUM_KV_BLOCKS, 1, None, int)
        check_range("MAX_NUM_SEQS", self.MAX_NUM_SEQS, 1, 256, int)
        check_range("MAX_NUM_BATCHED_TOKENS", self.MAX_NUM_BATCHED_TOKENS, 1, None, int)
        check_range("TTFT_REPEATS", self.TTFT_REPEATS, 1, 100, int)
        self.BUDGETS = as_tuple("BUDGETS", self.BUDGETS)
        for b in self.BUDGETS:
            check_range("BUDGETS", b, 1, None, int)


def make_engine(p: TourParams, model=None, tokenizer=None, **overrides) -> LLM:
    kw = dict(block_size=p.BLOCK_SIZE, num_kv_blocks=p.NUM_KV_BLOCKS, max_num_seqs=p.MAX_NUM_SEQS,
              max_num_batched_tokens=p.MAX_NUM_BATCHED_TOKENS, max_model_len=1024,
              device=resolve_device(p.DEVICE)) | overrides
    return LLM(model if model is not None else p.MODEL, tokenizer=tokenizer, **kw)


def chat_prompts(tokenizer, n: int) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                           {"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=False) for q in QUESTIONS[:n]]


def token_table(tokenizer, text: str) -> pd.DataFrame:
    """Each token of `text`: position, id, and the piece of text it stands for."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return pd.DataFrame({"position": range(len(ids)), "token_id": ids,
                         "piece": [tokenizer.decode([i]) for i in ids]})


def block_table_view(llm: LLM) -> pd.DataFrame:
    """The block table of every running sequence, with how many of its tokens have KV computed."""
    rows = [{"request": s.request_id, "tokens": s.num_tokens, "computed": s.num_computed_tokens,
             "blocks": list(s.block_table)} for s in llm.view().running]
    return pd.DataFrame(rows)


def run_batch(llm: LLM, prompts, max_tokens: int):
    """Greedy generation with a step trace; returns (per-request DataFrame, per-step DataFrame)."""
    outs, steps = traced_generate(llm, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    requests = pd.DataFrame([{
        "request": o.request_id, "prompt_tokens": len(o.prompt_token_ids),
        "cached_tokens": o.metrics.num_cached_tokens, "output_tokens": len(o.token_ids),
        "ttft_ms": 1000 * o.metrics.ttft, "tpot_ms": None if o.metrics.tpot is None else 1000 * o.metrics.tpot,
        "preemptions": o.metrics.num_preemptions, "finish": o.finish_reason, "text": o.text,
    } for o in outs])
    return requests, pd.DataFrame(steps)


def cached_rerun_outputs(p: TourParams, tokenizer, prompts, dtype: str) -> pd.DataFrame:
    """The batch twice in one engine of `dtype` on DEVICE, the second time from the prefix cache: per request,
    whether the greedy tokens are equal and the first output position where they differ. A cached prefix
    changes which tokens each step computes, so the shapes of its matrix products and their rounding; in
    bfloat16 that can flip a near-tie, and greedy decoding then follows another path."""
    llm = make_engine(p, model=p.MODEL, tokenizer=tokenizer, dtype=dtype)
    greedy = SamplingParams(temperature=0.0, max_tokens=p.MAX_TOKENS)
    cold, warm = llm.generate(prompts, greedy), llm.generate(prompts, greedy)
    rows = [{"dtype": dtype, "request": i, "cached_warm": w.metrics.num_cached_tokens,
             "same_output": c.token_ids == w.token_ids,
             "first_difference": next((j for j, (a, b) in enumerate(zip(c.token_ids, w.token_ids)) if a != b), None)}
            for i, (c, w) in enumerate(zip(cold, warm))]
    return pd.DataFrame(rows)


def plot_kv_over_time(steps: pd.DataFrame, num_blocks: int, title: str = ""):
    """KV blocks in use after each step, over the tokens each step ran (prefill vs decode)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True, height_ratios=[2, 1])
    ax1.step(steps["step"], steps["kv_blocks_used"], where="post", color=PALETTE[0], label="KV blocks in use")
    ax1.axhline(num_blocks, color="grey", ls="--", lw=1, label=f"pool ({num_blocks} blocks)")
    preempted = steps[steps["preempted"] > 0]
    if len(preempted):
        ax1.plot(preempted["step"], preempted["kv_blocks_used"], "x", color=PALETTE[5], ms=8, label="preemption")
    ax1.set_ylabel("KV blocks (count)")
    legend_outside(ax1)
    ax1.set_title(title or "KV blocks in use, step by step")
    ax2.bar(steps["step"], steps["prefill_tokens"], label="prefill tokens", color=PALETTE[1])
    ax2.bar(steps["step"], steps["decode_tokens"], bottom=steps["prefill_tokens"], label="decode tokens",
            color=PALETTE[0])
    ax2.set_title("Tokens each step ran: prefill and decode")
    ax2.set_xlabel("engine step (number)")
    ax2.set_ylabel("tokens")
    legend_outside(ax2)
    fig.tight_layout()
    return fig


def ttft_hit_vs_miss(model, tokenizer, prompt: str, p: TourParams, repeats: int = 3) -> pd.DataFrame:
    """TTFT of one request alone: on a fresh engine (prefix miss) and right after (hit), `repeats` times.

    Alone, so queueing does not mix into the number; the hit skips the cached full blocks' prefill.
    """
    rows = []
    one = SamplingParams(temperature=0.0, max_tokens=1)
    for i in range(repeats):
        llm = make_engine(p, model=model, tokenizer=tokenizer)
        for case in ("miss", "hit"):
            out = llm.generate([prompt], one)[0]
            rows.append({"repeat": i, "case": case, "ttft_ms": 1000 * out.metrics.ttft,
                         "cached_tokens": out.metrics.num_cached_tokens, "prompt_tokens": len(out.prompt_token_ids)})
    return pd.DataFrame(rows)


def budget_sweep(llm_factory, prompts, max_tokens: int, budgets: list[int]) -> pd.DataFrame:
    """Steps, peak KV blocks and mean TTFT for each per-step token budget (the widget's table)."""
    from tqdm.auto import tqdm

    rows = []
    for budget in tqdm(budgets, desc="budgets"):
        llm = llm_factory(max_num_batched_tokens=budget)
        requests, steps = run_batch(llm, prompts, max_tokens)
        rows.append({"max_num_batched_tokens": budget, "steps": len(steps),
                     "peak_kv_blocks": int(steps["kv_blocks_used"].max()), "preemptions": int(steps["preempted"].sum()),
                     "mean_ttft_ms": requests["ttft_ms"].mean(), "mean_tpot_ms": requests["tpot_ms"].mean()})
    return pd.DataFrame(rows)
