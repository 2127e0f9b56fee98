"""Seed 002's first-token claims (notebook 09): what a KV cache does for the first token, what INT8 saves, what a
prefix-cache hit rate is worth, and where a cold start's seconds go.

The TTFT-on-Kubernetes article (seeds/002) says the KV cache cuts the first token's compute from O(L^2) to O(L)
(2.5x at 512 tokens), that INT8 weights save 30% of memory (§5.2) or about 50% (§6.2), that a prefix-cache hit
rate under 60% raises TTFT by 40-70% (§5.3), and that preloading and warm-up take a cold start from 15 s to 4 s
and a first-request TTFT from 3 s to 300 ms. This module counts and measures each:

- `prefill_flops_cached` / `flops_table`: prefill FLOPs of an L-token prompt whose first `c` tokens are cached,
  `2 P (L - c) + a (L(L+1)/2 - c(c+1)/2)` with `P` the active parameters and `a` the attention FLOPs of one query
  token against one context token (`lab.machine.roofline`); with no cached prefix the first token needs the whole
  prompt's forward whether or not a KV cache exists;
- `int8_table`: `lab.memory.weight_bytes` in int8 (per-channel scales) against bf16, embeddings and norms left in
  16 bits as serving stacks leave them, and with them in int8 too; the saving on weights plus a bf16 KV cache;
- `hit_sweep`: TTFT on the lab engine for prompts of N tokens whose first h% is in the prefix cache (warmed by
  a request with the same prefix and another suffix), median with min-max over repeats, and each hit rate's TTFT
  over the reference's in the same repeat (the hit rates interleaved), whose spread over repeats is the interval
  the claims are judged on (`lab.claims.across_runs`);
- `cold_start`: `python -c pass`, then fresh processes that import the engine, load the weights from a file
  evicted from the page cache (`posix_fadvise(DONTNEED)`, residency checked with `mincore`) or from a warm one,
  and time the first request with and without a warm-up request; `cold_runs` pairs the cases of each repeat
  (the warm-up's cut, preloading's cut, the read's share of a load) for the claims' run-level intervals.

The engine's own int8 allocation and the readiness probes on `lab serve` are `lab.studies.ttft_claims.serving`;
the claims table and the figure are `lab.studies.ttft_claims.table`.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from lab import memory as mem
from lab.machine import roofline as rl
from lab.models.loader import default_dtype, parse_dtype
from lab.workflow.run import as_tuple, check_device, check_model, ModelRefused, check_dtype, check_range, resolve_device


@dataclass
class TTFTParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where the engine runs: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"
    MODEL: str = "smollm2-135m"  # the engine's model (prompts are token ids), and the first shape counted
    DTYPE: str = "auto"  # the serving dtype, or "float32"
    SHAPES: tuple = ("llama-3-8b", "llama-3-70b")  # counted beside MODEL, not run; the claims read the last
    PROMPT_TOKENS: int = 512  # the first-token compute claim
    CACHED_TOKENS: int = 448  # a cached prefix of that prompt
    SWEEP_TOKENS: int = 1024  # the hit-rate sweep prompt
    HIT_RATES: tuple = (0, 20, 40, 60, 80, 100)  # percent of the sweep prompt cached
    HIGH_HIT: int = 80  # the high hit rate the others are compared with
    REPEATS: int = 7  # TTFT repeats per point
    COLD_REPEATS: int = 3  # fresh processes per cold-start case
    COLD_PROMPT: int = 128  # the cold-start request prompt tokens
    PROBE_REPEATS: int = 3  # fresh lab serve processes per readiness-probe case
    KV_TOKENS: int = 32768  # bf16 KV tokens beside the weights in the total-memory saving
    PRESETS: ClassVar[dict] = {
        "quick": {"HIT_RATES": (0, 40, 80, 100), "REPEATS": 3, "COLD_REPEATS": 1, "PROBE_REPEATS": 1},
        "smoke": {"PROMPT_TOKENS": 64, "CACHED_TOKENS": 48, "SWEEP_TOKENS": 128, "HIT_RATES": (0, 50, 100),
                  "HIGH_HIT": 50, "REPEATS": 1, "COLD_REPEATS": 1, "COLD_PROMPT": 16,
                  "PROBE_REPEATS": 1},
        # gpu: TTFT of 4K- and 8K-token prompts on one GPU, where a prefill is milliseconds and compute-bound as in
        # serving (on a CPU an 8K prompt takes seconds), and the cold start and readiness with a CUDA context to
        # create, one fresh process a case. ~32 s on one H200 (gpu/gpu_suite.sh allots 35): the engine's ~50
        # prefills ~1.5 s and the CPU INT8 build ~2 s, but five fresh processes (three cold-start cases, two
        # `lab serve` probes; each imports torch, creates a CUDA context and loads SmolLM2: ~4 s) ~20 s are the
        # minimum, repeats at 1; 8 s start.
        "gpu": {"PROMPT_TOKENS": 4096, "CACHED_TOKENS": 3584, "SWEEP_TOKENS": 8000, "REPEATS": 5, "COLD_REPEATS": 1,
                "COLD_PROMPT": 2048, "PROBE_REPEATS": 1},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        self.torch_dtype = parse_dtype(self.DTYPE) or default_dtype(resolve_device(self.DEVICE))
        self.SHAPES, self.HIT_RATES = as_tuple("SHAPES", self.SHAPES), as_tuple("HIT_RATES", self.HIT_RATES)
        check_model("MODEL", self.MODEL, self.DEVICE, self.DTYPE)
        if self.MODEL.startswith("random:"):  # section 4 times a cold start from the checkpoint's files
            raise ModelRefused(f"parameter MODEL={self.MODEL!r}: random weights have no weights file, and the "
                               f"cold start (section 4) reads one")
        for s in self.SHAPES:
            mem.ModelShape.load(s)  # raises on an unknown shape
        for h in self.HIT_RATES:
            check_range("HIT_RATES", h, 0, 100)
        check_range("HIGH_HIT", self.HIGH_HIT, 0, 100)
        if self.HIGH_HIT not in self.HIT_RATES:
            raise ValueError(f"parameter HIGH_HIT={self.HIGH_HIT!r} must be one of HIT_RATES {self.HIT_RATES}")
        for name, lo, hi in (("PROMPT_TOKENS", 16, 8192), ("SWEEP_TOKENS", 32, 8192), ("REPEATS", 1, 100),
                             ("COLD_REPEATS", 1, 20), ("PROBE_REPEATS", 1, 20), ("COLD_PROMPT", 1, 2048),
                             ("KV_TOKENS", 0, 1 << 24)):
            check_range(name, getattr(self, name), lo, hi, int)
        check_range("CACHED_TOKENS", self.CACHED_TOKENS, 0, self.PROMPT_TOKENS - 1, int)


# ---- (a) first-token compute ------------------------------------------------------------------------------------
def prefill_flops_cached(cost: rl.ModelCost, n_tokens: int, cached: int = 0) -> dict[str, float]:
    """FLOPs of a prefill whose first `cached` tokens' KV is already there (`lab.machine.roofline.prefill_flops`), split
    into the linears (2 P a computed token) and the attention (token i attends to i tokens, cached ones too)."""
    total = rl.prefill_flops(cost, n_tokens, cached)
    linear = 2.0 * cost.active_params * (n_tokens - cached)
    return {"linear": linear, "attention": total - linear, "total": total}


def cached_share_for_speedup(cost: rl.ModelCost, n_tokens: int, speedup: float) -> float:
    """The smallest share of the prompt that must be cached for its prefill to cost 1/speedup of a full one."""
    full = prefill_flops_cached(cost, n_tokens)["total"]
    for c in range(n_tokens):
        if prefill_flops_cached(cost, n_tokens, c)["total"] * speedup <= full:
            return c / n_tokens
    return 1.0


def counted(p: TTFTParams) -> tuple:
    """The shapes the tables count: MODEL's, then SHAPES."""
    return tuple(dict.fromkeys((p.MODEL, *p.SHAPES)))


def flops_table(p: TTFTParams, shapes: tuple | None = None) -> pd.DataFrame:
    """Prefill FLOPs with and without the cached prefix for each of `shapes` (default: `counted`)."""
    rows = []
    for name in shapes or counted(p):
        cost = rl.model_cost(mem.ModelShape.load(name), "bf16", "bf16")
        full = prefill_flops_cached(cost, p.PROMPT_TOKENS)
        hit = prefill_flops_cached(cost, p.PROMPT_TOKENS, p.CACHED_TOKENS)
        rows.append({"model": name, "prompt tokens": p.PROMPT_TOKENS, "cached tokens": p.CACHED_TOKENS,
                     "no cache GFLOP": full["total"] / 1e9, "attention share, no cache": full["attention"] / full["total"],
                     "cached prefix GFLOP": hit["total"] / 1e9,
                     "attention share, cached prefix": hit["attention"] / hit["total"],
                     "no cache / cached prefix": full["total"] / hit["total"],
                     "cached share for 2.5x": cached_share_for_speedup(cost, p.PROMPT_TOKENS, 2.5)})
    return pd.DataFrame(rows)


# ---- (b) INT8 weight memory ---------------------------------------------------------------------------------------
def int8_saving(shape: mem.ModelShape, embeddings_int8: bool = False, kv_tokens: int = 0) -> dict[str, float]:
    """Bytes in bf16 and in int8 (per-channel scales), and the saving; the embedding and LM head stay bf16 unless
    `embeddings_int8`; `kv_tokens` of bf16 KV cache are added to both sides."""
    emb = "int8" if embeddings_int8 else None
    b16 = mem.weight_bytes(shape, "bf16")["total"]
    i8 = mem.weight_bytes(shape, "int8", embedding=emb, lm_head=emb)["total"]
    kv = kv_tokens * mem.kv_bytes_per_token(shape, "bf16")
    return {"bf16 bytes": b16 + kv, "int8 bytes": i8 + kv, "saving": 1 - (i8 + kv) / (b16 + kv)}


def int8_table(p: TTFTParams) -> pd.DataFrame:
    rows = []
    for name in counted(p):
        s = mem.ModelShape.load(name)
        parts = mem.weight_bytes(s, "bf16")
        for what, kw in (("weights, embeddings in bf16", {}), ("weights, all int8", {"embeddings_int8": True}),
                         (f"weights + {p.KV_TOKENS} bf16 KV tokens", {"kv_tokens": p.KV_TOKENS})):
            r = int8_saving(s, **kw)
            rows.append({"model": name, "what": what, "bf16 GB": r["bf16 bytes"] / 1e9, "int8 GB": r["int8 bytes"] / 1e9,
                         "saving": r["saving"], "16-bit parts share (bf16)":
                         (parts["embedding"] + parts["lm_head"] + parts["router_and_norms"]) / parts["total"]})
    return pd.DataFrame(rows)


# ---- (a, c) TTFT against the cached prefix ------------------------------------------------------------------------
def make_engine(model, tokenizer, max_tokens: int):
    from lab.engine import LLM

    return LLM(model, tokenizer=tokenizer, max_model_len=max_tokens + 16, max_num_seqs=2)


def ttft_with_prefix(llm, n_tokens: int, cached: int, rng: np.random.Generator) -> dict:
    """One prompt of `n_tokens` fresh random ids whose first `cached` are put in the prefix cache first (by a
    request with the same prefix and another suffix); its TTFT and the prefix tokens the engine reused."""
    from lab.engine import SamplingParams

    vocab = llm.model.config.vocab_size
    ids = rng.integers(100, vocab - 100, size=2 * n_tokens).tolist()
    prompt, other = ids[:n_tokens], ids[:cached] + ids[n_tokens:2 * n_tokens - cached]
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    if cached:
        llm.generate([other], one)
    hits = llm.stats()["prefix_cache_hit_tokens"]
    out = llm.generate([prompt], one)[0]
    return {"ttft_s": out.metrics.ttft, "hit_tokens": llm.stats()["prefix_cache_hit_tokens"] - hits}


def interval(values) -> dict:
    v = np.asarray(values, dtype=float)
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())}


def ttft_runs(llm, n_tokens: int, cached: dict, repeats: int, seed: int = 0) -> pd.DataFrame:
    """TTFT for each label -> cached prefix length, once in each of `repeats` runs, the labels interleaved within a
    run (drift between runs moves every label alike): one row per label and run, with the tokens reused."""
    rng = np.random.default_rng(seed)
    ttft_with_prefix(llm, n_tokens, 0, rng)  # a first forward pays one-off costs
    return pd.DataFrame([{"label": k, "repeat": r, "cached": c, **ttft_with_prefix(llm, n_tokens, c, rng)}
                         for r in range(repeats) for k, c in cached.items()])


def summarize(raw: pd.DataFrame, n_tokens: int) -> pd.DataFrame:
    """Per label of `ttft_runs`' rows: median, min and max TTFT over runs and the tokens the engine reused."""
    rows = []
    for label, g in raw.groupby("label", sort=False):
        t = interval(g["ttft_s"])
        rows.append({"label": label, "prompt tokens": n_tokens, "cached asked": int(g["cached"].iloc[0]),
                     "hit tokens": int(g["hit_tokens"].median()), "ttft median s": t["median"], "ttft min s": t["min"],
                     "ttft max s": t["max"], "repeats": len(g)})
    return pd.DataFrame(rows)


def ttft_points(llm, n_tokens: int, cached: dict, repeats: int, seed: int = 0) -> pd.DataFrame:
    """`summarize` of `ttft_runs`."""
    return summarize(ttft_runs(llm, n_tokens, cached, repeats, seed), n_tokens)


def run_ratios(raw: pd.DataFrame, reference) -> pd.DataFrame:
    """Each label's TTFT over the `reference` label's in the same run (`ttft_runs`' rows): one ratio per label and
    run, the unit the claims' intervals are taken over (`lab.claims.across_runs`)."""
    ref = raw[raw["label"] == reference].set_index("repeat")["ttft_s"]
    return raw.assign(ratio=raw["ttft_s"].to_numpy() / ref.loc[raw["repeat"]].to_numpy())


def hit_sweep(p: TTFTParams, llm) -> pd.DataFrame:
    """TTFT against the share of the prompt in the prefix cache (`sweep_table` of `ttft_runs`). Cached lengths
    round down to whole blocks (the engine caches full blocks and always computes the last prompt token)."""
    n, block_size = p.SWEEP_TOKENS, llm.config.block_size
    cached = {h: min(int(n * h / 100) // block_size * block_size, (n - 1) // block_size * block_size)
              for h in p.HIT_RATES}
    return sweep_table(p, ttft_runs(llm, n, cached, p.REPEATS, seed=1))


def sweep_table(p: TTFTParams, raw: pd.DataFrame) -> pd.DataFrame:
    """Per hit rate (`raw`: `ttft_runs`' rows labelled by hit rate): TTFT median and min-max over runs, and its
    ratio to HIGH_HIT's and to the lowest hit rate's TTFT run by run (median, min and max of the run-level ratios)."""
    n = p.SWEEP_TOKENS
    t = summarize(raw, n).rename(columns={"label": "hit rate %"})
    t["hit share"] = t["hit tokens"] / n
    for name, ref in ((f"vs {p.HIGH_HIT}%", p.HIGH_HIT), (f"vs {min(p.HIT_RATES)}%", min(p.HIT_RATES))):
        by = run_ratios(raw, ref).groupby("label", sort=False)["ratio"]
        for end in ("median", "min", "max"):
            t[f"{name}, run {end}"] = by.agg(end).to_numpy()
    ref_hit = t.set_index("hit rate %").loc[p.HIGH_HIT, "hit tokens"]
    t["computed tokens ratio"] = (n - t["hit tokens"]) / (n - ref_hit)
    return t


# ---- (d) cold start -------------------------------------------------------------------------------------------------
def resident_share(path: Path) -> float:
    """The share of `path`'s pages in the page cache (mincore on a private mapping, which faults nothing in)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            return float("nan")
        return sum(b & 1 for b in vec) / len(vec)


def evict(directory: Path) -> None:
    """Drop every file of `directory` from the page cache (clean, unmapped pages go)."""
    for f in directory.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import lab.engine
from lab.engine import LLM, SamplingParams
from lab.models import load_model
t1 = time.perf_counter()
model, tok = load_model(sys.argv[1], dtype=sys.argv[2], device=sys.argv[5], prepack_weights=True)
t2 = time.perf_counter()
n = int(sys.argv[4])
llm = LLM(model, tokenizer=tok, max_model_len=n + 32, max_num_seqs=2)
t3 = time.perf_counter()
one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
if sys.argv[3] == "warm-up":
    llm.generate([list(range(2000, 2008))], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
t4 = time.perf_counter()
first = llm.generate([list(range(1000, 1000 + n))], one)[0].metrics.ttft
t5 = time.perf_counter()
second = llm.generate([list(range(5000, 5000 + n))], one)[0].metrics.ttft
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "engine_s": t3 - t2, "warm_up_s": t4 - t3,
                  "first_ttft_s": first, "to_first_token_s": t5 - t0, "second_ttft_s": second}))
"""


def read_seconds(files: list[Path], chunk: int = 16 << 20) -> float:
    """Seconds to read `files` through, in chunks (the bytes a loader must bring in, nothing else)."""
    t0 = time.perf_counter()
    for f in files:
        with f.open("rb", buffering=0) as fh:
            while fh.read(chunk):
                pass
    return time.perf_counter() - t0


def _child(p: TTFTParams, mode: str) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, p.MODEL, p.DTYPE, mode, str(p.COLD_PROMPT),
                          str(resolve_device(p.DEVICE))],
                         capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {**r, "process_wall_s": wall, "outside_python_s": wall - r["to_first_token_s"] - r["second_ttft_s"]}


def cold_start(p: TTFTParams) -> tuple[pd.DataFrame, dict]:
    """Fresh processes on DEVICE per case, COLD_REPEATS each: the weights file cold (evicted, its residency checked) or
    warm, the first request with or without a warm-up request. Also `python -c pass` alone, and the weights file
    read through cold and warm (the disk's rate, without conversion)."""
    from lab.models.loader import resolve_model_dir

    weights_dir = resolve_model_dir(p.MODEL)
    files = sorted(weights_dir.glob("*.safetensors"))
    rows = []
    for r in range(p.COLD_REPEATS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        rows.append({"case": "python -c pass", "repeat": r, "process_wall_s": time.perf_counter() - t0})
        evict(weights_dir)
        rows.append({"case": "read the weights file", "repeat": r, "cold_read_s": read_seconds(files),
                     "warm_read_s": read_seconds(files)})
        for case, cold, mode in (("cold file, no warm-up", True, "none"), ("warm file, no warm-up", False, "none"),
                                 ("warm file, warm-up request", False, "warm-up")):
            if cold:
                evict(weights_dir)
            resident = float(np.mean([resident_share(f) for f in files]))
            rows.append({"case": case, "repeat": r, "resident_before": resident, **_child(p, mode)})
    info = {"weights_dir": str(weights_dir), "weights_bytes": sum(f.stat().st_size for f in files)}
    return pd.DataFrame(rows), info


def cold_summary(raw: pd.DataFrame) -> pd.DataFrame:
    """Median, min and max over repeats of every timed column, per case."""
    cols = [c for c in raw.columns if c.endswith("_s") or c == "resident_before"]
    out = []
    for case, g in raw.groupby("case", sort=False):
        for c in cols:
            if g[c].notna().any():
                out.append({"case": case, "quantity": c, **interval(g[c].dropna())})
    return pd.DataFrame(out)


def cold_runs(raw: pd.DataFrame) -> pd.DataFrame:
    """`cold_start`'s rows, one per repeat, with the run-level quantities the claims rest on (each case of a repeat
    runs back to back): the warm-up request's cut of the first request's TTFT, preloading's cut of the load (the
    file cold against in the page cache), and the share of a cold and a warm load that reading the file takes
    (the read that parallel shards of one disk cannot split)."""
    def case(name: str, column: str) -> pd.Series:
        return raw[raw["case"] == name].set_index("repeat")[column]

    out = pd.DataFrame({"cold_read_s": case("read the weights file", "cold_read_s"),
                        "warm_read_s": case("read the weights file", "warm_read_s"),
                        "cold_load_s": case("cold file, no warm-up", "load_s"),
                        "warm_load_s": case("warm file, no warm-up", "load_s")})
    out["warm_up_cut"] = 1 - case("warm file, warm-up request", "first_ttft_s") / case("warm file, no warm-up",
                                                                                     "first_ttft_s")
    out["preload_cut"] = 1 - out["warm_load_s"] / out["cold_load_s"]
    out["read_share_cold"] = out["cold_read_s"] / out["cold_load_s"]
    out["read_share_warm"] = out["warm_read_s"] / out["warm_load_s"]
    return out.reset_index()


def first_token_points(p: TTFTParams, llm) -> pd.DataFrame:
    """TTFT of a PROMPT_TOKENS prompt: a miss, CACHED_TOKENS cached, and every full block but the last cached
    (a repeat of the same prompt: the engine always computes the last prompt token's block)."""
    n = p.PROMPT_TOKENS
    full_hit = (n - 1) // llm.config.block_size * llm.config.block_size
    return ttft_points(llm, n, {"miss (no cached prefix)": 0, f"{p.CACHED_TOKENS} cached": p.CACHED_TOKENS,
                                "same prompt again (hit)": full_hit}, p.REPEATS, seed=2)
