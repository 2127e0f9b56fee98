"""One tensor-parallel rank's decode step measured on one device, and the TP step projected from it (notebook 08).

One GPU cannot run TP=2 (NCCL needs a device for each rank), but what a rank computes between its collectives
needs only one device. `rank_decode` builds rank 0's share of PROJECT_MODEL at PROJECT_TP
(`lab.parallel.sharding.rank_shapes`: its query and KV heads, its slice of the MLP features and of the
vocabulary) as random tensors on DEVICE in the run's dtype, RANK_LAYERS of its layers, and times what a decode
step computes on it: per layer the column-parallel q/k/v and gate/up matmuls, the rank's query heads attending
over its KV heads at CONTEXT tokens, the row-parallel o and down matmuls; then the LM head's vocabulary slice.
The layers' time is scaled to all of them. Left out: norms, rotary embedding, the new token's KV write and
sampling (element-wise work, small beside the matmuls at these shapes).

`rank_projection` adds the collectives by the alpha-beta model (`lab.parallel.comm_model.LINKS`) to that measured
compute: the TP step projected from measured per-device compute, beside the roofline's compute on the device's
measured ceilings (`lab.machine.hardware.probe_inference`, the same dtype) and on HARDWARE's datasheet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F

from lab.machine.hardware import GPUS, Hardware
from lab.memory import ModelShape
from lab.parallel.comm_model import LINKS, tp_comm_seconds, tp_decode_step
from lab.parallel.sharding import rank_shapes
from lab.machine.timing import median_seconds

if TYPE_CHECKING:
    from lab.studies.parallelism.measure import ParallelParams


def _layer(rank: ModelShape, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One decoder layer of the rank's shard, q/k/v and gate/up fused as the lab's model holds them."""
    h, d = rank.hidden_size, rank.head_dim
    shapes = {"qkv": ((rank.num_heads + 2 * rank.num_kv_heads) * d, h), "o": (h, rank.num_heads * d),
              "gate_up": (2 * rank.intermediate_size, h), "down": (h, rank.intermediate_size)}
    return {k: torch.randn(s, device=device, dtype=dtype) * 0.02 for k, s in shapes.items()}


def _layers_forward(layers: list[dict], kv: list[tuple], x: torch.Tensor, rank: ModelShape) -> torch.Tensor:
    b, d, nq, nkv = x.shape[0], rank.head_dim, rank.num_heads, rank.num_kv_heads
    for w, (k, v) in zip(layers, kv):
        q = F.linear(x, w["qkv"])[:, :nq * d].reshape(b, nkv, nq // nkv, d)  # a KV group's heads, as its queries
        attn = F.scaled_dot_product_attention(q, k, v)  # k, v: [batch, KV heads, context, head_dim]
        x = x + F.linear(attn.reshape(b, nq * d), w["o"])
        gate, up = F.linear(x, w["gate_up"]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["down"])
    return x


def rank_decode(p: ParallelParams, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """Per batch of PROJECT_BATCHES: the median over STEPS of RANK_LAYERS layers of rank 0's decode step and of
    its LM head slice, on `device` in `dtype`, and the step scaled to all the rank's layers."""
    rank = rank_shapes(ModelShape.preset(p.PROJECT_MODEL), p.PROJECT_TP)[0]  # rank 0 holds the larger share
    with torch.no_grad():
        layers = [_layer(rank, device, dtype) for _ in range(p.RANK_LAYERS)]
        head = torch.randn(rank.vocab_size, rank.hidden_size, device=device, dtype=dtype) * 0.02
        rows = []
        for batch in p.PROJECT_BATCHES:
            kv = [tuple(torch.randn(batch, rank.num_kv_heads, p.CONTEXT, rank.head_dim, device=device, dtype=dtype)
                        for _ in range(2)) for _ in range(p.RANK_LAYERS)]
            x = torch.randn(batch, rank.hidden_size, device=device, dtype=dtype)
            layers_s = median_seconds(lambda: _layers_forward(layers, kv, x, rank), p.STEPS)
            head_s = median_seconds(lambda: F.linear(x, head), p.STEPS)
            rows.append({"batch": batch, "layers timed": p.RANK_LAYERS, "layers ms (timed)": 1e3 * layers_s,
                         "LM head ms": 1e3 * head_s,
                         "rank step ms (measured)": 1e3 * (layers_s * rank.num_layers / p.RANK_LAYERS + head_s)})
            del kv
    return pd.DataFrame(rows).assign(device=str(device), dtype=str(dtype).removeprefix("torch."), rank=rank.name)


def rank_projection(p: ParallelParams, measured: pd.DataFrame, here: Hardware) -> pd.DataFrame:
    """Per link and batch: PROJECT_MODEL's TP step from the measured rank compute plus the alpha-beta collectives,
    its communication share, and the roofline's compute for the same rank on the measured ceilings (`here`) and on
    HARDWARE's datasheet, so the measured step can be read against both bounds."""
    shape, datasheet = ModelShape.preset(p.PROJECT_MODEL), GPUS[p.HARDWARE]
    rows = []
    for key, link in LINKS.items():
        for batch, ms in zip(measured["batch"], measured["rank step ms (measured)"]):
            compute, batch = ms / 1e3, int(batch)
            comm = tp_comm_seconds(shape, p.PROJECT_TP, batch, link)[0]
            rows.append({"link": key, "batch": batch, "compute ms (measured)": ms,
                         "compute ms (roofline, measured ceilings)":
                             1e3 * tp_decode_step(shape, here, p.PROJECT_TP, batch, p.CONTEXT, link).compute_s,
                         "compute ms (roofline, datasheet)":
                             1e3 * tp_decode_step(shape, datasheet, p.PROJECT_TP, batch, p.CONTEXT, link).compute_s,
                         "comm ms (alpha-beta)": 1e3 * comm, "step ms (projected)": 1e3 * (compute + comm),
                         "comm share": comm / (compute + comm)})
    return pd.DataFrame(rows).assign(device=here.name, datasheet=datasheet.name)
