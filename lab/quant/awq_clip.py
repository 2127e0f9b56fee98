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
                max_shrink: float = 0.5, n_tokens: int = 512,
                row_chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor, AWQClipStats]:
    """Clip search for `w` [out, in] with inputs `x` [..., in].

    Returns (clipped weight [out, in] float32, not yet rounded; ratios [out, groups]; stats).
    Ratios tried: linspace(1, 1 - max_shrink, n_grid); each (row, group) keeps the ratio minimising
    mean over the subsampled tokens of (x_g (Q(clamp(w_g, -r m, r m)) - w_g)^T)^2, m = max|w_g|.
    """
    if not 0 <= max_shrink < 1 or n_grid < 1:
        raise ValueError(f"max_shrink={max_shrink} must be in [0, 1) and n_grid={n_grid} >= 1")
    w = w.detach().float()
    x = subsample_tokens(x, n_tokens).float()
    ratios_grid = torch.linspace(1.0, 1.0 - max_shrink, n_grid, device="cpu").tolist()
    width = spec.group_width(w.shape[1])
    clipped = w.clone()
    ratios = torch.ones(w.shape[0], spec.num_groups(w.shape[1]), device=w.device)
    before = after = 0.0
    for g, c0 in enumerate(range(0, w.shape[1], width)):
        xg = x[:, c0:c0 + width]
        for r0 in range(0, w.shape[0], row_chunk):
            wg = w[r0:r0 + row_chunk, c0:c0 + width]
            absmax = wg.abs().amax(dim=1, keepdim=True)
            best_err = torch.full((wg.shape[0],), math.inf, device=w.device)
            best_ratio = torch.ones(wg.shape[0], device=w.device)
            for i, ratio in enumerate(ratios_grid):
                wc = wg.clamp(-ratio * absmax, ratio * absmax)
                scale, zero = group_params(wc, spec)
                q = from_grid(to_grid(wc, scale[:, None], zero[:, None], spec), scale[:, None], zero[:, None])
                err = (xg @ (q - wg).t()).pow(2).mean(0)
                if i == 0:
                    before += float(err.sum())
                better = err < best_err
                best_err = torch.where(better, err, best_err)
                best_ratio = torch.where(better, ratio, best_ratio)
            after += float(best_err.sum())
            ratios[r0:r0 + row_chunk, g] = best_ratio
            m = best_ratio[:, None] * absmax
            clipped[r0:r0 + row_chunk, c0:c0 + width] = wg.clamp(-m, m)
    stats = AWQClipStats(mean_ratio=float(ratios.mean()), min_ratio=float(ratios.min()),
                         err_before=before, err_after=after)
    return clipped, ratios, stats
