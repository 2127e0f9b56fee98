"""Roofline bounds for LLM inference: is a step limited by memory bandwidth or by arithmetic?

Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for multicore
architectures", CACM 52(4), 2009: a computation doing F FLOPs while moving Q bytes to and from
memory has arithmetic intensity I = F / Q and can run no faster than min(peak, I * bandwidth);
equivalently it takes at least max(Q / bandwidth, F / peak). The ridge point, peak / bandwidth, is
the intensity at which the two ceilings meet: below it bandwidth binds, above it arithmetic does.

For a decoder-only transformer with P active parameters (a matmul costs one multiply-add, 2 FLOPs,
per parameter per token; Kaplan et al., "Scaling laws for neural language models", 2020, sec. 2.1):

- prefilling T tokens does about 2 P T FLOPs while reading the weights once, so with 2-byte weights
  its intensity is about T: a prompt of a few hundred tokens already sits past an H100's ridge;
- one decode step for B sequences at context L reads the weights once plus B L tokens of KV cache
  and does B (2 P + attention) FLOPs, so at B = 1 its intensity is about 1 FLOP/byte for 2-byte
  weights, and batching raises it until the step turns compute-bound (`crossover_batch`).

The functions take numbers, not model objects, so a memory model (`lab.memory`) or a notebook can
feed them whatever byte and FLOP counts it derives. Each bound assumes memory traffic and
arithmetic overlap perfectly and each byte moves once (activations are ignored), so times are
lower bounds and rates upper bounds. `compute_efficiency` and `memory_efficiency` (the achieved
fraction of peak FLOP/s and of bandwidth) scale the ceilings; they default to 1.0, the bound
itself, and a smaller value should come from a measurement, never from a constant in here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from matplotlib.figure import Figure

from lab import memory as mem
from lab.machine.hardware import Hardware
from lab.figures.style import PALETTE, legend_outside

Bound = Literal["memory", "compute"]

# Powers of two, 1 to 1024: without KV traffic the crossover is near the ridge point, 150-420 FLOP/byte
# for the GPUs in lab.machine.hardware, so this range shows both sides of it.
DEFAULT_BATCHES = tuple(2**k for k in range(11))


def _ceilings(hw: Hardware, compute_efficiency: float, memory_efficiency: float) -> tuple[float, float]:
    for name, value in (("compute_efficiency", compute_efficiency), ("memory_efficiency", memory_efficiency)):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name} is a fraction of peak in (0, 1], got {value!r}")
    return hw.peak_flops * compute_efficiency, hw.mem_bandwidth * memory_efficiency


def ridge_point(hw: Hardware, *, compute_efficiency: float = 1.0, memory_efficiency: float = 1.0) -> float:
    """Intensity (FLOP/byte) at which the bandwidth slope meets the compute ceiling."""
    peak, bandwidth = _ceilings(hw, compute_efficiency, memory_efficiency)
    return peak / bandwidth


def attainable_flops(hw: Hardware, intensity: float, *, compute_efficiency: float = 1.0,
                     memory_efficiency: float = 1.0) -> float:
    """The roof: the highest FLOP/s a computation of this intensity (FLOP/byte) can reach."""
    peak, bandwidth = _ceilings(hw, compute_efficiency, memory_efficiency)
    return min(peak, intensity * bandwidth)


@dataclass(frozen=True)
class StepTime:
    memory_s: float   # bytes moved / bandwidth
    compute_s: float  # FLOPs / peak

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> Bound:
        # At exactly the ridge both bind; "memory" then, since more batch is what tips it over.
        return "compute" if self.compute_s > self.memory_s else "memory"


def prefill_time_lower_bound(hw: Hardware, flops: float, bytes_moved: float, *, compute_efficiency: float = 1.0,
                             memory_efficiency: float = 1.0) -> StepTime:
    """Lower bound on the time of any computation doing `flops` while moving `bytes_moved`."""
    peak, bandwidth = _ceilings(hw, compute_efficiency, memory_efficiency)
    return StepTime(memory_s=bytes_moved / bandwidth, compute_s=flops / peak)


def decode_step_time(hw: Hardware, weight_bytes: float, kv_bytes_read: float, flops: float, *,
                     compute_efficiency: float = 1.0, memory_efficiency: float = 1.0) -> StepTime:
    """Lower bound on one decode step: the weights and the batch's KV cache are each read once."""
    return prefill_time_lower_bound(hw, flops, weight_bytes + kv_bytes_read, compute_efficiency=compute_efficiency,
                                    memory_efficiency=memory_efficiency)


@dataclass(frozen=True)
class ModelCost:
    """A model reduced to the numbers the roofline needs.

    `weight_bytes` is what one forward pass reads (for a mixture of experts in a batch, the experts
    the batch touches, which can exceed the active ones); `active_params` is what each token
    multiplies by; `kv_bytes_per_token` covers all layers, K and V; `attn_flops_per_ctx_token` is
    the attention cost of one query token against one context token (see
    `attention_flops_per_context_token`), 0 to leave attention out.
    """

    weight_bytes: float
    active_params: float
    kv_bytes_per_token: float
    attn_flops_per_ctx_token: float = 0.0


def attention_flops_per_context_token(n_layers: int, n_heads: int, head_dim: int) -> float:
    """FLOPs for one query token against one context token: q.k and p*v, one multiply-add each per
    head dimension, in every query head of every layer. Grouped-query attention shares K/V between
    heads, which saves bytes, not FLOPs, so query heads are what counts here."""
    return 2 * 2 * n_layers * n_heads * head_dim


def model_cost(s: mem.ModelShape, weights: str, kv_dtype: str) -> ModelCost:
    """The roofline's numbers for a `lab.memory.ModelShape` with weights and KV cache in these formats."""
    heads_dim = (s.qk_nope_head_dim + s.qk_rope_head_dim) if s.is_mla else s.head_dim
    return ModelCost(
        weight_bytes=mem.weight_bytes(s, weights)["total"], active_params=mem.param_counts(s)["active"],
        kv_bytes_per_token=mem.kv_bytes_per_token(s, kv_dtype),
        attn_flops_per_ctx_token=attention_flops_per_context_token(s.num_layers, s.num_heads, heads_dim))


def prefill_flops(model: ModelCost, n_tokens: int, cached: int = 0) -> float:
    """Matmul FLOPs of a prompt plus causal attention (token i attends to i tokens). With the first `cached`
    tokens' KV already there (a prefix-cache hit), only the others pass through the linears and attend."""
    linear = 2.0 * model.active_params * (n_tokens - cached)
    return linear + model.attn_flops_per_ctx_token * (n_tokens * (n_tokens + 1) - cached * (cached + 1)) / 2


def prefill_bytes(model: ModelCost, n_tokens: int) -> float:
    """Weights read once and the prompt's KV cache written once."""
    return model.weight_bytes + model.kv_bytes_per_token * n_tokens


def decode_flops(model: ModelCost, batch: int, context_len: int) -> float:
    return batch * (2.0 * model.active_params + model.attn_flops_per_ctx_token * context_len)


def decode_bytes(model: ModelCost, batch: int, context_len: int) -> float:
    return model.weight_bytes + batch * context_len * model.kv_bytes_per_token


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context_len: int
    tpot_s: float           # step time: every sequence in the batch gets one token per step
    tokens_per_s: float     # batch / step time, over all sequences
    intensity: float        # FLOP/byte of the step
    bound: Bound
    memory_s: float
    compute_s: float
    fits_in_memory: bool    # weights plus the batch's KV cache within hw.memory_bytes


def decode_table(hw: Hardware, model: ModelCost, context_len: int, batch_sizes: Iterable[int] = DEFAULT_BATCHES, *,
                 compute_efficiency: float = 1.0, memory_efficiency: float = 1.0) -> list[DecodePoint]:
    """Decode-step bounds for each batch size, every sequence at `context_len` tokens of context.

    Rows that do not fit in memory are kept and flagged, so a plot can show where capacity, rather
    than bandwidth or compute, ends the curve. `pandas.DataFrame(rows)` turns the list into a table.
    """
    rows = []
    for batch in batch_sizes:
        kv_bytes = batch * context_len * model.kv_bytes_per_token
        flops = decode_flops(model, batch, context_len)
        step = decode_step_time(hw, model.weight_bytes, kv_bytes, flops, compute_efficiency=compute_efficiency,
                                memory_efficiency=memory_efficiency)
        rows.append(DecodePoint(
            batch=batch, context_len=context_len, tpot_s=step.seconds, tokens_per_s=batch / step.seconds,
            intensity=flops / decode_bytes(model, batch, context_len), bound=step.bound,
            memory_s=step.memory_s, compute_s=step.compute_s,
            fits_in_memory=model.weight_bytes + kv_bytes <= hw.memory_bytes))
    return rows


def crossover_batch(hw: Hardware, model: ModelCost, context_len: int, *, compute_efficiency: float = 1.0,
                    memory_efficiency: float = 1.0) -> float:
    """Batch size at which a decode step turns from memory- to compute-bound (math.inf if never).

    Solving B c / peak = (W + B k) / bw, with c = 2 P + a L FLOPs and k = L * kv bytes per sequence:
    B* = (W / bw) / (c / peak - k / bw). Without KV traffic this is ridge * W / (2 P), the ridge
    point itself for 2-byte weights. If a sequence's own intensity c / k is below the ridge, its KV
    reads grow as fast as its arithmetic and no batch size reaches the compute ceiling.
    """
    peak, bandwidth = _ceilings(hw, compute_efficiency, memory_efficiency)
    per_seq_flops = 2.0 * model.active_params + model.attn_flops_per_ctx_token * context_len
    per_seq_bytes = context_len * model.kv_bytes_per_token
    margin = per_seq_flops / peak - per_seq_bytes / bandwidth
    return model.weight_bytes / bandwidth / margin if margin > 0 else math.inf


@dataclass(frozen=True)
class RooflinePoint:
    label: str                        # e.g. "prefill 2048 tokens", "decode B=64"
    intensity: float                  # FLOP/byte
    flops_per_s: float | None = None  # a measured rate; None plots the point on the roof


def plot_roofline(hw: Hardware, points: Sequence[RooflinePoint] = (), *, compute_efficiency: float = 1.0,
                  memory_efficiency: float = 1.0, ax=None) -> Figure:
    """Log-log roofline of `hw` with its ridge point and labelled points; returns the figure.

    Built on `matplotlib.figure.Figure` rather than pyplot so repeated calls leave no global
    figures behind; Jupyter still displays the returned figure. Pass `ax` to draw into an existing
    axes instead.
    """
    peak, bandwidth = _ceilings(hw, compute_efficiency, memory_efficiency)
    ridge = peak / bandwidth
    if ax is None:
        fig = Figure(figsize=(9.5, 4.8), layout="constrained")
        ax = fig.subplots()
    else:
        fig = ax.figure

    intensities = [p.intensity for p in points] + [ridge]
    x = np.geomspace(min(intensities) / 8, max(intensities) * 8, 400)
    derated = "" if compute_efficiency == memory_efficiency == 1.0 else (
        f" at {compute_efficiency:.0%} of peak FLOP/s, {memory_efficiency:.0%} of bandwidth")
    ax.loglog(x, np.minimum(peak, x * bandwidth), color="black", lw=2,
              label=f"roof: {peak / 1e12:.4g} TFLOP/s, {bandwidth / 1e12:.4g} TB/s{derated}")
    ax.axvline(ridge, color="gray", ls=":", lw=1, label=f"ridge point: {ridge:.0f} FLOP/B")
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak), xytext=(4, -14), textcoords="offset points",
                color="gray", fontsize=8)

    # Each point its own colour, named in the legend: points close in intensity (decode at batch 64 and 256) would
    # make their annotations collide. A measured point is hollow, one placed on the roof filled.
    for point, colour in zip(points, PALETTE * (1 + len(points) // len(PALETTE))):
        on_roof = point.flops_per_s is None
        y = min(peak, point.intensity * bandwidth) if on_roof else point.flops_per_s
        ax.plot(point.intensity, y, "o", mfc=colour if on_roof else "none", mec=colour, ms=7,
                label=f"{point.label} ({point.intensity:.3g} FLOP/B)")

    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s (log scale)")
    ax.set_title(f"Roofline of {hw.name}: where prefill and decode steps sit", fontsize=10)
    legend_outside(ax)
    ax.grid(True, which="both", alpha=0.2)
    return fig
