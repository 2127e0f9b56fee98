"""Cheaper estimates of AWQ's scale-search loss, to screen the grid before the exact search confirms it.

The exact loss (`lab.quant.awq.search_scales`) runs the inspected block in float32 for every grid point:
for SmolLM2 on 32 x 512 calibration tokens, ~20 products of [16384, in] x [in, out] per scaling group,
which is where AWQ's time went (issue 18). A screen estimates the same loss within a relative error; the
search then evaluates exactly the screen's best point and every point the screen cannot tell from it
(`confirm`), so it picks the point the exact search picks, with its exact loss, whenever every estimate
keeps within the margin. The margin adapts: it is the screen's `rtol` or SAFETY times the largest error
seen at the points evaluated exactly, whichever is larger.

- `LinearScreen`, for a group whose inspected block is its own linear (up -> down_proj; v -> o_proj):
  with D = W' - W, the loss mean((x W'^T - x W^T)^2) is sum((D G) * D) / (tokens * outputs), G = x^T x
  computed once, so each grid point costs an [out, in] x [in, in] product instead of [tokens, in] x
  [in, out]. Float32; within ~5e-7 of the exact loss on SmolLM2 with 8 x 128 or more tokens.
- `MLPScreen`, for norm -> gate_up_proj (the MLP inspected): gate_up's output is its float output plus
  x D^T, the change computed by a bfloat16 product (AVX512-BF16: ~2x float32 here); the activation runs
  in float32 on the sum, and the change of its output goes through down_proj in bfloat16. Working on the
  changes keeps bfloat16's rounding relative to the quantization error, not to the outputs. Measured on
  SmolLM2: ~1e-4 with 32 x 512 tokens, mostly from rounding D; up to 1e-2 with 8 x 128 tokens in the
  layers whose MLP outputs a few tokens dominate.

- `AttentionScreen`, for input_layernorm -> qkv_proj (the attention block inspected): the same on qkv's
  change and the context's change through o_proj; RoPE and attention run in float32 on the sum, so it
  saves only the products' share (~30%). Measured ~1e-3..2e-3, mostly from rounding D.

Measured on one SmolLM2 layer with 32 x 512 tokens and one thread, a screen's grid point costs against the
exact one: attention 0.55 s vs 0.79 s, MLP 0.55 s vs 1.45 s, single linear 0.06 s vs 0.69 s.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

SAFETY = 4  # errors at the evaluated points are samples; others measured up to ~4x larger


class LossScreen(Protocol):
    """Estimates the loss for the group's weights replaced by `weights`, within `rtol` (relative)."""

    rtol: float

    def __call__(self, weights: list[torch.Tensor]) -> float: ...


def confirm(estimates: list[float], exact: Callable[[int], float], rtol: float) -> dict[int, float]:
    """Exact losses of every grid point that may be the exact best, given the screen's `estimates`.

    The best estimate is evaluated first; then, while some unevaluated point is estimated within r of the
    best exact loss so far (estimate <= best * (1 + r)), those points are evaluated too. r is the larger
    of the screen's `rtol` and SAFETY times the largest relative error seen at the evaluated points, so a
    screen less accurate than its `rtol` on some data (few calibration tokens dominated by a handful of
    outliers: up to 1e-2 on SmolLM2 with 8 x 128 tokens) widens its own margin rather than deciding."""
    order = sorted(range(len(estimates)), key=lambda k: math.inf if math.isnan(estimates[k]) else estimates[k])
    checked: dict[int, float] = {}
    todo = order[:1]
    while todo:
        checked.update((k, exact(k)) for k in todo)
        seen = [abs(estimates[k] - v) / v if v > 0 else (0.0 if estimates[k] == v else math.inf)
                for k, v in checked.items() if math.isfinite(v)]
        r = max([rtol] + [SAFETY * e for e in seen])
        best = min([v for v in checked.values() if not math.isnan(v)], default=math.inf)
        todo = [k for k in order if k not in checked and not estimates[k] > best * (1 + r)]
    return checked


class LinearScreen:
    """Loss of y = x W^T through the Gram matrix of the inputs `x` [..., in]; `w` is the float weight."""

    rtol = 1e-5

    def __init__(self, x: torch.Tensor, w: torch.Tensor):
        x = x.reshape(-1, x.shape[-1]).float()
        self.gram = x.t() @ x
        self.w = w.detach().float()
        self.count = x.shape[0] * self.w.shape[0]

    def __call__(self, weights: list[torch.Tensor]) -> float:
        d = weights[0] - self.w
        return float(torch.mm(d, self.gram).mul_(d).sum()) / self.count


@contextlib.contextmanager
def projections_removed(module: nn.Module, names: list[str]):
    """`module` with the named linears replaced by identities: its own code between them, e.g. the MLP's
    activation or the attention's RoPE and softmax, run on given projections."""
    saved = {n: getattr(module, n) for n in names}
    try:
        for n in names:
            setattr(module, n, nn.Identity())
        yield module
    finally:
        for n, m in saved.items():
            setattr(module, n, m)


class ChangeScreen:
    """A block first -> inner -> second (linears first and second), the first's weight W becoming W':
    first's output changes by x D^T (bfloat16 product), `inner` runs in float32 on the sum, and the change
    of its output goes through `second_weight` in bfloat16. The buffers are kept between grid points:
    fresh ones of this size cost page faults each time, a tenth of the time here."""

    def __init__(self, w: torch.Tensor, x: torch.Tensor, first_out: torch.Tensor, second_weight: torch.Tensor):
        self.w, self.x = w.detach().float(), x.bfloat16()
        self.first_out = first_out
        self.inner_out = self.inner(first_out)
        self.second_t = second_weight.detach().t().bfloat16().contiguous()
        n = self.x.shape[0]
        self.change = torch.empty(n, self.w.shape[0], dtype=torch.bfloat16, device=self.x.device)
        self.sum = torch.empty(n, self.w.shape[0], device=self.x.device)
        self.inner_change = torch.empty(n, self.second_t.shape[0], dtype=torch.bfloat16, device=self.x.device)
        self.out_change = torch.empty(n, self.second_t.shape[1], dtype=torch.bfloat16, device=self.x.device)

    def inner(self, first_out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, weights: list[torch.Tensor]) -> float:
        d_t = (weights[0] - self.w).t().bfloat16().contiguous()
        torch.mm(self.x, d_t, out=self.change)
        # Mixed-dtype elementwise ops take a slow path (~5x): convert, then add or subtract in float32.
        self.sum.copy_(self.change).add_(self.first_out)
        self.inner_change.copy_(self.inner(self.sum).sub_(self.inner_out))
        torch.mm(self.inner_change, self.second_t, out=self.out_change)
        sq = torch.linalg.vector_norm(self.out_change, dtype=torch.float32).square()
        return float(sq) / self.out_change.numel()


class MLPScreen(ChangeScreen):
    """The MLP `mlp` fed `x` [tokens, in], gate_up_proj's weight changing."""

    rtol = 2e-3

    def __init__(self, mlp: nn.Module, x: torch.Tensor):
        self.mlp = mlp
        # Through the module, as the exact loss computes it: `reference` is then its reference bit for bit.
        super().__init__(mlp.gate_up_proj.weight, x, mlp.gate_up_proj(x), mlp.down_proj.weight)

    def inner(self, gate_up: torch.Tensor) -> torch.Tensor:
        with projections_removed(self.mlp, ["gate_up_proj", "down_proj"]) as core:
            return core(gate_up)

    def reference(self) -> torch.Tensor:
        """The float MLP's output on `x`."""
        return self.mlp.down_proj(self.inner_out)


class AttentionScreen(ChangeScreen):
    """The attention block `attn`, qkv_proj's weight changing; RoPE and attention are the inner part.
    `x` [tokens, in] are qkv_proj's inputs, groups of `sizes` tokens (`CalibrationPass`'s sequence groups),
    which `attend` runs the block on."""

    rtol = 5e-3

    def __init__(self, attn: nn.Module, attend: Callable[[list[torch.Tensor]], torch.Tensor], x: torch.Tensor,
                 sizes: list[int]):
        self.attn, self.attend, self.sizes = attn, attend, sizes
        super().__init__(attn.qkv_proj.weight, x, attn.qkv_proj(x), attn.o_proj.weight)

    def inner(self, qkv: torch.Tensor) -> torch.Tensor:
        with projections_removed(self.attn, ["qkv_proj", "o_proj"]):
            return self.attend(list(qkv.split(self.sizes)))
