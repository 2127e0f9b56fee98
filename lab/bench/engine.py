"""`lab bench engine`: the engine against this machine's roofline and against its peers, on three workloads.

Workloads (greedy, EOS ignored, so every run emits the same number of tokens; `lab.bench.workloads.WORKLOADS`):
one chat request decoding a long answer (TPOT), 32 chat requests x 128 tokens queued at once (tokens/s), and one
2048-token prompt with one token out (the prefill time).

The bound of each comes from this machine's ceilings, measured in the same run in the dtype served
(`lab.machine.hardware.probe_inference`: the read bandwidth of a weight-shaped GEMV, the FLOP/s of a matmul): a step
takes at least max(bytes it reads / bandwidth, FLOPs / rate) (`lab.machine.roofline`), summed over the steps the
workload needs (`lab.bench.bounds`). The fraction is bound / measured: 1 is the roofline.

Engine variants (`VARIANTS`) differ in dtype ("auto" is the serving dtype, `lab.models.default_dtype`), eager or
compiled steps (`enforce_eager`), and weights (packed int4 through torch's CPU kernel, `lab.quant.packed`).
The peers run the same workloads in the same process on the same weights: `transformers`' generate in each
dtype, and any OpenAI-compatible server given by `peer_url` (a vLLM the user started) (`lab.bench.peers`).
`backends=("torch", "triton")` (`--backend torch,triton`) runs each variant on both attention backends, so the lab's
Triton kernels are timed inside the engine beside the PyTorch reference (on a CPU they run in Triton's
interpreter: a check of the path at toy sizes, not a timing). Each variant also times a speculative verification forward (5 rows: k = 4 drafts) against a one-row step.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.bench.bounds import ModelBytes, workload_bound
from lab.bench.caselog import CaseLog
from lab.bench.workloads import WORKLOADS, Workload, metric_of, prompt_ids


@dataclass(frozen=True)
class Variant:
    label: str
    dtype: str = "auto"
    enforce_eager: bool = True
    int4: bool = False  # decoder linears and LM head RTN-quantized to 4 bits (group 64) and packed
    attention_backend: str = "torch"  # "triton": the lab's kernels read the paged pool in place (`--backend`)


BACKENDS = ("torch", "triton")


def with_backend(variant: Variant, backend: str) -> Variant:
    """`variant` on another attention backend, labelled so (the torch backend keeps the plain label)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {BACKENDS}")
    label = variant.label if backend == "torch" else f"{variant.label}+{backend}"
    return dataclasses.replace(variant, label=label, attention_backend=backend)


VARIANTS = {
    "eager-float32": Variant("eager-float32", "float32"),
    "eager-auto": Variant("eager-auto"),
    "compiled-auto": Variant("compiled-auto", enforce_eager=False),
    "int4-auto": Variant("int4-auto", int4=True),
}


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


def build_engine(variant: Variant, model: str, workload_max_len: int, max_num_seqs: int):
    """The engine as a user gets it for this variant: it loads the model itself (serving dtype, prepacked
    weights), except the int4 variant, whose linears are RTN-quantized and packed first."""
    from lab.engine import LLM

    blocks = max_num_seqs * -(-workload_max_len // 16)
    options = dict(dtype=variant.dtype, max_model_len=workload_max_len, max_num_seqs=max_num_seqs,
                   max_num_batched_tokens=max(2048, workload_max_len), num_kv_blocks=blocks,
                   enforce_eager=variant.enforce_eager, attention_backend=variant.attention_backend)
    if not variant.int4:
        return LLM(model, **options)
    from lab.models import load_model
    from lab.quant.packed import rtn_packed
    from lab.quant.rtn import QuantSpec

    net, tok = load_model(model, dtype=variant.dtype, max_positions=workload_max_len)
    return LLM(rtn_packed(net, QuantSpec(bits=4, group_size=64), head=True), tokenizer=tok, **options)


def run_workload(llm, workload: Workload, prompts: list[list[int]]) -> dict:
    """Time the engine on one workload (after a short warm-up of the same shapes)."""
    from lab.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=workload.max_tokens, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=min(4, workload.max_tokens), ignore_eos=True))
    llm.reset_prefix_cache()  # no hits carried over from the warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - t
    new_tokens = sum(len(o.token_ids) for o in outs)
    tpots = [o.metrics.tpot for o in outs if o.metrics.tpot is not None]
    step_s = sum(tpots) / len(tpots) if tpots else None
    return {"seconds": seconds, "new_tokens": new_tokens, "step_s": step_s,
            "value": metric_of(workload, seconds, new_tokens, step_s)}


def verify_ratio(llm, context: int = 256, k: int = 4, repeats: int = 5) -> float:
    """A (k + 1)-row verification forward over `context` cached tokens against a one-row step."""
    from lab.machine.timing import probe_seconds

    one = probe_seconds(llm.forward_probe(context, 1), repeats)  # first, as it always was: order moves the ratio
    return probe_seconds(llm.forward_probe(context, k + 1), repeats) / one


def run_variant(variant: Variant, workloads: list[Workload], model: str, scale: float = 1.0,
                profile_dir=None, log=CaseLog(None)) -> dict:
    """Every workload on one engine variant, each beside its bound from ceilings measured in its dtype; with
    `profile_dir`, each workload then runs once more under the profiler (`lab.bench.profile`)."""
    from lab.machine.hardware import model_ceilings

    longest = [max(2, int(w.prompt_tokens * scale)) if w.prompt_tokens else 96 for w in workloads]  # chat: < 96
    max_len = max(n + w.max_tokens for n, w in zip(longest, workloads))
    llm = build_engine(variant, model, int(max_len) + 16, max(w.num_requests for w in workloads))
    dtype = llm.model.embed_tokens.weight.dtype
    ceilings = model_ceilings(llm.model)  # shaped like the model: an 8B model's GEMV leaves a GPU's L2
    size = ModelBytes.of(llm.model, kv_bytes_per_token=llm.kv_bytes_per_token)
    out = {"variant": variant.label, "dtype": str(dtype).removeprefix("torch."), "device": str(llm.device),
           "attention_backend": llm.config.attention_backend, "ceilings": {
        "read_GBps": ceilings.mem_bandwidth / 1e9, "gemm_GFLOPs": ceilings.peak_flops / 1e9,
        "source": ceilings.source}, "weight_MB": size.weight_bytes / 1e6, "workloads": {}}
    for w in workloads:
        prompts = prompt_ids(w, llm.tokenizer, llm.model.config.vocab_size, scale)
        measured = run_workload(llm, w, prompts)
        bound = workload_bound(ceilings, size, [len(p) for p in prompts], w.max_tokens)
        measured_s = measured["step_s"] * (w.max_tokens - 1) if w.metric == "step_ms" else measured["seconds"]
        bound_s = bound["decode_bound_s"] if w.metric == "step_ms" else bound["bound_s"]
        out["workloads"][w.name] = {**measured, **bound, "fraction_of_roofline": bound_s / measured_s}
        log.write("engine", {"variant": variant.label, "workload": w.name, **out["workloads"][w.name]})
        if profile_dir is not None:
            from lab.bench.profile import profile_workload
            from lab.engine import SamplingParams

            params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True)
            llm.reset_prefix_cache()
            out["workloads"][w.name]["profile"] = profile_workload(llm, prompts, params, Path(profile_dir),
                                                                   f"{variant.label}__{w.name}")
    verify_context = min(256, int(max_len) - 8)  # the ratio and its profile over the same cached tokens
    out["verify_5_rows_over_1"] = verify_ratio(llm, context=verify_context)
    if profile_dir is not None:
        from lab.bench.profile import profile_verification

        out["verify_profile"] = profile_verification(llm, Path(profile_dir), f"{variant.label}__verify",
                                                     context=verify_context)
        if not variant.enforce_eager:
            from lab.bench.profile import write_compile_times

            out["compile_profile"] = write_compile_times(Path(profile_dir), f"{variant.label}__compile")
    out["compile_seconds"] = llm.stats()["compile_seconds"]
    return out


def release_device_memory() -> None:
    """Free what the last engine held before the next loads its own copy of the weights: on a GPU an 8B model's
    engines and transformers' copy would otherwise sit side by side (reference cycles wait for the collector)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_engine_bench(model: str = "smollm2-135m", variants=tuple(VARIANTS), workloads=tuple(WORKLOADS),
                     transformers_dtypes=("float32", "auto"), peer_url: str | None = None,
                     peer_model: str | None = None, scale: float = 1.0, max_tokens: int | None = None,
                     profile_dir=None, log=CaseLog(None), backends=("torch",)) -> dict:
    """The whole benchmark: each engine variant, then the peers, on the same workloads in one process; `log` (a
    `lab.bench.caselog.CaseLog`) gets each engine workload and each peer as it finishes; `backends`: each variant
    runs on each attention backend named.
    `workloads`: names of `WORKLOADS` or `Workload`s; `scale` shrinks the long prompt and `max_tokens` caps the
    tokens out (smoke runs); `profile_dir`: write each engine workload's per-operator profile there."""
    from lab.bench.peers import run_transformers, run_url_peer

    busy = cpu_busy_fraction()
    ws = [w if isinstance(w, Workload) else WORKLOADS[w] for w in workloads]
    if max_tokens is not None:
        ws = [dataclasses.replace(w, max_tokens=min(w.max_tokens, max(2, max_tokens))) for w in ws]
    result = {"model": model, "threads": torch.get_num_threads(), "cpu_busy_at_start": busy, "engines": [],
              "peers": []}
    runs = [with_backend(VARIANTS[name], backend) for name in variants for backend in backends]  # refused first
    for variant in runs:
        result["engines"].append(run_variant(variant, ws, model, scale, profile_dir, log))
        release_device_memory()
    for dtype in transformers_dtypes:
        result["peers"].append(run_transformers(model, dtype, ws, scale))
        log.write("peer", result["peers"][-1])
    if peer_url:
        result["peers"].append(run_url_peer(peer_url, peer_model or model, model, ws, scale))
        log.write("peer", result["peers"][-1])
    return result
