"""Serving under load (notebook 06): TTFT, TPOT and goodput from a real HTTP server and a real load generator.

Each experiment starts the lab's OpenAI-compatible server (`lab.serve.ServerThread`, in this process, on
loopback, sharing one loaded model) with one engine configuration, drives it with `lab.bench.serve`, and
stops it. The experiments are the procedures of the TTFT article (seeds/002) and the deployment article
(seeds/003 sections 1.3, 3 and 6):

- a concurrency ramp to the knee (the first level where output throughput grows by less than
  KNEE_GAIN while TPOT P99 keeps rising, on the medians of REPEATS passes), and the article's operating point at
  70% of it, measured;
- a `max_num_seqs` sweep under the same open-loop load with the article's rule applied in order: stop at the
  first batch size whose TTFT P50 rises by more than 20% while throughput gains less than 10%;
- chunked prefill on and off with long prompts mixed in, REPEATS times: TPOT P99 and the largest inter-token gap;
- prefix caching on and off with a shared system prompt and with random prompts: TTFT and the hit rate;
- cold start: model load (GGUF conversion, cached safetensors) and the first request's TTFT with and without
  a warm-up request, each in a fresh process;
- fixed against log-normal lengths at the same load: what fixed lengths overstate.

The ramp and the chunked-prefill, prefix-caching and length experiments, which the claims table
(`lab.studies.serving.claims`) judges, run REPEATS times, the compared settings back to back in each run, so a claim's interval is the spread of run-level
ratios (`lab.claims.across_runs`).
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from typing import ClassVar

import pandas as pd
from tqdm.auto import tqdm

from lab.bench.serve import LengthDist, LoadConfig, LoadReport, run_load_sync
from lab.engine import LLM, SamplingParams
from lab.models.loader import EMBEDDED_MODELS
from lab.workflow.run import as_tuple, check_device, check_model, check_dtype, check_range
from lab.serve import ServerThread


@dataclass
class ServingParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where the served model runs: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"
    MODEL: str = "smollm2-135m"  # the served model; prompts are token ids, so a random:<preset> needs no tokenizer
    INPUT_LEN: tuple = (64, 192, 512)  # P50, P90, P99 of the log-normal prompt length (tokens)
    OUTPUT_LEN: tuple = (32, 64, 128)  # P50, P90, P99 of the output length
    CONCURRENCY: tuple = (1, 2, 4, 8, 16, 32)  # the ramp: requests in flight (closed loop)
    REQUESTS_PER_LEVEL: int = 24
    KNEE_GAIN: float = 0.10  # the knee: the first level whose throughput gain falls below this
    OPERATING_SHARE: float = 0.7  # the article's operating point, a share of the knee's concurrency
    BATCH_SIZES: tuple = (1, 2, 4, 8, 16)  # max_num_seqs
    SLO_TTFT: float = 3.0  # seconds: goodput counts requests within both SLOs
    SLO_TPOT: float = 0.2
    LONG_PROMPT: int = 1536  # chunked-prefill experiment: long prompts mixed in
    LONG_SHARE: float = 0.25
    CHUNK_TOKENS: int = 256  # the chunked engine's max_num_batched_tokens
    SYSTEM_PROMPT: int = 512  # prefix-caching experiment: shared system prompt tokens
    MAX_MODEL_LEN: int = 2048
    KV_BLOCKS: int = 1024  # of 16 tokens: 16K tokens, 0.38 GB in bf16 (more requests than fit are preempted)
    DURATION: float = 180.0  # bound on each load run (seconds)
    SEED: int = 0
    DTYPE: str = "auto"  # the served model's: the serving dtype
    COLD_START_TOKENS: int = 128  # the cold-start request's output
    REPEATS: int = 3  # runs of the claims' experiments (ramp, chunked prefill, prefix caching, length shapes)
    # quick: a ramp to 16 in flight with fewer requests a level and outputs half as long, three batch sizes, 1K-token
    # long prompts, the claims' experiments run once (two minutes, within `make run`'s budget); smoke: seconds;
    # gpu: Llama-3-8B's shapes (random weights: timing needs no trained ones) in bf16 on one GPU, prompts of
    # 512-2K tokens (6K long ones, a 2K system prompt), 4 and 16 in flight, outputs of 16-64 tokens, production
    # SLOs (TTFT 1 s, TPOT 50 ms): the regime a CPU cannot reach. ~47 s on one H200 (gpu/gpu_suite.sh allots
    # 45): 12 load runs (~1-2.5 s of ~12 ms steps each, ~0.7 s to start a server; each cut at 4 s) ~22 s, and the
    # cold start's three fresh CUDA processes and a GGUF conversion (~19 s on the 2-core CPU) ~17 s, which no
    # parameter here removes; 8 s start.
    PRESETS: ClassVar[dict] = {
        "quick": {"OUTPUT_LEN": (16, 32, 64), "CONCURRENCY": (1, 2, 4, 8, 16), "REQUESTS_PER_LEVEL": 12,
                  "BATCH_SIZES": (1, 4, 16), "LONG_PROMPT": 1024, "DURATION": 60.0, "COLD_START_TOKENS": 16,
                  "REPEATS": 1},
        "smoke": {"INPUT_LEN": (16, 32, 48), "OUTPUT_LEN": (4, 6, 8), "CONCURRENCY": (1, 2), "REQUESTS_PER_LEVEL": 4,
                  "BATCH_SIZES": (1, 2), "LONG_PROMPT": 256, "CHUNK_TOKENS": 64, "SYSTEM_PROMPT": 64,
                  "MAX_MODEL_LEN": 512, "DURATION": 60.0, "KV_BLOCKS": 128, "COLD_START_TOKENS": 16, "REPEATS": 1},
        "gpu": {"MODEL": "random:llama-3-8b", "DTYPE": "bfloat16", "INPUT_LEN": (512, 1024, 2048),
                "OUTPUT_LEN": (16, 32, 64), "CONCURRENCY": (4, 16), "REQUESTS_PER_LEVEL": 8, "BATCH_SIZES": (4, 16),
                "SLO_TTFT": 1.0, "SLO_TPOT": 0.05, "LONG_PROMPT": 6144, "CHUNK_TOKENS": 512, "SYSTEM_PROMPT": 2048,
                "MAX_MODEL_LEN": 8192, "KV_BLOCKS": 8192, "DURATION": 4.0, "REPEATS": 1},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        check_model("MODEL", self.MODEL, self.DEVICE, self.DTYPE)  # prompts are token ids: no tokenizer needed
        for name in ("INPUT_LEN", "OUTPUT_LEN", "CONCURRENCY", "BATCH_SIZES"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
            for v in getattr(self, name):
                check_range(name, v, 1, 1 << 16, int)
        for name in ("INPUT_LEN", "OUTPUT_LEN"):
            if len(getattr(self, name)) != 3:
                raise ValueError(f"parameter {name}={getattr(self, name)!r} must be (P50, P90, P99)")
            LengthDist(*getattr(self, name))  # ordered
        check_range("REQUESTS_PER_LEVEL", self.REQUESTS_PER_LEVEL, 1, 10_000, int)
        check_range("KNEE_GAIN", self.KNEE_GAIN, 0.0, 1.0)
        check_range("OPERATING_SHARE", self.OPERATING_SHARE, 0.05, 1.0)
        check_range("LONG_SHARE", self.LONG_SHARE, 0.0, 1.0)
        check_range("MAX_MODEL_LEN", self.MAX_MODEL_LEN, 64, 8192, int)
        check_range("LONG_PROMPT", self.LONG_PROMPT, 1, self.MAX_MODEL_LEN - self.OUTPUT_LEN[2], int)
        check_range("SYSTEM_PROMPT", self.SYSTEM_PROMPT, 0,
                    self.MAX_MODEL_LEN - self.INPUT_LEN[2] - self.OUTPUT_LEN[2], int)
        check_range("CHUNK_TOKENS", self.CHUNK_TOKENS, 16, self.MAX_MODEL_LEN, int)
        check_range("DURATION", self.DURATION, 1.0, 3600.0)
        check_range("COLD_START_TOKENS", self.COLD_START_TOKENS, 1, self.MAX_MODEL_LEN, int)
        check_range("KV_BLOCKS", self.KV_BLOCKS, -(-self.MAX_MODEL_LEN // 16), 1 << 20, int)
        check_range("REPEATS", self.REPEATS, 1, 20, int)


def load_config(p: ServingParams, **overrides) -> LoadConfig:
    """The study's load; `serve_and_load` points it at the server it starts."""
    base = LoadConfig(model=p.MODEL, num_requests=p.REQUESTS_PER_LEVEL, input_len=LengthDist(*p.INPUT_LEN),
                      output_len=LengthDist(*p.OUTPUT_LEN), max_model_len=p.MAX_MODEL_LEN, duration_s=p.DURATION,
                      slo_ttft_s=p.SLO_TTFT, slo_tpot_s=p.SLO_TPOT, seed=p.SEED, scrape_interval_s=0.25)
    return replace(base, **overrides)


def serve_and_load(model, tokenizer, engine: dict, cfg: LoadConfig) -> LoadReport:
    """Start a server with `engine` settings (LLM keyword arguments), run one load against it, stop it."""
    llm = LLM(model, tokenizer=tokenizer, **engine)
    try:
        with ServerThread(llm, model_name=cfg.model) as srv:  # prompt ids are drawn from the model's vocabulary
            return run_load_sync(replace(cfg, url=srv.url, vocab_size=model.config.vocab_size))
    finally:
        del llm
        gc.collect()  # the app and the engine reference each other: free this KV pool before the next one


def _engine(p: ServingParams, **kw) -> dict:
    return {"max_model_len": p.MAX_MODEL_LEN, "max_num_seqs": max(p.CONCURRENCY + p.BATCH_SIZES),
            "num_kv_blocks": p.KV_BLOCKS} | kw


def in_turn(arms: tuple, run: int) -> list:
    """The compared settings of one run in the order they run: rotated by the run's index, so each runs first
    equally often (in every position, with as many runs as settings) and a drift over a run's minutes (the
    machine's speed, what the engine before left in memory) favours none. Until 7 December every run took them in
    one order: prefix caching on always ran before off, and on random prompts, where there is nothing to reuse, it
    came out lower in TTFT P50 in 4 of 6 runs over the two reference runs."""
    k = run % len(arms)
    return list(arms[k:] + arms[:k])


def _row(label: dict, report: LoadReport) -> dict:
    return label | report.summary()


def closed_loop(p: ServingParams, model, tokenizer, concurrency: int, repeat: int = 0) -> LoadReport:
    """`concurrency` requests in flight (at least twice that many in all) on the default engine; each `repeat`
    draws its own requests."""
    cfg = load_config(p, num_requests=max(p.REQUESTS_PER_LEVEL, 2 * concurrency), max_concurrency=concurrency,
                      seed=p.SEED + repeat)
    return serve_and_load(model, tokenizer, _engine(p), cfg)


def ramp(p: ServingParams, model, tokenizer, log=print) -> tuple[pd.DataFrame, dict[int, LoadReport]]:
    """REPEATS passes of the concurrency ramp, one row per pass and level ("repeat"), and the last pass's reports:
    the knee, and the claim on it, rest on the levels' spread over passes (`ramp_levels`)."""
    rows, reports = [], {}
    for r, c in tqdm([(r, c) for r in range(p.REPEATS) for c in p.CONCURRENCY], desc="concurrency ramp"):
        reports[c] = closed_loop(p, model, tokenizer, c, r)
        rows.append(_row({"repeat": r, "concurrency": c}, reports[c]))
        log(f"pass {r}, concurrency {c}: {rows[-1]['output_throughput']:.1f} tok/s, "
            f"TPOT p99 {rows[-1]['tpot_p99']:.3f} s")
    return pd.DataFrame(rows), reports


RAMP_METRICS = ("output_throughput", "goodput_tokens", "tpot_p50", "tpot_p99", "ttft_p99")


def ramp_levels(t: pd.DataFrame) -> pd.DataFrame:
    """Per concurrency level, in order: the median over the ramp's passes of each of `RAMP_METRICS`, with the
    passes' min and max (`<metric>_low`, `_high`) and their number ("passes")."""
    g = t.groupby("concurrency", sort=True)
    out = pd.DataFrame({"passes": g.size()})
    for m in RAMP_METRICS:
        out[m], out[f"{m}_low"], out[f"{m}_high"] = g[m].median(), g[m].min(), g[m].max()
    return out.reset_index()


def find_knee(ramp_table: pd.DataFrame, gain: float) -> int:
    """The first concurrency whose throughput gain over the previous level is below `gain` while its TPOT P99
    rose (throughput flattens, latency degrades); the last level when throughput never flattens."""
    t = ramp_table.reset_index(drop=True)
    for i in range(1, len(t)):
        grew = t.loc[i, "output_throughput"] / t.loc[i - 1, "output_throughput"] - 1
        if grew < gain and t.loc[i, "tpot_p99"] > t.loc[i - 1, "tpot_p99"]:
            return int(t.loc[i - 1, "concurrency"])  # the knee is the last level that still paid off
    return int(t["concurrency"].iloc[-1])


def operating_point(p: ServingParams, model, tokenizer, knee: int) -> tuple[int, LoadReport]:
    c = max(1, round(p.OPERATING_SHARE * knee))
    return c, closed_loop(p, model, tokenizer, c)


def batch_sweep(p: ServingParams, model, tokenizer, rate: float, log=print) -> tuple[pd.DataFrame, int]:
    """Open-loop Poisson load at `rate` requests/s against max_num_seqs = each of BATCH_SIZES; the article's
    rule picks the largest batch before the first step with TTFT +20% and throughput +<10%."""
    rows = []
    for b in tqdm(p.BATCH_SIZES, desc="batch sizes"):
        cfg = load_config(p, num_requests=max(p.REQUESTS_PER_LEVEL, 2 * b), rate=rate)
        rows.append(_row({"max_num_seqs": b, "rate": rate}, serve_and_load(model, tokenizer,
                                                                           _engine(p, max_num_seqs=b), cfg)))
        log(f"max_num_seqs {b}: TTFT p50 {rows[-1]['ttft_p50']:.3f} s, {rows[-1]['output_throughput']:.1f} tok/s")
    return batch_rule(pd.DataFrame(rows))


def batch_rule(t: pd.DataFrame, ttft_rise: float = 0.2, min_gain: float = 0.1) -> tuple[pd.DataFrame, int]:
    """The deployment article's rule over a batch sweep in increasing order: stop at the first step where TTFT
    P50 rises by more than `ttft_rise` while throughput gains less than `min_gain`; keep the size before it."""
    t = t.reset_index(drop=True).copy()
    t["ttft_rise"] = t["ttft_p50"] / t["ttft_p50"].shift() - 1
    t["throughput_gain"] = t["output_throughput"] / t["output_throughput"].shift() - 1
    t["rule_stops_here"] = (t["ttft_rise"] > ttft_rise) & (t["throughput_gain"] < min_gain)
    stops = t.index[t["rule_stops_here"]]
    chosen = int(t.loc[stops[0] - 1, "max_num_seqs"]) if len(stops) else int(t["max_num_seqs"].iloc[-1])
    return t, chosen


def chunked_prefill(p: ServingParams, model, tokenizer, concurrency: int) -> tuple[pd.DataFrame, dict]:
    """A share of long prompts among the usual ones; the chunked engine takes CHUNK_TOKENS a step, the other
    must take a whole prompt in one (its budget is max_model_len). REPEATS runs, on and off back to back in
    each ("repeat"), in turn (`in_turn`: "position" 0 ran first); the reports are the last run's."""
    n = max(p.REQUESTS_PER_LEVEL, 2 * concurrency)
    long_every = max(1, round(1 / p.LONG_SHARE)) if p.LONG_SHARE else 0
    rows, reports = [], {}
    runs = [(r, i, c) for r in range(p.REPEATS) for i, c in enumerate(in_turn((True, False), r))]
    for r, position, chunked in tqdm(runs, desc="chunked prefill on/off"):
        engine = _engine(p, enable_chunked_prefill=chunked,
                         max_num_batched_tokens=p.CHUNK_TOKENS if chunked else p.MAX_MODEL_LEN)
        cfg = load_config(p, num_requests=n, max_concurrency=concurrency, long_prompt_every=long_every,
                          long_prompt_tokens=p.LONG_PROMPT, seed=p.SEED + r)
        reports[chunked] = serve_and_load(model, tokenizer, engine, cfg)
        rows.append(_row({"repeat": r, "chunked_prefill": chunked, "position": position,
                          "max_num_batched_tokens": engine["max_num_batched_tokens"]}, reports[chunked]))
    return pd.DataFrame(rows), reports


def dynamic_prefix(p: ServingParams, model, tokenizer, stamp: str = "Current time: 2026-12-02 22:41:07 UTC.") -> pd.DataFrame:
    """What a prefix cache keeps when a timestamp is inserted into a shared SYSTEM_PROMPT-token system prompt: the
    prompt served once, then again with `stamp`'s tokens inserted at its start, halfway and at its end, each on an
    engine that has served the plain prompt; per case the prompt tokens served from the cache. Counts, not timings:
    a block-hashed cache (each block's hash chains its parent's, vLLM's scheme and the engine's) keeps every full
    block before the change, so only a change at the very start loses all of it."""
    import random

    rng = random.Random(p.SEED)
    system = [rng.randrange(model.config.vocab_size) for _ in range(p.SYSTEM_PROMPT)]
    # A model without a tokenizer (random weights, the gpu preset) gets as many random ids as SmolLM2's tokenizer
    # makes of the default stamp (25): the counts below depend on where the inserted tokens go, not on which.
    stamped = (tokenizer.encode(stamp, add_special_tokens=False) if tokenizer is not None
               else [rng.randrange(model.config.vocab_size) for _ in range(25)])
    question = [rng.randrange(model.config.vocab_size) for _ in range(32)]
    one = SamplingParams(temperature=0.0, max_tokens=1)
    rows = []
    for case, at in (("no change", None), ("at the start", 0), ("halfway", p.SYSTEM_PROMPT // 2),
                     ("at the end", p.SYSTEM_PROMPT)):
        llm = LLM(model, tokenizer=tokenizer, **_engine(p, enable_prefix_caching=True))
        llm.generate(system + question, one)  # the plain prompt fills the cache
        prompt = system + question if at is None else system[:at] + stamped + system[at:] + question
        out = llm.generate(prompt, one)[0]
        rows.append({"timestamp": case, "inserted_at_token": at, "system_prompt_tokens": p.SYSTEM_PROMPT,
                     "prompt_tokens": len(prompt), "cached_tokens": out.metrics.num_cached_tokens,
                     "cached_share_of_system_prompt_%": 100 * min(out.metrics.num_cached_tokens, p.SYSTEM_PROMPT)
                     / p.SYSTEM_PROMPT})
        del llm
        gc.collect()
    return pd.DataFrame(rows)


PROMPTS = {"shared system prompt": True, "random prompts": False}  # prefix caching's two loads: a shared prefix or none


def prefix_caching(p: ServingParams, model, tokenizer, concurrency: int) -> tuple[pd.DataFrame, dict]:
    """Prefix caching on and off, back to back and in turn (`in_turn`: "position" 0 ran first), under a load whose
    requests share a SYSTEM_PROMPT-token prefix and under one of random prompts (nothing to reuse), in each of
    REPEATS runs (request draws seeded by the run)."""
    rows, reports = [], {}
    runs = [(r, kind, i, cached) for r in range(p.REPEATS) for kind in PROMPTS.items()
            for i, cached in enumerate(in_turn((True, False), r))]
    for r, (prompts, shared), position, cached in tqdm(runs, desc="prefix caching on/off"):
        cfg = load_config(p, max_concurrency=concurrency, system_prompt_tokens=p.SYSTEM_PROMPT if shared else 0,
                          seed=p.SEED + r)
        engine = _engine(p, enable_prefix_caching=cached)
        report = reports[prompts, cached, r] = serve_and_load(model, tokenizer, engine, cfg)
        hit = max((s.get("lab_prefix_cache_hit_rate", 0.0) for s in report.scrapes), default=float("nan"))
        rows.append(_row({"prompts": prompts, "repeat": r, "prefix_caching": cached, "position": position,
                          "system_prompt_tokens": cfg.system_prompt_tokens, "hit_rate": hit}, report))
    return pd.DataFrame(rows), reports


def length_shapes(p: ServingParams, model, tokenizer, concurrency: int) -> pd.DataFrame:
    """The same load with log-normal lengths, lengths fixed at the P50 (the usual benchmark), and fixed at the
    log-normal's mean (same token volume), back to back and in turn (`in_turn`) in each of REPEATS runs (request
    draws seeded by the run); each relative to the log-normal of its run."""
    rows = []
    lognormal_in, lognormal_out = LengthDist(*p.INPUT_LEN), LengthDist(*p.OUTPUT_LEN)

    def mean(d: LengthDist) -> int:
        mu, sigma = d.fit()
        return max(1, round(math.exp(mu + sigma ** 2 / 2)))

    shapes = {"log-normal": (lognormal_in, lognormal_out),
              "fixed at P50": (LengthDist(p.INPUT_LEN[0], p.INPUT_LEN[0], p.INPUT_LEN[0], fixed=True),
                               LengthDist(p.OUTPUT_LEN[0], p.OUTPUT_LEN[0], p.OUTPUT_LEN[0], fixed=True)),
              "fixed at the mean": tuple(LengthDist(mean(d), mean(d), mean(d), fixed=True)
                                         for d in (lognormal_in, lognormal_out))}
    for r in range(p.REPEATS):
        for position, name in enumerate(in_turn(tuple(shapes), r)):
            i, o = shapes[name]
            cfg = load_config(p, max_concurrency=concurrency, input_len=i, output_len=o, seed=p.SEED + r)
            rows.append(_row({"lengths": name, "repeat": r, "position": position, "input_p50": i.p50,
                              "output_p50": o.p50}, serve_and_load(model, tokenizer, _engine(p), cfg)))
    t = pd.DataFrame(rows)
    base = t[t["lengths"] == "log-normal"].set_index("repeat")
    for col in ("goodput_requests", "output_throughput", "tpot_p99", "ttft_p99"):
        t[f"{col}_vs_lognormal"] = t[col].to_numpy() / base.loc[t["repeat"], col].to_numpy()
    return t


_COLD_START = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from lab.engine import LLM, SamplingParams
from lab.models import load_model
t1 = time.perf_counter()
model, tok = load_model(sys.argv[5], dtype=sys.argv[3], device=sys.argv[4], prepack_weights=True)
t2 = time.perf_counter()
llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512)
prompt = list(range(1000, 1000 + int(sys.argv[1])))
params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
if sys.argv[2] == "warm":
    llm.generate([list(range(2000, 2016))], SamplingParams(max_tokens=2, ignore_eos=True))
first = llm.generate([prompt], params)[0].metrics
second = llm.generate([[t + 1 for t in prompt]], params)[0].metrics
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_ttft_s": first.ttft, "first_tpot_s": first.tpot,
                  "second_ttft_s": second.ttft, "second_tpot_s": second.tpot}))
"""


def cold_start(model: str, prompt_tokens: int = 128, dtype: str = "auto", device: str = "cpu") -> pd.DataFrame:
    """Fresh processes loading `model` on `device`: the first with an empty model cache (a GGUF, the embedded
    model's too, is converted then; a checkpoint directory or random weights have nothing to convert), then with
    the cache warm; then the first request's TTFT without and with a warm-up request."""
    converts = str(model) in EMBEDDED_MODELS or str(model).endswith(".gguf")
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for label, env_cache, mode in (("first load: convert the GGUF" if converts else "first load", cache, "cold"),
                                       ("cached safetensors" if converts else "second load", cache, "cold"),
                                       ("cached, warm-up request first" if converts else "warm-up request first",
                                        cache, "warm")):
            env = os.environ | {"LAB_CACHE_DIR": env_cache}
            out = subprocess.run([sys.executable, "-c", _COLD_START, str(prompt_tokens), mode, dtype, device,
                                  str(model)], env=env, capture_output=True, text=True, check=True)
            rows.append({"case": label, **json.loads(out.stdout.strip().splitlines()[-1])})
    t = pd.DataFrame(rows)
    t["first_over_second_ttft"] = t["first_ttft_s"] / t["second_ttft_s"]
    return t
