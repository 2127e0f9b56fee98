"""Tensor and pipeline parallelism (notebook 08): what communication costs a step, measured here and projected to
real deployments, and the articles' rules of thumb.

Seed 003 (section 4.3) explains tensor parallelism (TP: every layer split, two all-reduces a layer, so it needs
fast links and stays within a node, "at most 8 cards") and pipeline parallelism (PP: layers split into stages,
point-to-point sends, a bubble that "micro-batches at least 4x the stages" fill); seed 000 (section 5.2) reports
all-reduce at 40% of a decode step with 8-way TP on a 70B model; seed 002 puts a 140 GB model at 17.5 GB per GPU
on 8 GPUs. This module measures this machine's collectives and fits the alpha-beta model
(`lab.parallel.comm_bench`, `lab.parallel.comm_model`), times the engine's steps at TP=1 and TP=2 with the
seconds spent in collectives inside them (`LLM(tensor_parallel_size=2)`, `lab.parallel`), sets the measured
communication share beside the model's prediction, projects it to Llama-3-70B at TP=8 on NVLink and PCIe, and
asks what latency the article's 40% takes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lab.machine.hardware import GPUS
from lab import memory as mem
from lab.memory import ModelShape
from lab.parallel.sharding import rank_shapes
from lab.models.loader import default_dtype, parse_dtype
from lab.parallel import comm_bench
from lab.parallel.comm_model import LINKS, Link, alpha_for_share, pipeline_bubble, tp_decode_step
from lab.figures.style import PALETTE, error_extents, legend_outside
from lab.workflow.run import as_tuple, check_choice, check_device, check_model, check_dtype, check_range, resolve_device
from lab.bench.decode import start_decode_batch

# The multi-process measurements (links, TP and PP on the engine) run as processes of one CPU with gloo: one GPU
# cannot hold two NCCL ranks, so on a GPU machine they stay on its CPU and DEVICE times one rank's compute
# (`lab.studies.parallelism.rank`).
PROCESS_DEVICE = "cpu"


@dataclass
class ParallelParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where one rank's compute is timed: "auto" (CUDA when present), "cpu", "cuda", "cuda:N"
    MODEL: str = "smollm2-135m"
    DTYPE: str = "auto"  # of the timed steps (the equality check runs in float32)
    COMM_SIZES: tuple = tuple(4 ** k for k in range(1, 13))  # bytes, 4 B .. 16 MiB
    COMM_REPEATS: int = 30
    BATCHES: tuple = (1, 8, 32)  # decode batch sizes, timed at TP 1 and 2
    PREFILL_TOKENS: tuple = (128, 512)  # prompt lengths of the timed prefill steps
    STEPS: int = 16  # timed steps per point
    MICRO_BATCHES: tuple = (1, 2, 4, 8, 16)  # the pipeline's micro-batch counts
    PP_BATCH: int = 16  # sequences in the pipeline's decode and prefill steps
    PP_PROMPT: int = 64  # tokens of each prompt in its prefill steps
    PROJECT_MODEL: str = "llama-3-70b"
    PROJECT_TP: int = 8
    PROJECT_BATCHES: tuple = (1, 8, 64, 256)
    CONTEXT: int = 2048  # tokens of context per sequence in the projection
    HARDWARE: str = "h100-sxm"
    ALPHAS_US: tuple = (1, 2, 5, 10, 15, 20, 30, 50, 80)  # the latency sweep of the projection
    RANK_LAYERS: int = 1  # layers of one PROJECT_TP rank timed on DEVICE (the step scaled to all of them)
    PRESETS: ClassVar[dict] = {
        "quick": {"COMM_REPEATS": 10, "BATCHES": (1,), "PREFILL_TOKENS": (256,), "STEPS": 4,
                  "MICRO_BATCHES": (1, 2, 4, 8), "PP_BATCH": 8},
        # smoke: the rank's decode at batches 1 and 8 only (64 and 256 at 2K tokens of KV were 10 of its 38 s)
        "smoke": {"MODEL": "random:tiny", "COMM_SIZES": (16, 4096), "COMM_REPEATS": 2, "BATCHES": (1, 2),
                  "PREFILL_TOKENS": (32,), "STEPS": 2, "MICRO_BATCHES": (1, 2), "PP_BATCH": 2, "PP_PROMPT": 8,
                  "ALPHAS_US": (5, 20), "PROJECT_BATCHES": (1, 8)},
        # gpu: every layer of one Llama-3-70B TP=8 rank timed on the GPU in bf16 (17 GB of weights, KV to batch
        # 256 at 2K tokens), and the TP=8 step projected from that measured compute; the multi-process
        # measurements stay on the CPU (PROCESS_DEVICE) at one batch, one prompt and m = 1 and 8 (the CPU
        # reference has their sweeps). ~40 s on one H200 (gpu/gpu_suite.sh allots 40): the rank ~1 s and probe
        # 3 s, but four spawned process groups (the link sweep, TP=2, the memory check, PP=2 at m = 1 then 8) at
        # ~3.5 s each, two in-process engines ~3 s and their CPU steps ~4 s, which these sections
        # need at any size; 8 s start.
        "gpu": {"RANK_LAYERS": 80, "COMM_SIZES": (4, 256, 16384, 1 << 20, 1 << 24), "COMM_REPEATS": 10,
                "BATCHES": (8,), "PREFILL_TOKENS": (128,), "STEPS": 4, "MICRO_BATCHES": (1, 8), "PP_BATCH": 8,
                "PP_PROMPT": 32},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        check_model("MODEL", self.MODEL, PROCESS_DEVICE, self.DTYPE)
        # the engine's processes run on PROCESS_DEVICE, one rank's compute on DEVICE: each in its serving dtype
        self.torch_dtype = parse_dtype(self.DTYPE) or default_dtype(PROCESS_DEVICE)
        self.device_dtype = parse_dtype(self.DTYPE) or default_dtype(resolve_device(self.DEVICE))
        for name in ("COMM_SIZES", "BATCHES", "PREFILL_TOKENS", "MICRO_BATCHES", "PROJECT_BATCHES", "ALPHAS_US"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
            for v in getattr(self, name):
                check_range(name, v, 1, 1 << 30, int)
        check_range("COMM_REPEATS", self.COMM_REPEATS, 1, 10_000, int)
        check_range("STEPS", self.STEPS, 1, 1000, int)
        check_range("PP_BATCH", self.PP_BATCH, 1, 256, int)
        check_range("PP_PROMPT", self.PP_PROMPT, 1, 8192, int)
        check_range("PROJECT_TP", self.PROJECT_TP, 1, 64, int)
        check_range("CONTEXT", self.CONTEXT, 1, 1 << 20, int)
        check_choice("HARDWARE", self.HARDWARE, sorted(GPUS))
        layers = ModelShape.preset(self.PROJECT_MODEL).num_layers  # an unknown preset is refused here, by name
        check_range("RANK_LAYERS", self.RANK_LAYERS, 1, layers, int)


# ---- this machine's links ------------------------------------------------------------------------------------
def links(p: ParallelParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the ping-pong and all-reduce sweep between 2 processes, and each op's alpha-beta fit)."""
    sweep = comm_bench.measure(2, p.COMM_SIZES, p.COMM_REPEATS, device=PROCESS_DEVICE)
    return sweep, comm_bench.fit(sweep, 2)


def plot_links(sweep: pd.DataFrame, fitted: pd.DataFrame):
    """One panel per collective: each message size's median with its min-max over repeats, the mean, and the
    alpha-beta fits of both, time against bytes on log axes."""
    ops = list(dict.fromkeys(sweep["op"]))
    fig, axes = plt.subplots(1, len(ops), figsize=(5.2 * len(ops), 4.4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        g = sweep[sweep["op"] == op]
        yerr = error_extents(g["median_s"], g["min_s"], g["max_s"], [f"{op}, {size} bytes" for size in g["bytes"]],
                             scale=1e6)  # the min-max range around each size's median, in us
        ax.errorbar(g["bytes"], 1e6 * g["median_s"], yerr=yerr, fmt="o", color=PALETTE[0], label="median (min-max)")
        ax.plot(g["bytes"], 1e6 * g["mean_s"], "x", color=PALETTE[1], label="mean")
        n = np.logspace(np.log10(g["bytes"].min()), np.log10(g["bytes"].max()), 50)
        for stat, style, colour in (("median", "--", PALETTE[2]), ("mean", ":", PALETTE[3])):
            f = fitted[(fitted["op"] == op) & (fitted["statistic"] == stat)].iloc[0]
            # with 2 ranks a send and an all-reduce (ring factor 2(p - 1)/p) both move n bytes a link
            ax.plot(n, f["alpha_us"] + 1e6 * n / (1e9 * f["bandwidth_GBps"]), style, color=colour,
                    label=f"{stat} fit: {f['alpha_us']:.0f} us + n / {f['bandwidth_GBps']:.2f} GB/s")
        ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time (us, log scale)",
               title=f"{op} between 2 processes on this machine")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    return fig


# ---- projection to real deployments --------------------------------------------------------------------------
def projection(p: ParallelParams, links_: dict[str, Link] | None = None) -> pd.DataFrame:
    """Per link and batch size: PROJECT_MODEL's decode step at PROJECT_TP (the roofline's bound for a rank's share
    of the weights and KV on HARDWARE, plus the collectives), its communication share, and the all-reduce
    latency (alpha) at which the share would reach 40%, the article's figure."""
    shape, hw = ModelShape.preset(p.PROJECT_MODEL), GPUS[p.HARDWARE]
    rows = []
    for key, link in (links_ or LINKS).items():
        for batch in p.PROJECT_BATCHES:
            step = tp_decode_step(shape, hw, p.PROJECT_TP, batch, p.CONTEXT, link)
            rows.append({"link": key, "alpha_us": 1e6 * link.alpha, "bus_GBps": link.bandwidth / 1e9,
                         "batch": batch, "compute ms": 1e3 * step.compute_s, "comm ms": 1e3 * step.comm_s,
                         "all-reduces": step.allreduces, "bytes each": step.allreduce_bytes,
                         "comm share": step.comm_share,
                         "alpha for 40% (us)": 1e6 * alpha_for_share(shape, hw, p.PROJECT_TP, batch, p.CONTEXT, link,
                                                                      0.4)})
    return pd.DataFrame(rows)


def alpha_sweep(p: ParallelParams) -> pd.DataFrame:
    """The communication share of a batch-1 and a batch-64 decode step against the collective latency, at each
    link's bandwidth."""
    shape, hw = ModelShape.preset(p.PROJECT_MODEL), GPUS[p.HARDWARE]
    rows = []
    for key, link in LINKS.items():
        for alpha in p.ALPHAS_US:
            for batch in (1, 64):
                step = tp_decode_step(shape, hw, p.PROJECT_TP, batch, p.CONTEXT, Link(key, alpha * 1e-6, link.bandwidth))
                rows.append({"link": key, "alpha_us": alpha, "batch": batch, "comm share": step.comm_share})
    return pd.DataFrame(rows)


def plot_alpha_sweep(sweep: pd.DataFrame, p: ParallelParams):
    fig, ax = plt.subplots(figsize=(8.5, 4))
    for i, ((key, batch), g) in enumerate(sweep.groupby(["link", "batch"])):
        ax.plot(g["alpha_us"], 100 * g["comm share"], "o-", color=PALETTE[i], label=f"{key}, batch {batch}")
    ax.axhline(40, color="k", ls=":", label="the replay article's 40%")
    ax.set_xscale("log")
    ax.set_xlabel("all-reduce latency alpha (us, log scale)")
    ax.set_ylabel("communication share of a decode step (%)")
    ax.set_title(f"Projected: {p.PROJECT_MODEL} at TP={p.PROJECT_TP} on {GPUS[p.HARDWARE].name}, communication share "
                 f"against all-reduce latency (roofline step + alpha-beta)", fontsize=9)
    legend_outside(ax)
    return fig


# ---- the pipeline bubble -------------------------------------------------------------------------------------
def bubble_model(stages: int, micro_batches) -> pd.DataFrame:
    """(p - 1) / (m + p - 1) for each m, and whether m meets the article's m >= 4p rule."""
    return pd.DataFrame([{"stages": stages, "micro_batches": m, "bubble (model)": pipeline_bubble(stages, m),
                          "m >= 4p": m >= 4 * stages} for m in micro_batches])


# ---- tensor parallelism on the engine --------------------------------------------------------------------------
def _engine(p: ParallelParams, tp: int, batch: int, context: int):
    from lab.engine import LLM

    max_len = context + p.STEPS + 8
    return LLM(p.MODEL, dtype=p.DTYPE, device=PROCESS_DEVICE, tensor_parallel_size=tp, max_num_seqs=batch,
               max_model_len=max_len, num_kv_blocks=batch * -(-max_len // 16) + 8,
               max_num_batched_tokens=max(4096, batch * context), enable_prefix_caching=False)


def _timed_step(llm, rows: list, **labels) -> None:
    before = llm.stats()
    start = time.perf_counter()
    llm.step()
    seconds = time.perf_counter() - start
    after = llm.stats()
    rows.append({**labels, "step_s": seconds,
                 **{k: after.get(f"tp_{k}", 0) - before.get(f"tp_{k}", 0)
                    for k in ("comm_seconds", "all_reduce_seconds", "gather_seconds", "broadcast_seconds",
                              "comm_calls", "all_reduce_calls", "broadcast_bytes")}})


def tp_steps(p: ParallelParams, tp: int, context: int = 256) -> pd.DataFrame:
    """Decode steps at each of BATCHES (sequences of `context` tokens) and prefill steps of each of
    PREFILL_TOKENS (one prompt alone), STEPS timed each, at tensor-parallel degree `tp`: each step's wall time on
    rank 0 and the seconds, calls and bytes of its collectives. One engine serves every point, sized for the
    largest: starting a process group (a spawn, imports, a model load: 3-10 s a group on 2 cores) is not the
    question, and a step's work is its batch's, whatever room the engine has beside it."""
    from lab.engine import SamplingParams

    rows = []
    llm = _engine(p, tp, max(p.BATCHES), max(context, *p.PREFILL_TOKENS))
    try:
        for batch in tqdm(p.BATCHES, desc=f"TP={tp}: decode batches"):
            start_decode_batch(llm, batch, context, p.STEPS)
            for _ in range(p.STEPS):
                _timed_step(llm, rows, tp=tp, phase="decode", tokens=batch)
            while llm.has_unfinished():
                llm.step()
        for n in tqdm(p.PREFILL_TOKENS, desc=f"TP={tp}: prefills"):
            for r in range(p.STEPS + 1):
                llm.add_request([(13 * r + j) % 5000 + 10 for j in range(n)],
                                SamplingParams(temperature=0, max_tokens=1))
                if r == 0:
                    llm.step()  # warm-up at this length, untimed
                else:
                    _timed_step(llm, rows, tp=tp, phase="prefill", tokens=n)
    finally:
        llm.close()
    return pd.DataFrame(rows)


def tp_summary(steps: pd.DataFrame, fitted: pd.DataFrame, shape: ModelShape, dtype_bytes: int) -> pd.DataFrame:
    """Per phase and tokens: median step at TP=1 and TP=2, the speedup, the measured communication share at TP=2
    (rank 0's seconds in collectives / its step) and the alpha-beta model's prediction of those seconds from
    this machine's fitted links (2 L + 1 all-reduces and one gather of the logits on the tensor group at the mean
    cost of an all-reduce between matmuls, two broadcasts of the batch on the control group at a send's)."""
    from lab.parallel.comm_model import send_seconds, tp_comm_seconds

    f = fitted[fitted["statistic"] == "mean"].set_index("op")  # a step of 2 L + 2 collectives pays their mean
    ar = Link("this machine, all-reduce in a step", f.loc["all-reduce between matmuls", "alpha_us"] * 1e-6,
              f.loc["all-reduce between matmuls", "bandwidth_GBps"] * 1e9)
    p2p = Link("this machine, send", f.loc["ping-pong", "alpha_us"] * 1e-6, f.loc["ping-pong", "bandwidth_GBps"] * 1e9)
    rows = []
    for (phase, tokens), g in steps.groupby(["phase", "tokens"]):
        one, two = g[g["tp"] == 1], g[g["tp"] == 2]
        comm_model, *_ = tp_comm_seconds(shape, 2, int(tokens), ar, dtype_bytes,
                                         logits_rows=int(tokens) if phase == "decode" else 1)
        comm_model += 2 * send_seconds(float(two["broadcast_bytes"].median()) / 2, p2p)
        rows.append({"phase": phase, "tokens": tokens, "TP=1 ms": 1e3 * one["step_s"].median(),
                     "TP=2 ms": 1e3 * two["step_s"].median(), "speedup": one["step_s"].median() / two["step_s"].median(),
                     "TP=2 comm ms": 1e3 * two["comm_seconds"].median(),
                     "comm share (measured)": (two["comm_seconds"] / two["step_s"]).median(),
                     "all-reduce ms": 1e3 * two["all_reduce_seconds"].median(),
                     "collectives": int(two["comm_calls"].median()),
                     "us per collective (measured)": 1e6 * (two["comm_seconds"] / two["comm_calls"]).median(),
                     "comm ms (alpha-beta model)": 1e3 * comm_model,
                     "model / measured": comm_model / two["comm_seconds"].median()})
    return pd.DataFrame(rows)


# ---- memory per device -----------------------------------------------------------------------------------------
def rank_memory(shape: ModelShape, tp: int, weights: str = "bf16", kv_dtype: str = "bf16") -> pd.DataFrame:
    """Each rank's weights and KV bytes per token at tensor-parallel degree `tp`: `lab.memory`'s accounts of the
    rank's shape (`lab.parallel.sharding.rank_shapes`: whole KV groups, the larger shares first, norms whole)."""
    return pd.DataFrame([{"rank": r, "weight bytes": mem.weight_bytes(rs, weights)["total"],
                          "KV bytes per token": mem.kv_bytes_per_token(rs, kv_dtype)}
                         for r, rs in enumerate(rank_shapes(shape, tp))])


def engine_memory(p: ParallelParams, tp: int = 2, num_kv_blocks: int = 64) -> pd.DataFrame:
    """Each rank's weight and KV-pool bytes as the engine allocated them at degree `tp` (`tp_rank_*` stats),
    beside `rank_memory`'s count of that rank's share."""
    from lab.engine import LLM

    llm = LLM(p.MODEL, dtype=p.DTYPE, device=PROCESS_DEVICE, tensor_parallel_size=tp, num_kv_blocks=num_kv_blocks,
              max_model_len=512)
    stats, block_size = llm.stats(), llm.config.block_size
    llm.close()
    fmt = {4: "fp32", 2: "bf16"}[p.torch_dtype.itemsize]
    counted = rank_memory(ModelShape.load(p.MODEL), tp, fmt, fmt)
    counted["weight bytes (engine)"] = stats["tp_rank_weight_bytes"]
    counted["KV pool bytes (engine)"] = stats["tp_rank_kv_bytes"]
    counted["KV pool bytes (counted)"] = counted["KV bytes per token"] * num_kv_blocks * block_size
    return counted


# ---- pipeline parallelism on the engine ------------------------------------------------------------------------
def pp_steps(p: ParallelParams, context: int = 256) -> pd.DataFrame:
    """At PP=2 for each of MICRO_BATCHES (and at PP=1): STEPS decode steps of PP_BATCH sequences of `context`
    tokens and STEPS prefill steps of PP_BATCH prompts of PP_PROMPT tokens, each step's wall time on rank 0 and
    its wait for the last stage (`pp_recv_seconds`: rank 0 runs the first stage, then waits for the logits).
    One PP=2 engine serves every count (`PipelineGroup.set_micro_batches` between them: only rank 0 reads it),
    so its ranks start once, not once a count."""
    from lab.engine import LLM

    max_len = context + p.STEPS * (p.PP_PROMPT + 1) + 8
    rows, bar = [], tqdm(total=1 + len(p.MICRO_BATCHES), desc="PP=1, then PP=2 at each micro-batch count")
    for pp, counts in ((1, (None,)), (2, p.MICRO_BATCHES)):
        opts = {} if pp == 1 else {"pipeline_parallel_size": 2}
        llm = LLM(p.MODEL, dtype=p.DTYPE, device=PROCESS_DEVICE, max_num_seqs=p.PP_BATCH, max_model_len=max_len,
                  enable_prefix_caching=False, num_kv_blocks=2 * p.PP_BATCH * -(-max_len // 16),
                  max_num_batched_tokens=p.PP_BATCH * context, **opts)
        try:
            for m in counts:
                if m is not None:
                    llm.extensions["pipeline_parallel"].group.set_micro_batches(m)
                rows += _pp_phases(llm, p, context, m)
                bar.update()
        finally:
            llm.close()
    bar.close()
    return pd.DataFrame(rows)


def _pp_phases(llm, p: ParallelParams, context: int, m: int | None) -> list[dict]:
    """`pp_steps`' decode and prefill steps on `llm` with `m` micro-batches (None: PP=1), the engine left idle."""
    from lab.engine import SamplingParams

    rows = []
    start_decode_batch(llm, p.PP_BATCH, context, p.STEPS)
    for phase in ("decode", "prefill"):
        for r in range(p.STEPS):
            if phase == "prefill":
                for i in range(p.PP_BATCH):
                    llm.add_request([(31 * r + 7 * i + j) % 5000 + 10 for j in range(p.PP_PROMPT)],
                                    SamplingParams(temperature=0, max_tokens=1))
            before = llm.stats()
            start = time.perf_counter()
            llm.step()
            seconds = time.perf_counter() - start
            wait = llm.stats().get("pp_recv_seconds", 0) - before.get("pp_recv_seconds", 0)
            rows.append({"micro_batches": m or 0, "pp": 1 if m is None else 2, "phase": phase, "step_s": seconds,
                         "rank0_wait_s": wait})
        while phase == "decode" and llm.has_unfinished():
            llm.step()
    while llm.has_unfinished():  # the prefill requests' one token each, before the next count's batch
        llm.step()
    return rows


def bubble_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per phase and micro-batch count: the median step at PP=2 against PP=1, rank 0's measured wait share
    against the bubble (p - 1) / (m + p - 1)."""
    base = steps[steps["pp"] == 1].groupby("phase")["step_s"].median()
    rows = []
    for (phase, m), g in steps[steps["pp"] == 2].groupby(["phase", "micro_batches"]):
        rows.append({"phase": phase, "micro_batches": m, "PP=1 ms": 1e3 * base[phase],
                     "PP=2 ms": 1e3 * g["step_s"].median(), "wait share (measured)": (g["rank0_wait_s"] / g["step_s"]).median(),
                     "bubble (p - 1) / (m + p - 1)": pipeline_bubble(2, int(m)), "m >= 4p": m >= 4 * 2})  # p = 2 stages
    return pd.DataFrame(rows)
