"""The engine benchmark's workloads (`WORKLOADS`), their prompts and the figure each reports, shared by the
engine's variants (`lab.bench.engine`) and its peers (`lab.bench.peers`), so both run exactly the same requests.

- `decode-1`: one chat request decoding a long answer: the mean step time (TPOT);
- `offline-32x128`: 32 chat requests x 128 tokens, all queued at once: tokens/s;
- `prefill-2k`: one 2048-token prompt and one token out: the prefill time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "compound interest", "the immune system",
    "plate tectonics", "how vaccines work", "the Roman Empire", "machine learning", "climate change",
    "the water cycle", "supply and demand", "quantum entanglement", "the printing press", "DNA replication",
    "the stock market", "volcanoes", "the theory of evolution", "renewable energy", "the human brain",
    "the Internet", "jazz music", "the Great Wall of China", "antibiotics", "electric cars",
    "the Moon landing", "coral reefs", "inflation", "the Renaissance", "earthquakes", "honeybees", "tides",
]


@dataclass(frozen=True)
class Workload:
    name: str
    num_requests: int
    max_tokens: int
    prompt_tokens: int | None = None  # None: chat questions; N: N random token ids (a long prompt)
    metric: str = "tokens_per_s"  # what is reported: tokens_per_s, step_ms (TPOT) or seconds (the whole run)


WORKLOADS = {
    "decode-1": Workload("decode-1", 1, 256, metric="step_ms"),
    "offline-32x128": Workload("offline-32x128", 32, 128),
    "prefill-2k": Workload("prefill-2k", 1, 1, prompt_tokens=2048, metric="seconds"),
}


def workload_prompts(tokenizer, n: int) -> list[str]:
    """n chat-formatted questions (cycling through TOPICS), as a user would send them."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} in a few "
                                            f"sentences."}], add_generation_prompt=True, tokenize=False)
            for i in range(n)]


# A model without a tokenizer (`random:<preset>`) gets random prompts of about the chat questions' length.
CHAT_PROMPT_TOKENS = 40
CHAT_PROMPT_LIMIT = 96  # tokens every chat prompt stays under: what `lab.bench.engine` sizes its KV pool for


def long_prompt_tokens(workload: Workload, scale: float = 1.0) -> int | None:
    """A long-prompt workload's prompt length, shrunk by `scale` (smoke runs); None for chat questions."""
    return max(2, int(workload.prompt_tokens * scale)) if workload.prompt_tokens else None


def prompt_ids(workload: Workload, tokenizer, vocab_size: int, scale: float = 1.0) -> list[list[int]]:
    """The workload's prompts as token ids (`scale` < 1 shrinks a long prompt, for smoke runs)."""
    if workload.prompt_tokens is None and tokenizer is not None:
        return [tokenizer.encode(p, add_special_tokens=False) for p in workload_prompts(tokenizer, workload.num_requests)]
    g = torch.Generator().manual_seed(0)
    n = long_prompt_tokens(workload, scale) or CHAT_PROMPT_TOKENS
    return [torch.randint(min(256, vocab_size - 1), vocab_size, (n,), generator=g).tolist()
            for _ in range(workload.num_requests)]


def metric_of(workload: Workload, seconds: float, new_tokens: int, step_s: float | None) -> float:
    if workload.metric == "step_ms":
        return 1e3 * step_s
    if workload.metric == "seconds":
        return seconds
    return new_tokens / seconds
