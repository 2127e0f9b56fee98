"""`lab bench serve`: a load generator for any OpenAI-compatible server (the lab's, vLLM, SGLang).

Arrivals are Poisson (exponential gaps at `rate` requests/s), evenly spaced ("fixed"), or all at once
(rate = inf); `max_concurrency` caps the requests in flight (a closed loop when the rate is infinite). Input
and output lengths are drawn from log-normals fitted to given P50/P90/P99 (the deployment article, seeds/003
section 6.2: fixed lengths overstate what a server sustains), or fixed at the P50. Prompts are token ids
(OpenAI's `prompt` accepts them; vLLM and SGLang do), optionally after a shared system prompt, with long prompts mixed in at a given
interval; every request
asks for exactly its output length (`ignore_eos`, vLLM's extension). The run is bounded by its request count
and by `duration_s`: requests not finished by then are cancelled and counted, never dropped silently.

Per request it records TTFT (send to first streamed token), TPOT ((last - first) / (tokens - 1)), end-to-end
latency and the largest gap between chunks; the report has P50/P90/P99/P99.9, throughput, and goodput: the
requests (and their tokens) per second that met the SLO on both TTFT and TPOT (Zhong et al., "DistServe",
OSDI 2024, for the term).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field

import httpx

Z90, Z99 = 1.2815515655446004, 2.3263478740408408  # standard normal quantiles


@dataclass
class LengthDist:
    """A length distribution: log-normal through (P50, P90, P99), or fixed at P50. Draws outside
    [1, limit] are drawn again (counted in the report)."""

    p50: int
    p90: int
    p99: int
    fixed: bool = False

    def __post_init__(self):
        if not 1 <= self.p50 <= self.p90 <= self.p99:
            raise ValueError(f"need 1 <= P50 <= P90 <= P99, got {self.p50}, {self.p90}, {self.p99}")

    def fit(self) -> tuple[float, float]:
        """(mu, sigma) of the log-normal: mu = ln P50, sigma the least-squares fit of ln(Pq / P50) = sigma z_q."""
        mu = math.log(self.p50)
        sigma = (Z90 * math.log(self.p90 / self.p50) + Z99 * math.log(self.p99 / self.p50)) / (Z90 ** 2 + Z99 ** 2)
        return mu, sigma

    def sample(self, rng: random.Random, n: int, limit: int) -> tuple[list[int], int]:
        """n lengths in [1, limit] and how many draws were redrawn for falling outside."""
        if self.p99 > limit and not self.fixed or self.p50 > limit:
            raise ValueError(f"length P99 {self.p99} exceeds the limit {limit}")
        if self.fixed:
            return [self.p50] * n, 0
        mu, sigma = self.fit()
        out, redrawn = [], 0
        while len(out) < n:
            x = round(rng.lognormvariate(mu, sigma))
            if 1 <= x <= limit:
                out.append(x)
            else:
                redrawn += 1
        return out, redrawn


@dataclass
class LoadConfig:
    url: str = "http://127.0.0.1:8000"
    model: str = "smollm2-135m"
    num_requests: int = 64
    rate: float = math.inf  # requests per second
    arrivals: str = "poisson"  # "poisson" or "fixed" spacing at `rate`
    max_concurrency: int | None = None
    input_len: LengthDist = field(default_factory=lambda: LengthDist(128, 384, 768))
    output_len: LengthDist = field(default_factory=lambda: LengthDist(32, 64, 96))
    system_prompt_tokens: int = 0  # a prefix shared by every request
    long_prompt_every: int = 0  # every n-th request (0: none) has a prompt of long_prompt_tokens instead
    long_prompt_tokens: int = 0
    max_model_len: int = 2048  # the server's: input + output must fit
    vocab_size: int = 49152  # prompt ids are drawn from [256, vocab_size)
    duration_s: float = 600.0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.2
    seed: int = 0
    scrape_interval_s: float | None = 0.5  # poll /metrics for the dashboard (None: do not)

    def __post_init__(self):
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s (inf: all at once), got {self.rate}")
        if self.arrivals not in ("poisson", "fixed"):
            raise ValueError(f"arrivals must be 'poisson' or 'fixed', got {self.arrivals!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {self.max_concurrency}")
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.long_prompt_every < 0 or (self.long_prompt_every and self.long_prompt_tokens < 1):
            raise ValueError(f"long_prompt_every must be >= 0 and long_prompt_tokens >= 1 when it is set, got "
                             f"{self.long_prompt_every}, {self.long_prompt_tokens}")


@dataclass
class RequestRecord:
    index: int
    input_tokens: int
    output_tokens_requested: int
    send_time: float  # seconds since the run started
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    max_gap: float | None = None  # largest time between two chunks
    output_tokens: int = 0
    status: str = "pending"  # ok, http <code>, error, cancelled
    error: str | None = None
    finish_time: float | None = None


def percentiles(values, qs=(50, 90, 99, 99.9)) -> dict[str, float]:
    """Nearest-rank percentiles (nan when empty)."""
    v = sorted(x for x in values if x is not None)
    out = {}
    for q in qs:
        key = f"p{q:g}".replace(".", "")
        out[key] = v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))] if v else float("nan")
    return out


@dataclass
class LoadReport:
    config: dict
    requests: list[RequestRecord]
    duration_s: float
    redrawn_lengths: int
    scrapes: list[dict]  # time and gauges of each /metrics poll

    def summary(self) -> dict:
        ok = [r for r in self.requests if r.status == "ok"]
        good = [r for r in ok if r.ttft <= self.config["slo_ttft_s"] and (r.tpot or 0.0) <= self.config["slo_tpot_s"]]
        tokens = sum(r.output_tokens for r in ok)
        out = {"requests": len(self.requests), "ok": len(ok),
               "failed": sum(r.status not in ("ok", "cancelled") for r in self.requests),
               "cancelled": sum(r.status == "cancelled" for r in self.requests),
               "duration_s": self.duration_s, "request_throughput": len(ok) / self.duration_s,
               "output_throughput": tokens / self.duration_s,
               "goodput_requests": len(good) / self.duration_s,
               "goodput_tokens": sum(r.output_tokens for r in good) / self.duration_s,
               "slo_attainment": len(good) / len(self.requests), "redrawn_lengths": self.redrawn_lengths,
               "server_preemptions": max((s.get("lab_num_preemptions_total", 0) for s in self.scrapes),
                                         default=float("nan"))}
        for name in ("ttft", "tpot", "e2e", "max_gap"):
            out.update({f"{name}_{k}": v for k, v in percentiles([getattr(r, name) for r in ok]).items()})
            vals = [getattr(r, name) for r in ok if getattr(r, name) is not None]
            out[f"{name}_mean"] = sum(vals) / len(vals) if vals else float("nan")
        return out

    def to_json(self) -> dict:
        return {"config": self.config, "summary": self.summary(), "requests": [asdict(r) for r in self.requests],
                "scrapes": self.scrapes}


def _arrival_times(cfg: LoadConfig, rng: random.Random) -> list[float]:
    if math.isinf(cfg.rate):
        return [0.0] * cfg.num_requests
    if cfg.arrivals == "fixed":
        return [i / cfg.rate for i in range(cfg.num_requests)]
    t, out = 0.0, []
    for _ in range(cfg.num_requests):
        out.append(t)
        t += rng.expovariate(cfg.rate)
    return out


async def _one(client: httpx.AsyncClient, url: str, model: str, rec: RequestRecord, prompt: list[int], t0: float):
    body = {"model": model, "prompt": prompt, "max_tokens": rec.output_tokens_requested, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    rec.send_time = sent - t0
    chunk_times, tokens = [], 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                rec.status, rec.error = f"http {resp.status_code}", (await resp.aread()).decode()[:300]
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.status, rec.error = "error", chunk["error"].get("message")
                    return
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    chunk_times.append(time.perf_counter())
    except asyncio.CancelledError:
        rec.status = "cancelled"
        raise
    except httpx.HTTPError as e:
        rec.status, rec.error = "error", f"{type(e).__name__}: {e}"
        return
    end = time.perf_counter()
    if not chunk_times:
        rec.status, rec.error = "error", "no tokens streamed"
        return
    rec.output_tokens = tokens or len(chunk_times)
    rec.ttft, rec.e2e, rec.finish_time = chunk_times[0] - sent, end - sent, end - t0
    rec.tpot = (chunk_times[-1] - chunk_times[0]) / (rec.output_tokens - 1) if rec.output_tokens > 1 else None
    rec.max_gap = max((b - a for a, b in zip(chunk_times, chunk_times[1:])), default=None)
    rec.status = "ok"


async def _scrape(client: httpx.AsyncClient, cfg: LoadConfig, t0: float, out: list[dict]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    names = {"lab_kv_blocks_used", "lab_num_requests_running", "lab_num_requests_waiting",
             "lab_prefix_cache_hit_rate", "lab_num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
             "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"}
    while True:
        try:
            text = (await client.get(f"{cfg.url}/metrics")).text
            row = {"t": time.perf_counter() - t0}
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name in names and not s.labels:
                        row[s.name] = s.value
            out.append(row)
        except httpx.HTTPError:
            pass  # a missed scrape is a gap in the dashboard, not a failed run
        await asyncio.sleep(cfg.scrape_interval_s)


async def run_load(cfg: LoadConfig) -> LoadReport:
    rng = random.Random(cfg.seed)
    inputs, r1 = cfg.input_len.sample(rng, cfg.num_requests, cfg.max_model_len - cfg.system_prompt_tokens - 1)
    outputs, r2 = cfg.output_len.sample(rng, cfg.num_requests, cfg.max_model_len)
    if cfg.long_prompt_every:
        inputs = [cfg.long_prompt_tokens if i % cfg.long_prompt_every == 0 else n for i, n in enumerate(inputs)]
    too_long = [(i, o) for i, o in zip(inputs, outputs) if cfg.system_prompt_tokens + i + o > cfg.max_model_len]
    if too_long:
        raise ValueError(f"{len(too_long)} requests exceed max_model_len {cfg.max_model_len} (e.g. "
                         f"{cfg.system_prompt_tokens} + {too_long[0][0]} + {too_long[0][1]}); lower the length "
                         f"percentiles")
    system = [rng.randrange(256, cfg.vocab_size) for _ in range(cfg.system_prompt_tokens)]
    prompts = [system + [rng.randrange(256, cfg.vocab_size) for _ in range(n)] for n in inputs]
    arrivals = _arrival_times(cfg, rng)
    records = [RequestRecord(i, len(p), o, a) for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals))]
    limit = asyncio.Semaphore(cfg.max_concurrency or cfg.num_requests)
    scrapes: list[dict] = []
    timeout = httpx.Timeout(cfg.duration_s + 30)
    limits = httpx.Limits(max_connections=cfg.max_concurrency or cfg.num_requests + 1)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()

        async def launch(rec: RequestRecord, prompt: list[int]):
            await asyncio.sleep(max(0.0, rec.send_time - (time.perf_counter() - t0)))
            async with limit:
                await _one(client, cfg.url, cfg.model, rec, prompt, t0)

        scraper = asyncio.create_task(_scrape(client, cfg, t0, scrapes)) if cfg.scrape_interval_s else None
        tasks = [asyncio.create_task(launch(r, p)) for r, p in zip(records, prompts)]
        done, pending = await asyncio.wait(tasks, timeout=cfg.duration_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - t0
        if scraper is not None:
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
    for rec in records:
        if rec.status == "pending":
            rec.status = "cancelled"
    return LoadReport(asdict(cfg), records, duration, r1 + r2, scrapes)


def _sync(coroutine):
    """Run a coroutine from synchronous code; inside a running event loop (Jupyter) on a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def run_load_sync(cfg: LoadConfig) -> LoadReport:
    return _sync(run_load(cfg))


async def run_prompts(url: str, model: str, prompts: list[list[int]], max_tokens: int,
                      timeout_s: float = 600.0) -> tuple[list[RequestRecord], float]:
    """Send these token-id prompts all at once (greedy, exactly `max_tokens` out each); their records and the
    wall seconds until the last finished. `lab bench engine --peer-url` times its workloads with it."""
    records = [RequestRecord(i, len(p), max_tokens, 0.0) for i, p in enumerate(prompts)]
    limits = httpx.Limits(max_connections=len(prompts) + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(client, url, model, r, p, t0) for r, p in zip(records, prompts)))
        return records, time.perf_counter() - t0


def run_prompts_sync(url: str, model: str, prompts: list[list[int]], max_tokens: int,
                     timeout_s: float = 600.0) -> tuple[list[RequestRecord], float]:
    return _sync(run_prompts(url, model, prompts, max_tokens, timeout_s))
