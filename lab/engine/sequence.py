"""A request's state as the engine sees it: its tokens, how many have KV in the cache, its blocks.

One number drives scheduling (the vLLM v1 rule): `num_computed_tokens`. A sequence wants
`len(token_ids) - num_computed_tokens` more tokens through the model; a prompt wants many (prefill,
possibly in chunks), a decoding sequence wants one. Preemption by recompute just sets it to zero.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from .sampling import SamplingParams


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
