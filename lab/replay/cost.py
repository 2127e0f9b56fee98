"""The cost model of replay: recompute a window of W tokens' KV after an M-token prefix, or move it?

Replay (the seed article `000_6360c6a068e5cdc2.txt`) drops the KV of a recent window and recomputes it. Two
ways to recompute, and what each costs per window (L layers, H query heads, n_kv KV heads of d, hidden size E,
b bytes per element; MLA stores one latent of kv_lora_rank + rope dims per token and layer):

- **from token ids** (vLLM's recompute preemption, Cake's compute side): run every layer for the W tokens.
    linear FLOPs     2 P W            P = non-embedding parameters a token uses (active, for MoE)
    attention FLOPs  2 L H (d_qk + d_v) W (M + W/2)    the window's queries read the whole prefix
    and the prefix's KV is *read* by that attention: L M kv_elems b bytes, as large as what a decode reads;
- **from stored per-layer inputs** (HCache, Gao et al., 2024, arXiv:2410.05004): only the K/V projections,
    FLOPs 2 L E (kv_elems) W  from L W E b stored bytes, which exceed the KV itself under GQA
    (E > 2 n_kv d: SmolLM2 576 vs 384, Llama-3-70B 8192 vs 2048) and pay only for MHA.

Moving the window costs kv_bytes = L W kv_elems b over a link of bandwidth B. Recomputing costs FLOPs / R at
an achieved rate R, so recompute wins below the crossover bandwidth

    B* = R / (FLOPs per KV byte) = R kv_bytes / FLOPs.

The article compares the window's recompute with reading the *whole* context's KV; but replaying a window
does not spare the attention over the prefix, so the fair comparison is the window's own KV (this module), and
the prefix read belongs to the recompute side (`prefix_read_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.machine.hardware import GPUS, Hardware
from lab.memory import ModelShape, kv_elements_per_token_per_layer, param_counts


@dataclass(frozen=True)
class Link:
    """A tier the window's KV could be loaded from."""

    name: str
    bandwidth: float  # bytes/s, decimal, one direction
    source: str


# Usable one-direction rates. PCIe: 16 GT/s (Gen4) and 32 GT/s (Gen5) x16 with 128b/130b encoding give 31.5
# and 63 GB/s of payload before protocol overhead (PCI-SIG base specifications 4.0 and 5.0). Network: line rate
# / 8. NVMe: a PCIe Gen4 x4 SSD's sequential read (~7 GB/s, vendor datasheets of Gen4 drives).
LINKS: dict[str, Link] = {
    "pcie-gen4-x16": Link("PCIe Gen4 x16", 31.5e9, "PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b"),
    "pcie-gen5-x16": Link("PCIe Gen5 x16", 63e9, "PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b"),
    "net-100g": Link("100 Gb/s network", 12.5e9, "line rate / 8"),
    "net-200g": Link("200 Gb/s network", 25e9, "line rate / 8"),
    "net-400g": Link("400 Gb/s network", 50e9, "line rate / 8"),
    "nvme-gen4": Link("NVMe SSD (PCIe Gen4 x4)", 7e9, "sequential read of Gen4 x4 drives"),
}


def hbm_link(hw: Hardware) -> Link:
    return Link(f"{hw.name} memory", hw.mem_bandwidth, hw.source)


@dataclass(frozen=True)
class WindowCost:
    """What recomputing or moving the KV of `window` tokens after a `prefix`-token context costs."""

    model: str
    window: int
    prefix: int
    linear_flops: float
    attention_flops: float
    kv_bytes: float  # the window's KV: what a load moves
    prefix_read_bytes: float  # the prefix's KV that the recompute's attention reads
    hidden_bytes: float  # HCache: the window's stored per-layer inputs
    hcache_flops: float  # HCache: K/V projections only

    @property
    def recompute_flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def flops_per_kv_byte(self) -> float:
        return self.recompute_flops / self.kv_bytes

    def crossover_bandwidth(self, achieved_flops: float) -> float:
        """B*: links slower than this lose to recomputing at `achieved_flops`."""
        return achieved_flops * self.kv_bytes / self.recompute_flops


def _attention_dims(s: ModelShape) -> int:
    """d_qk + d_v of one query head (MLA: the nope + rope query/key dims and the value dims)."""
    if s.is_mla:
        return s.qk_nope_head_dim + s.qk_rope_head_dim + s.v_head_dim
    return 2 * s.head_dim


def window_cost(s: ModelShape, window: int, prefix: int, dtype_bytes: float = 2.0) -> WindowCost:
    if window < 1 or prefix < 0:
        raise ValueError(f"window must be >= 1 and prefix >= 0, got window={window}, prefix={prefix}")
    counts = param_counts(s)
    non_embedding = counts["active"] - counts["embedding"] - counts["lm_head"]
    kv_elems = kv_elements_per_token_per_layer(s)
    L = s.num_layers
    return WindowCost(
        model=s.name, window=window, prefix=prefix,
        linear_flops=2.0 * non_embedding * window,
        attention_flops=L * s.num_heads * _attention_dims(s) * 2.0 * window * (prefix + window / 2),
        kv_bytes=L * window * kv_elems * dtype_bytes,
        prefix_read_bytes=L * prefix * kv_elems * dtype_bytes,
        hidden_bytes=L * window * s.hidden_size * dtype_bytes,
        hcache_flops=2.0 * L * s.hidden_size * kv_elems * window,
    )


def recompute_seconds(s: ModelShape, cost: WindowCost, hw: Hardware, efficiency: float,
                      weight_bytes_per_param: float = 2.0) -> tuple[float, float]:
    """(compute time, memory time) of a standalone recompute: its FLOPs at `efficiency` x peak, and reading
    the weights a token uses plus the prefix's KV at the memory bandwidth. The larger bounds it; a recompute
    folded into a decode step that reads the weights anyway pays only the compute and the prefix read."""
    compute = cost.recompute_flops / (efficiency * hw.peak_flops)
    memory = (weight_bytes_per_param * param_counts(s)["active"] + cost.prefix_read_bytes) / hw.mem_bandwidth
    return compute, memory


@dataclass(frozen=True)
class Verdict:
    model: str
    hardware: str
    link: str
    window: int
    prefix: int
    load_s: float
    recompute_s: float
    crossover_bandwidth: float
    winner: str  # "recompute" or "load"


def break_even_table(models: list[str], hardware: list[str], window: int = 64, prefix: int = 32768,
                     efficiency: float = 0.5, dtype_bytes: float = 2.0) -> list[Verdict]:
    """For each model, accelerator and link: load the window's KV over the link, or recompute it on the
    accelerator (`recompute_seconds`, at `efficiency` x its peak: the article's own 50%)? Device memory is one of
    the links."""
    rows = []
    for name in models:
        shape = ModelShape.load(name)
        cost = window_cost(shape, window, prefix, dtype_bytes)
        for hw_name in hardware:
            hw = GPUS[hw_name]
            rate = efficiency * hw.peak_flops
            recompute = max(recompute_seconds(shape, cost, hw, efficiency, dtype_bytes))
            for link in [hbm_link(hw), *LINKS.values()]:
                load = cost.kv_bytes / link.bandwidth
                rows.append(Verdict(name, hw_name, link.name, window, prefix, load, recompute,
                                    cost.crossover_bandwidth(rate), "recompute" if recompute < load else "load"))
    return rows
