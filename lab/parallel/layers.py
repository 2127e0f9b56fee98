"""The three layers of a tensor-parallel shard that communicate (Shoeybi et al., 2019, arXiv:1909.08053, §3).

- `RowParallelLinear`: y = sum over ranks of x_r W_r^T, where rank r holds the input features (columns of W) of
  its heads or intermediate features and x_r its slice of the input; one all-reduce of the [T, hidden] output.
  The column-parallel matrices before it (qkv_proj, gate_up_proj) need no layer of their own: each rank's slice
  of rows is an ordinary `nn.Linear`, since its input x is replicated.
- `VocabParallelEmbedding`: rank r holds rows [v0, v0 + V_r) of the table; an id outside them gives zeros, so the
  all-reduce sums exactly one real row per token.
- `GatheredLMHead`: each rank multiplies by its vocabulary rows; rank 0 gathers the slices into [rows, vocab]
  (padded to the largest slice, since a gather moves equal shapes). Only rank 0 samples, so nothing is
  broadcast back; the other ranks return their own slice.

`comm` is a `lab.parallel.collectives.Collectives`, which times every call on rank 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RowParallelLinear(nn.Module):
    """The rank's `linear` (its input columns, no bias), then the all-reduce. The linear stays an `nn.Linear`
    child, so what rewrites a model's linears (`lab.models.prepack`) reaches it as it reaches the others."""

    def __init__(self, linear: nn.Linear, comm):
        super().__init__()
        self.linear, self.comm = linear, comm

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.linear(x))


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: nn.Parameter, start: int, comm):
        super().__init__()
        self.weight, self.start, self.comm = weight, start, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.comm.all_reduce(x.masked_fill_(outside[:, None], 0))


class GatheredLMHead(nn.Module):
    def __init__(self, weight: nn.Parameter, vocab_size: int, comm):
        super().__init__()
        self.weight, self.vocab_size, self.comm = weight, vocab_size, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.gather_columns(F.linear(x, self.weight), self.vocab_size)
