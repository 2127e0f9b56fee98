"""A request as the engine sees it: what it asks for, the state it holds and what it returns (how its next token
is drawn is `lab.engine.sampler`'s).

- `SamplingParams`: greedy, temperature, top-k, top-p, penalties, logit_bias, seeded per request, validated at
  the door. A request with a `seed` owns a `torch.Generator`, so its sampled tokens do not depend on what else is
  in the batch. `structured_outputs` constrains the output to a grammar (`lab.engine.grammar`), whose mask is
  applied before sampling (`lab.engine.structured`).
- `Sequence`: its tokens, how many have KV in the cache, its blocks. One number drives scheduling (the vLLM v1
  rule): `num_computed_tokens`. A sequence wants `len(token_ids) + len(draft_token_ids) - num_computed_tokens`
  more tokens through the model; a prompt wants many (prefill, possibly in chunks), a decoding sequence wants
  one, a speculating one also its drafts. Preemption by recompute just sets it to zero. Drafts live in their own
  field (vLLM v1's `Request.spec_token_ids`), never in `token_ids`, which hold only verified tokens: what is
  hashed, detokenized or returned never sees a draft.
- `RequestOutput` and `RequestMetrics`: what a finished request returns, with its timestamps and latencies.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import time
from dataclasses import dataclass, field

import torch

from .grammar import StructuredOutputsParams
from .text import check_text

SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it samples greedily


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    # Stop strings, as vLLM's: the output ends where one first appears in the decoded text (matched across token
    # boundaries) and the text excludes it unless include_stop_str_in_output; token_ids keep the token that
    # completed it. A string or a list of strings; needs a tokenizer.
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    # vLLM's logprobs: for every generated token, its log-probability under the model (the raw logits' log-softmax,
    # before temperature and top-k/top-p, as vLLM returns by default), its rank, and the `logprobs` most likely
    # tokens'. None: not computed.
    logprobs: int | None = None
    # vLLM's prompt_logprobs: the same for every prompt token after the first (None for it, as vLLM); such a request
    # computes its whole prompt (no prefix-cache hit), since cached tokens have no logits.
    prompt_logprobs: int | None = None
    n: int = 1  # vLLM's parallel sampling: n samples of the prompt sharing its blocks (lab.engine.fanout)
    # vLLM's (and OpenAI's) penalties, applied to the logits before temperature: presence subtracts once per token
    # already generated, frequency once per occurrence; repetition (CTRL, Keskar et al. 2019) divides positive
    # and multiplies negative logits of every token in the prompt or output. min_tokens: EOS and stop_token_ids
    # are masked until that many tokens are out.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    # OpenAI's logit_bias: {token id: bias in [-100, 100]} added to those tokens' logits before sampling (the ids
    # are checked against the model's vocabulary when the request is made).
    logit_bias: dict[int, float] | None = None
    speculate: bool = True  # on an engine with speculative decoding: draft for this request (False: plain)
    # vLLM's structured outputs: the output must match a JSON schema, a regex, a grammar or a choice
    # (lab.engine.grammar); the logits are masked by the grammar before sampling (lab.engine.structured).
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's RequestOutputKind: "final", one delta when the request ends (LLM.generate's), or "delta", one each
    # step that adds text (a stream's); what `LLM.step` returns for it (lab.engine.output).
    output_kind: str = "final"

    def __post_init__(self):
        # Everything is checked here, at the door: a value that passed would otherwise fail inside a step,
        # beside other requests (a NaN temperature, a float top_k, a seed torch cannot hold).
        _number("temperature", self.temperature, 0.0, math.inf)
        _number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _integer("top_k", self.top_k, -1, None)  # vLLM's -1, like 0, disables it
        _integer("max_tokens", self.max_tokens, 1, None)
        if self.seed is not None:
            _integer("seed", self.seed, -(2**63), 2**64 - 1)  # what torch.Generator.manual_seed holds
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if stops is not None:
            if not isinstance(stops, (list, tuple)) or not all(isinstance(x, str) and x for x in stops):
                raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
            for i, x in enumerate(stops):  # text that is not Unicode could never match the decoded output
                check_text(x, "stop" if isinstance(self.stop, str) else f"stop[{i}]")
            self.stop = list(stops)
        _integer("n", self.n, 1, 64)
        _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _number("repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True)
        _integer("min_tokens", self.min_tokens, 0, self.max_tokens if isinstance(self.max_tokens, int) else None)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 0, 20)  # OpenAI's top_logprobs limit
        for name in ("ignore_eos", "speculate", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        for i, t in enumerate(self.stop_token_ids):
            _integer(f"stop_token_ids[{i}]", t, 0, None)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
            for t, b in self.logit_bias.items():
                _integer("a logit_bias token id", t, 0, None)
                _number(f"logit_bias[{t}]", b, -100.0, 100.0)
        if self.output_kind not in ("final", "delta"):
            raise ValueError(f"output_kind must be 'final' or 'delta', got {self.output_kind!r}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got {self.structured_outputs!r}")

    def samples(self) -> list[SamplingParams]:
        """The parameters of each of the request's `n` samples (vLLM's parallel sampling): this one, then n - 1
        single samples seeded seed + i, so the n samples equal n single requests seeded so (`lab.engine.fanout`
        makes them share the prompt's blocks)."""
        return [self, *(dataclasses.replace(self, n=1, seed=None if self.seed is None else self.seed + i)
                        for i in range(1, self.n))]

    @property
    def greedy(self) -> bool:
        # Below vLLM's _SAMPLING_EPS a temperature is greedy: logits / 1e-40 overflow to inf and NaN probabilities.
        return self.temperature < SAMPLING_EPS or self.top_k == 1


def _number(name: str, value, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low) or value > high:
        raise ValueError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value!r}")


def _integer(name: str, value, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be in [{low}, {high if high is not None else 'inf'}], got {value}")


@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int  # 1 for the most likely token


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
    speculation: object | None = None  # a lab.speculative.speculator.SpecStats once the request had a speculative round

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
    finish_reason: str  # "stop" (EOS or a stop token), "length", or "error" (its step failed: see `error`)
    metrics: RequestMetrics
    error: str | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # one dict a generated token, if SamplingParams.logprobs
    siblings: list[RequestOutput] = field(default_factory=list)  # samples 1 .. n - 1 when SamplingParams.n > 1
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # per prompt token, if asked (first: None)

    @property
    def outputs(self) -> list[RequestOutput]:
        """Every sample of the request (vLLM's `RequestOutput.outputs`): this one, then its siblings."""
        return [self, *self.siblings]


class Sequence:
    _ids = itertools.count()

    def __init__(self, token_ids: list[int], params: SamplingParams, cache_salt: str | None = None):
        self.request_id = next(Sequence._ids)
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.params = params
        self.cache_salt = cache_salt
        self.status = Status.WAITING
        self._num_computed_tokens = 0  # changed by BlockManager.update alone: see num_computed_tokens
        self.draft_token_ids: list[int] = []  # proposed for this step's verification (lab.speculative), not yet tokens
        self.max_chunk: int | None = None  # most tokens per step (replay recomputes its window in chunks)
        self.block_table: list[int] = []
        self.finish_reason: str | None = None
        self.detokenizer = None  # its text, decoded as it grows (lab.engine.text), if the model has a tokenizer
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        self._generators: dict[torch.device, torch.Generator] = {}
        self.grammar = None  # its grammar's matcher, if params.structured_outputs (lab.engine.structured)
        self.extensions: list = []  # the engine extensions whose per-request hooks run for it (LLM.make_sequence)
        self.metrics = RequestMetrics(arrival_time=time.perf_counter(), num_prompt_tokens=len(token_ids))

    def __len__(self) -> int:
        return len(self.token_ids)

    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """The request's seeded generator on `device`, where the probabilities it draws from live: torch refuses
        a CPU generator for CUDA probabilities. One stream per device (a drafter may run on another), each
        seeded with the request's seed; None without a seed."""
        if self.params.seed is None:
            return None
        device = torch.device(device)
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.params.seed)
        return self._generators[device]

    @property
    def num_computed_tokens(self) -> int:
        """How many of its leading positions hold valid KV in its blocks. Read-only: one method changes it,
        `lab.engine.block_manager.BlockManager.update` (a forward wrote positions, a prefix hit found them, a
        preemption or an extension's `Rewind` dropped them), as vLLM v1 applies every change in one place
        (`Scheduler.update_from_output`); a feature reports what happened and never moves it itself."""
        return self._num_computed_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_wanted_tokens(self) -> int:
        return len(self.token_ids) + len(self.draft_token_ids) - self.num_computed_tokens

    def tokens_to_compute(self, start: int, end: int) -> list[int]:
        """Positions [start, end) of the verified tokens followed by the drafts: what a step feeds the model."""
        n = len(self.token_ids)
        if end <= n:
            return self.token_ids[start:end]
        return self.token_ids[start:] + self.draft_token_ids[max(start - n, 0):end - n]

    @property
    def max_len(self) -> int:
        """The most tokens this sequence can ever hold: prompt + max_tokens (the last one never needs KV)."""
        return self.num_prompt_tokens + self.params.max_tokens
