"""AWQ's weight clipping: after scaling, before rounding, each group's weights are clamped where that lowers
the group's share of the output error.

Lin et al., "AWQ: Activation-aware Weight Quantization for On-Device LLM Compression and Acceleration",
MLSys 2024, as applied by `lab.quant.awq` (after the behaviour of the AutoAWQ reference; no code copied).
For every (row, quantization group), the weights are clamped to +-ratio * max|w| with ratio on a grid from
1.0 down to 1 - max_shrink; the ratio minimising mean over tokens of (x_g (Q(clamp(w_g)) - w_g)^T)^2 (the
group's share of the output error) on a subsample of the inputs is applied. Ratio 1.0 is plain rounding, so
that per-group error never rises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .rtn import QuantSpec, from_grid, group_params, to_grid


@dataclass
class AWQClipStats:
    """One linear's clipping: mean and min chosen ratio over (row, group), and the clip objective
    (sum over rows and groups of the mean squared per-group output error) before and after."""

    mean_ratio: float
    min_ratio: float
    err_before: float
    err_after: float


def subsample_tokens(x: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """At most `n_tokens` rows of `x` [..., in] flattened, evenly strided over the calibration set."""
    x = x.reshape(-1, x.shape[-1])
    if x.shape[0] <= n_tokens:
        return x
    return x[torch.linspace(0, x.shape[0] - 1, n_tokens, device=x.device).round().long()]


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, spec: QuantSpec, n_grid: int = 20,
                max_shrink: float = 0.5, n_tokens: int = 512) -> tuple[torch.Tensor, torch.Tensor, AWQClipStats]:
    """Clip search for `w` [out, in] with inputs `x` [..., in].

    Returns (clipped weight [out, in] float32, not yet rounded; ratios [out, groups]; stats).
    Ratios tried: linspace(1, 1 - max_shrink, n_grid); each (row, group) keeps the ratio minimising
    mean over the subsampled tokens of (x_g (Q(clamp(w_g, -r m, r m)) - w_g)^T)^2, m = max|w_g|.

    That mean is d H_g d^T with d = Q(clamp(w_g)) - w_g and H_g = x_g^T x_g / tokens, the group's input Gram
    matrix: width^2 multiply-adds per (row, group, ratio) instead of tokens x width, so it is taken that way
    whenever a group is narrower than the token count (w4g64 on 512 tokens: 8x fewer). Every group is searched
    at once: a ragged last group is padded with zero columns, which leave its scale, zero point, absmax and error
    unchanged (the grid always holds 0, and a zero column of x adds nothing).
    """
    if not 0 <= max_shrink < 1 or n_grid < 1:
        raise ValueError(f"max_shrink={max_shrink} must be in [0, 1) and n_grid={n_grid} >= 1")
    w = w.detach().float()
    x = subsample_tokens(x, n_tokens).float()
    out, cols = w.shape
    width, groups = spec.group_width(cols), spec.num_groups(cols)
    pad = groups * width - cols
    wg = torch.nn.functional.pad(w, (0, pad)).reshape(out, groups, width)  # [out, groups, width]
    xg = torch.nn.functional.pad(x, (0, pad)).reshape(-1, groups, width).transpose(0, 1)  # [groups, tokens, width]
    gram = xg.transpose(1, 2) @ xg / xg.shape[1] if width < xg.shape[1] else None  # [groups, width, width]
    absmax = wg.abs().amax(dim=2, keepdim=True)
    best_err = torch.full((out, groups), math.inf, device=w.device)
    ratios = torch.ones(out, groups, device=w.device)
    before = 0.0
    for i, ratio in enumerate(torch.linspace(1.0, 1.0 - max_shrink, n_grid, device="cpu").tolist()):
        wc = wg.clamp(-ratio * absmax, ratio * absmax).reshape(out * groups, width)
        scale, zero = group_params(wc, spec)
        q = from_grid(to_grid(wc, scale[:, None], zero[:, None], spec), scale[:, None], zero[:, None])
        d = (q.reshape(out, groups, width) - wg).transpose(0, 1)  # [groups, out, width]
        err = ((d @ gram) * d).sum(2) if gram is not None else (xg @ d.transpose(1, 2)).pow(2).mean(1)
        err = err.t()  # [out, groups]
        if i == 0:
            before = float(err.sum())
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        ratios = torch.where(better, ratio, ratios)
    m = ratios[:, :, None] * absmax
    clipped = wg.clamp(-m, m).reshape(out, groups * width)[:, :cols]
    stats = AWQClipStats(mean_ratio=float(ratios.mean()), min_ratio=float(ratios.min()),
                         err_before=before, err_after=float(best_err.sum()))
    return clipped, ratios, stats
