"""A request as the engine sees it: what it asks for, the state it holds, what it returns, and how its next
token is drawn.

- `SamplingParams`: greedy, temperature, top-k, top-p, seeded per request. Top-p is nucleus sampling
  (Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020): keep the smallest set of most likely
  tokens whose probability reaches p. A request with a `seed` owns a `torch.Generator`, so its sampled tokens
  do not depend on what else is in the batch. `sample` draws a step's tokens; `probabilities` is the
  distribution it draws from (speculative verification compares drafts against it).
- `Sequence`: its tokens, how many have KV in the cache, its blocks. One number drives scheduling (the vLLM v1
  rule): `num_computed_tokens`. A sequence wants `len(token_ids) - num_computed_tokens` more tokens through the
  model; a prompt wants many (prefill, possibly in chunks), a decoding sequence wants one. Preemption by
  recompute just sets it to zero.
- `RequestOutput` and `RequestMetrics`: what a finished request returns, with its timestamps and latencies.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    speculate: bool = True  # on an engine with speculative decoding: draft for this request (False: plain)

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop = (cum - sorted_logits.softmax(-1)) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution `sample` draws from, for each row of `logits` [n, vocab]: one-hot at the argmax for a
    greedy request (what speculative verification compares drafts against)."""
    if p.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return torch.stack([_filter_top_k_top_p(row / p.temperature, p.top_k, p.top_p).softmax(-1) for row in logits])


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of `logits` [B, vocab] (float32)."""
    tokens = logits.argmax(-1).tolist()  # greedy rows are done here, in one batched call
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = _filter_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return tokens


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timestamps in `time.perf_counter()` seconds and the latencies derived from them."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    num_preemptions: int = 0
    speculation: object | None = None  # a lab.spec.speculator.SpecStats once the request had a speculative round

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for a single-token output)."""
        itl = self.inter_token_latencies
        return sum(itl) / len(itl) if itl else None

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    def as_dict(self) -> dict:
        return {"arrival_time": self.arrival_time, "first_token_time": self.first_token_time,
                "finish_time": self.finish_time, "ttft": self.ttft, "tpot": self.tpot,
                "e2e_latency": self.e2e_latency, "inter_token_latencies": self.inter_token_latencies,
                "num_prompt_tokens": self.num_prompt_tokens, "num_cached_tokens": self.num_cached_tokens,
                "num_preemptions": self.num_preemptions,
                "speculation": self.speculation.as_dict() if self.speculation is not None else None}


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop" (EOS or a stop token) or "length"
    metrics: RequestMetrics


class Sequence:
    _ids = itertools.count()

    def __init__(self, token_ids: list[int], params: SamplingParams, cache_salt: str | None = None):
        self.request_id = next(Sequence._ids)
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.params = params
        self.cache_salt = cache_salt
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.max_chunk: int | None = None  # most tokens per step (replay recomputes its window in chunks)
        self.block_table: list[int] = []
        self.finish_reason: str | None = None
        self.generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self.metrics = RequestMetrics(arrival_time=time.perf_counter(), num_prompt_tokens=len(token_ids))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_wanted_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def max_len(self) -> int:
        """The most tokens this sequence can ever hold: prompt + max_tokens (the last one never needs KV)."""
        return self.num_prompt_tokens + self.params.max_tokens
