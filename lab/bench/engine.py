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
from lab.bench.workloads import CHAT_PROMPT_LIMIT, WORKLOADS, Workload, long_prompt_tokens, metric_of, prompt_ids


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


def kv_blocks_needed(lengths: list[tuple[int, int]], probe_tokens: int = 0) -> int:
    """KV blocks for the benchmark's workloads one at a time: the most that any one holds at once, each of its
    `lengths` (requests, longest prompt + tokens out) a request's blocks, and the verification probe's context
    (`probe_tokens`). The workloads never run together, so the pool is sized for the largest of them, not for
    max_num_seqs requests of the longest length (32 x 2K tokens: 3.1 GB of float32 KV for SmolLM2, against 0.3 GB
    needed, which kept the reference benchmark's seven contenders from being held at once on a 23-GB machine)."""
    from lab.engine import EngineConfig

    if not lengths:
        raise ValueError("kv_blocks_needed: no workload to size the KV pool for")
    block = EngineConfig.block_size  # the engine's default, which the benchmark's engines keep
    per_request = lambda n: -(-(n + 1) // block)  # noqa: E731  (one spare token a request)
    return max([requests * per_request(length) for requests, length in lengths] + [per_request(probe_tokens)])


def workload_lengths(workloads: list[Workload], scale: float = 1.0) -> list[tuple[int, int]]:
    """(requests, longest prompt + tokens out) of each workload; a chat prompt is bounded by CHAT_PROMPT_LIMIT
    (checked when the prompts are built)."""
    return [(w.num_requests, (long_prompt_tokens(w, scale) or CHAT_PROMPT_LIMIT) + w.max_tokens) for w in workloads]


def build_engine(variant: Variant, model: str, workload_max_len: int, max_num_seqs: int, num_kv_blocks: int):
    """The engine as a user gets it for this variant: it loads the model itself (serving dtype, prepacked
    weights), except the int4 variant, whose linears are RTN-quantized and packed first; its KV pool holds
    `num_kv_blocks` (`kv_blocks_needed`)."""
    from lab.engine import LLM

    options = dict(dtype=variant.dtype, max_model_len=workload_max_len, max_num_seqs=max_num_seqs,
                   max_num_batched_tokens=max(2048, workload_max_len), num_kv_blocks=num_kv_blocks,
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
    preempted = llm.stats()["preemptions"]
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - t
    new_tokens = sum(len(o.token_ids) for o in outs)
    tpots = [o.metrics.tpot for o in outs if o.metrics.tpot is not None]
    step_s = sum(tpots) / len(tpots) if tpots else None
    # recorded, so a pool too small for the workload (its timing then includes recomputation) shows in the result
    return {"seconds": seconds, "new_tokens": new_tokens, "step_s": step_s,
            "preemptions": llm.stats()["preemptions"] - preempted,
            "value": metric_of(workload, seconds, new_tokens, step_s)}


VERIFY_REPEATS = 5  # timed repeats of each side of the verification ratio, at full size
VERIFY_DRAFTS = 4  # drafts verified in one forward (k + 1 rows)


def verify_ratio(llm, context: int = 256, k: int = VERIFY_DRAFTS, repeats: int = VERIFY_REPEATS) -> float:
    """A (k + 1)-row verification forward over `context` cached tokens against a one-row step."""
    from lab.machine.timing import probe_seconds

    one = probe_seconds(llm.forward_probe(context, 1), repeats)  # first, as it always was: order moves the ratio
    return probe_seconds(llm.forward_probe(context, k + 1), repeats) / one


def probe_budget(scale: float) -> float:
    """Seconds of the ceilings probe (`lab.machine.hardware.model_ceilings`): its 3 s, shrunk with `scale` in smoke
    runs (0.5 s at the least), where each engine's probe was a sixth of a GPU dry run's engine step (3 of 22 s)."""
    from lab.machine.hardware import PROBE_SECONDS

    return PROBE_SECONDS * min(1.0, max(scale, 1 / 6))


class EngineContender:
    """One engine variant built and held for the whole benchmark (`lab.bench.rounds.Contender`): its prompts, its
    ceilings (measured in its dtype when it is built) and the bytes it moves, so each workload's bound is ready."""

    def __init__(self, variant: Variant, workloads: list[Workload], model: str, scale: float = 1.0):
        from lab.machine.hardware import model_ceilings

        self.variant, self.label = variant, variant.label
        self._workloads = {w.name: w for w in workloads}
        lengths = workload_lengths(workloads, scale)
        self.max_len = max(n for _, n in lengths)
        # the ratio and its profile over the same tokens: 256 cached, shrunk with the long prompt in smoke runs (in
        # the GPU dry run, the Triton interpreter's verification took 5.0 s over 92 tokens and 1.7 s over 16)
        self.verify_context = min(max(16, int(256 * scale)), int(self.max_len) - 8)
        self.kv_blocks = kv_blocks_needed(lengths, self.verify_context + VERIFY_DRAFTS + 1)
        self.llm = build_engine(variant, model, int(self.max_len) + 16, max(w.num_requests for w in workloads),
                                self.kv_blocks)
        self.probe_s = probe_budget(scale)
        # shaped like the model: an 8B model's GEMV leaves a GPU's L2
        self.ceilings = model_ceilings(self.llm.model, self.probe_s)
        self.size = ModelBytes.of(self.llm.model, kv_bytes_per_token=self.llm.kv_bytes_per_token)
        self.prompts = {w.name: prompt_ids(w, self.llm.tokenizer, self.llm.model.config.vocab_size, scale)
                        for w in workloads}
        for w in workloads:  # the pool was sized on this bound
            longest = max(map(len, self.prompts[w.name]))
            if w.prompt_tokens is None and longest >= CHAT_PROMPT_LIMIT:
                raise ValueError(f"workload {w.name}: a chat prompt of {longest} tokens, over the {CHAT_PROMPT_LIMIT} "
                                 f"the KV pool was sized for (lab.bench.workloads.CHAT_PROMPT_LIMIT)")
        # the verification over fewer repeats: at toy sizes the ratio is a check that it runs, not a figure
        self.verify_repeats = max(1, round(VERIFY_REPEATS * min(1.0, scale)))

    def measure(self, workload: Workload) -> dict:
        return run_workload(self.llm, workload, self.prompts[workload.name])

    def verify(self) -> float:
        return verify_ratio(self.llm, context=self.verify_context, repeats=self.verify_repeats)

    def record(self, runs: dict[str, list[dict]], verify: list[float], profile_dir=None) -> dict:
        """The variant's result: each workload's rounds combined (`lab.bench.rounds.combine`) beside its bound;
        with `profile_dir`, each workload then runs once more under the profiler (`lab.bench.profile`)."""
        from lab.bench.rounds import combine, summarize

        llm = self.llm
        out = {"variant": self.label, "dtype": str(llm.model.embed_tokens.weight.dtype).removeprefix("torch."),
               "device": str(llm.device), "attention_backend": llm.config.attention_backend, "ceilings": {
            "read_GBps": self.ceilings.mem_bandwidth / 1e9, "gemm_GFLOPs": self.ceilings.peak_flops / 1e9,
            "source": self.ceilings.source, "probe_s": self.probe_s}, "weight_MB": self.size.weight_bytes / 1e6,
            "workloads": {}}
        for name, measured in runs.items():
            w = self._workloads[name]
            m = combine(measured)
            bound = workload_bound(self.ceilings, self.size, [len(p) for p in self.prompts[name]], w.max_tokens)
            measured_s = m["step_s"] * (w.max_tokens - 1) if w.metric == "step_ms" else m["seconds"]
            bound_s = bound["decode_bound_s"] if w.metric == "step_ms" else bound["bound_s"]
            out["workloads"][name] = {**m, **bound, "fraction_of_roofline": bound_s / measured_s}
            if profile_dir is not None:
                from lab.bench.profile import profile_workload
                from lab.engine import SamplingParams

                params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True)
                llm.reset_prefix_cache()
                out["workloads"][name]["profile"] = profile_workload(llm, self.prompts[name], params,
                                                                     Path(profile_dir), f"{self.label}__{name}")
        v = summarize(verify)
        out["verify_5_rows_over_1"], out["verify_span"] = v["value"], v["span"]
        out["verify_context"], out["verify_repeats"] = self.verify_context, self.verify_repeats
        out["kv_blocks"], out["kv_cache_MB"] = self.kv_blocks, self.llm.stats()["kv_cache_bytes"] / 1e6
        if profile_dir is not None:
            from lab.bench.profile import profile_verification

            out["verify_profile"] = profile_verification(llm, Path(profile_dir), f"{self.label}__verify",
                                                         context=self.verify_context)
            if not self.variant.enforce_eager:
                from lab.bench.profile import write_compile_times

                out["compile_profile"] = write_compile_times(Path(profile_dir), f"{self.label}__compile")
        out["compile_seconds"] = llm.stats()["compile_seconds"]
        return out

    def close(self) -> None:
        self.llm = None
        release_device_memory()


def release_device_memory() -> None:
    """Free what the last engine held before the next loads its own copy of the weights: on a GPU an 8B model's
    engines and transformers' copy would otherwise sit side by side (reference cycles wait for the collector)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _free_bytes() -> int:
    """Memory free on the device the engines use (the GPU's, or the host's)."""
    from lab.engine.kv_store import available_memory
    from lab.models.loader import default_device

    return available_memory(torch.device(default_device()))


def run_engine_bench(model: str = "smollm2-135m", variants=tuple(VARIANTS), workloads=tuple(WORKLOADS),
                     transformers_dtypes=("float32", "auto"), peer_url: str | None = None,
                     peer_model: str | None = None, scale: float = 1.0, max_tokens: int | None = None,
                     profile_dir=None, log=CaseLog(None), backends=("torch",), rounds: int = 3,
                     vllm_dtypes=()) -> dict:
    """The whole benchmark: every engine variant and every peer built and held at once, then timed on the same
    workloads interleaved over `rounds` (`lab.bench.rounds`); where they do not fit in memory together, each is
    built, timed and released in turn (`interleaved` false). `log` (a `lab.bench.caselog.CaseLog`) gets each
    engine workload and each peer's round as it finishes; `backends`: each variant runs on each attention backend
    named; `vllm_dtypes`: vLLM's CPU build as a peer in each dtype (`lab.bench.vllm_peer`, its own environment).
    `workloads`: names of `WORKLOADS` or `Workload`s; `scale` shrinks the long prompt, the verification's
    256-token context (at least 16) and the ceilings probe (`probe_budget`), `max_tokens` caps the tokens out
    (smoke runs); `profile_dir`: write each engine workload's per-operator profile there."""
    from lab.bench.peers import TransformersPeer, UrlPeer
    from lab.bench.rounds import combine, run_rounds
    from lab.bench.vllm_peer import VllmPeer

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    busy = cpu_busy_fraction()
    ws = [w if isinstance(w, Workload) else WORKLOADS[w] for w in workloads]
    if max_tokens is not None:
        ws = [dataclasses.replace(w, max_tokens=min(w.max_tokens, max(2, max_tokens))) for w in ws]
    runs = [with_backend(VARIANTS[name], backend) for name in variants for backend in backends]  # refused first
    builders = [lambda v=v: EngineContender(v, ws, model, scale) for v in runs]
    builders += [lambda d=d: TransformersPeer(model, d, ws, scale) for d in transformers_dtypes]
    builders += [lambda d=d: VllmPeer(model, d, ws, scale) for d in vllm_dtypes]
    if peer_url:
        builders.append(lambda: UrlPeer(peer_url, peer_model or model, model, ws, scale))
    result = {"model": model, "threads": torch.get_num_threads(), "cpu_busy_at_start": busy, "rounds": rounds,
              "engines": [], "peers": []}
    pending: dict[tuple[str, int], dict] = {}

    def logged(c, w, r, m):
        if isinstance(c, EngineContender):
            log.write("engine", {"variant": c.label, "workload": w.name, "round": r, **m})
            return
        done = pending.setdefault((c.label, r), {})
        done[w.name] = m
        if len(done) == len(ws):  # a peer's round is logged whole, as a peer was before rounds
            log.write("peer", {"peer": c.label, "round": r, "workloads": pending.pop((c.label, r))})

    def finish(c, measured):
        if isinstance(c, EngineContender):
            result["engines"].append(c.record(measured, [c.verify() for _ in range(rounds)], profile_dir))
        else:
            result["peers"].append({"peer": c.label, "device": c.device,
                                    "workloads": {n: combine(m) for n, m in measured.items()}, **c.about()})

    # Held at once if the rest fit beside the first (its footprint measured, with room to spare).
    before = _free_bytes()
    first = builders[0]()
    footprint = max(0, before - _free_bytes())
    result["interleaved"] = _free_bytes() > 1.5 * footprint * (len(builders) - 1)
    if result["interleaved"]:
        contenders = [first] + [build() for build in builders[1:]]
        try:
            measured = run_rounds(contenders, ws, rounds, logged)
            for c in contenders:
                finish(c, measured[c.label])
        finally:
            for c in contenders:
                c.close()
    else:
        for i, build in enumerate(builders):
            c = first if i == 0 else build()
            try:
                finish(c, run_rounds([c], ws, rounds, logged)[c.label])
            finally:
                c.close()
    return result
