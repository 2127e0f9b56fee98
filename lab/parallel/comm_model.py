"""What communication costs a tensor- or pipeline-parallel step, by the alpha-beta model.

A collective on n bytes takes alpha + n x (its traffic factor) / bandwidth (Hockney, 1994; the factors are those
of the ring algorithms, Thakur, Rabenseifner and Gropp, 2005): an all-reduce over p ranks moves 2(p - 1)/p of the
message through each rank's link, an all-gather (p - 1)/p, a point-to-point send 1. `bandwidth` is what
nccl-tests calls bus bandwidth (busbw = n / t x the factor), so published busbw figures plug in directly, and
`alpha` is the collective's latency floor, what a tiny message costs.

A Megatron-style tensor-parallel decoder layer (Shoeybi et al., 2019, arXiv:1909.08053) all-reduces its hidden
states twice (after the attention's output projection and after the MLP's down projection); a vocabulary-parallel
embedding adds one all-reduce and the LM head one all-gather of the logits. `tp_step` counts them for a step of
`tokens` tokens and sets them beside the roofline's time for the rank's share of the weights and KV cache, so
the communication share of a step can be predicted for any model, degree and link, and compared with the share
measured on the lab's engine (notebook 08).

A pipeline of p stages run over m micro-batches idles for (p - 1) / (m + p - 1) of its time (GPipe, Huang et al.,
2019, arXiv:1811.06965): `pipeline_bubble`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.machine.hardware import Hardware
from lab.memory import ModelShape
from lab.machine.roofline import decode_table, model_cost


@dataclass(frozen=True)
class Link:
    """A link's alpha-beta parameters: latency in seconds, bus bandwidth in bytes/s, and where they come from."""

    name: str
    alpha: float
    bandwidth: float
    source: str = ""

    def __post_init__(self):
        if not (self.alpha >= 0 and self.bandwidth > 0):
            raise ValueError(f"{self.name}: alpha must be >= 0 and bandwidth > 0, got {self.alpha}, {self.bandwidth}")


# Bus bandwidths of 8 GPUs from nccl-tests' all_reduce_perf at large messages, as published in "NCCL-tests in
# practice" (Alaya NeW, 2026-05-06): 8x H100 SXM5 NVLink 460-480 GB/s, 8x H100 PCIe (no NVSwitch) 35-45 GB/s. The
# latency floors are not published there: 15 us and 30 us are assumptions of the order small-message all-reduces
# take with NCCL on one node; notebook 08 sweeps alpha rather than trusting them.
LINKS = {
    "nvlink-h100x8": Link("8x H100 NVLink 4 / NVSwitch", 15e-6, 470e9,
                          "busbw: nccl-tests all_reduce_perf, 8x H100 SXM5 (Alaya NeW 2026); alpha assumed"),
    "pcie5-h100x8": Link("8x H100 PCIe Gen5, no NVLink", 30e-6, 40e9,
                         "busbw: nccl-tests all_reduce_perf, 8x H100 PCIe (Alaya NeW 2026); alpha assumed"),
}


def allreduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    return 0.0 if ranks == 1 else link.alpha + nbytes * 2 * (ranks - 1) / ranks / link.bandwidth


def allgather_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """`nbytes`: the gathered result's size (each rank contributes nbytes / ranks)."""
    return 0.0 if ranks == 1 else link.alpha + nbytes * (ranks - 1) / ranks / link.bandwidth


def send_seconds(nbytes: float, link: Link) -> float:
    return link.alpha + nbytes / link.bandwidth


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """The idle share of a p-stage pipeline over m micro-batches of equal cost: (p - 1) / (m + p - 1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages and micro_batches must be >= 1, got {stages} and {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)


@dataclass(frozen=True)
class TPStep:
    compute_s: float  # the rank's share of the step, from the roofline (weights and KV read once)
    comm_s: float
    allreduces: int
    allreduce_bytes: float  # each
    gather_bytes: float

    @property
    def seconds(self) -> float:
        return self.compute_s + self.comm_s  # no overlap: each all-reduce waits for the matmul before it

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.seconds


def tp_comm_seconds(shape: ModelShape, ranks: int, tokens: int, link: Link, dtype_bytes: int = 2,
                    logits_rows: int | None = None) -> tuple[float, int, float, float]:
    """(seconds, all-reduces, bytes each, gathered logits bytes) of one tensor-parallel forward of `tokens`
    tokens: two all-reduces a layer and one for the embedding, and the LM head's gather of `logits_rows` rows
    (default: one a token) of the vocabulary in float32."""
    n_ar = 2 * shape.num_layers + 1
    ar_bytes = tokens * shape.hidden_size * dtype_bytes
    gather = (tokens if logits_rows is None else logits_rows) * shape.vocab_size * 4
    seconds = n_ar * allreduce_seconds(ar_bytes, ranks, link) + allgather_seconds(gather, ranks, link)
    return seconds, n_ar, ar_bytes, gather


def tp_decode_step(shape: ModelShape, hw: Hardware, ranks: int, batch: int, context: int, link: Link,
                   weights: str = "bf16", kv_dtype: str = "bf16") -> TPStep:
    """A decode step of `batch` sequences at `context` tokens on `ranks` devices: each reads 1/ranks of the
    weights and of the KV cache (the roofline's bound on `hw`), then the collectives of `tp_comm_seconds`."""
    point = decode_table(hw, model_cost(shape, weights, kv_dtype), context, [batch])[0]
    comm, n_ar, ar_bytes, gather = tp_comm_seconds(shape, ranks, batch, link)
    return TPStep(point.tpot_s / ranks, comm, n_ar, ar_bytes, gather)


def alpha_for_share(shape: ModelShape, hw: Hardware, ranks: int, batch: int, context: int, link: Link,
                    share: float) -> float:
    """The collective latency (alpha) at which the communication share of a decode step reaches `share`, with
    the link's bandwidth kept: what it takes for the article's 40% to happen."""
    step = tp_decode_step(shape, hw, ranks, batch, context, Link(link.name, 0.0, link.bandwidth))
    n_collectives = step.allreduces + 1
    # share = (c0 + n alpha) / (compute + c0 + n alpha)  =>  alpha = (share compute / (1 - share) - c0) / n
    return max(0.0, (share * step.compute_s / (1 - share) - step.comm_s) / n_collectives)


def fit_alpha_beta(nbytes, seconds, factor: float = 1.0) -> tuple[float, float]:
    """Alpha (s) and bandwidth (bytes/s) of t = alpha + factor x n / bandwidth over a size sweep, fitted by least
    squares on the relative error (weights 1 / t), so that the small messages, which set alpha, count as much as
    the large ones, which set the bandwidth."""
    n, t = np.asarray(nbytes, dtype=float) * factor, np.asarray(seconds, dtype=float)
    if n.size < 2 or np.ptp(n) == 0:
        raise ValueError("fitting alpha and beta needs at least two different message sizes")
    slope, intercept = np.polyfit(n, t, 1, w=1 / t)
    return float(max(intercept, 0.0)), float(1.0 / slope) if slope > 0 else float("inf")
