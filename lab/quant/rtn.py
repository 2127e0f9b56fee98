"""Round-to-nearest (RTN) weight quantization on a uniform integer grid, per group of input columns.

The baseline every weight-only method is measured against (and the grid GPTQ rounds onto): each row
of a weight W [out, in] is cut into groups of `group_size` consecutive input columns, and each
(row, group) gets its own scale s and zero point z. A weight w is stored as the integer
q = clamp(round(w / s) + z, qmin, qmax) and read back as s * (q - z).

- asymmetric (unsigned grid 0 .. 2^b - 1): s = (max - min) / (2^b - 1), z = round(-min / s).
  The range is widened to include 0 (as in the GPTQ reference code) so that z itself lies on the
  grid and fits in b unsigned bits, and an exact 0 weight stays exactly 0.
- symmetric (signed grid -2^(b-1) .. 2^(b-1) - 1, z = 0): s = absmax / (2^(b-1) - 1); the most
  negative code is never produced by rounding, only reachable, which keeps the grid symmetric.

Ragged last group: when `group_size` does not divide the input dimension (SmolLM2's 576 with 128),
the last group simply holds the remaining columns (576 = 4 * 128 + 64: five groups, the last of 64
columns) and gets its own parameters from those columns alone. Nothing is padded, so the group of
column j is always j // group_size.

See Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers" (ICLR 2023), section 2, for RTN as the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 3, 4, 8)
SUPPORTED_GROUP_SIZES = (None, 32, 64, 128)
# A group whose weights are all equal (often all zero) has a zero range; its scale would divide by
# zero. Any small positive scale is right there: the group's values then map to z and back exactly.
MIN_SCALE = 1e-10


@dataclass(frozen=True)
class QuantSpec:
    """How weights are quantized: `bits` per weight, `group_size` input columns per scale (None: one
    scale per output channel, i.e. the whole row), and a symmetric (signed) or asymmetric grid."""

    bits: int = 4
    group_size: int | None = 128
    symmetric: bool = False

    def __post_init__(self):
        if isinstance(self.bits, bool) or self.bits not in SUPPORTED_BITS:
            raise ValueError(f"bits={self.bits!r} is not supported; choose one of {SUPPORTED_BITS}")
        if isinstance(self.group_size, bool) or self.group_size not in SUPPORTED_GROUP_SIZES:
            raise ValueError(f"group_size={self.group_size!r} is not supported; choose one of "
                             f"{SUPPORTED_GROUP_SIZES} (None: per output channel)")
        if not isinstance(self.symmetric, bool):
            raise ValueError(f"symmetric={self.symmetric!r} must be a bool")

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1)) if self.symmetric else 0

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.symmetric else 2 ** self.bits - 1

    def group_width(self, in_features: int) -> int:
        """Columns per group for a weight with `in_features` input columns (the last may be fewer)."""
        return in_features if self.group_size is None else self.group_size

    def num_groups(self, in_features: int) -> int:
        width = self.group_width(in_features)
        return -(-in_features // width)

    def group_index(self, in_features: int) -> torch.Tensor:
        """Group of each input column, [in_features] int64: j // group_size (ragged last group)."""
        return torch.arange(in_features) // self.group_width(in_features)


def _check_weight(w: torch.Tensor) -> None:
    if w.dim() != 2 or w.shape[1] == 0:
        raise ValueError(f"weight must be 2-D [out, in] with in >= 1; got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise ValueError(f"weight must be floating point; got dtype {w.dtype}")


def group_params(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point [out] for the columns of `w` [out, k] taken as ONE group per row."""
    if spec.symmetric:
        absmax = w.abs().amax(dim=1)
        scale = (absmax / spec.qmax).clamp_min(MIN_SCALE)
        return scale, torch.zeros_like(scale)
    lo, hi = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
    scale = ((hi - lo) / spec.qmax).clamp_min(MIN_SCALE)
    zero = torch.round(-lo / scale)
    return scale, zero


def to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Integer codes (as floats) of `w`; `scale` and `zero` broadcast against it."""
    return torch.clamp(torch.round(w / scale) + zero, spec.qmin, spec.qmax)


def from_grid(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return scale * (q - zero)


def quantize(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RTN-quantize `w` [out, in] -> (codes [out, in], scales [out, groups], zeros [out, groups]).

    Codes are int8 on a symmetric grid and uint8 on an asymmetric one (every supported width fits);
    scales are float32 and zeros int32 (all 0 when symmetric).
    """
    _check_weight(w)
    w = w.float()
    width = spec.group_width(w.shape[1])
    params = [group_params(w[:, g:g + width], spec) for g in range(0, w.shape[1], width)]
    scales = torch.stack([s for s, _ in params], dim=1)
    zeros = torch.stack([z for _, z in params], dim=1)
    g_idx = spec.group_index(w.shape[1])
    q = to_grid(w, scales[:, g_idx], zeros[:, g_idx], spec)
    return q.to(torch.int8 if spec.symmetric else torch.uint8), scales, zeros.to(torch.int32)


def dequantize(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               g_idx: torch.Tensor | None = None, group_size: int | None = None) -> torch.Tensor:
    """Float32 weights from codes [out, in] and per-group scales/zeros [out, groups].

    `g_idx` [in] gives each column's group (GPTQ with act_order produces one); without it the
    contiguous layout j // group_size is used (`group_size` None: a single group per row).
    """
    if q.dim() != 2 or scales.shape != zeros.shape or scales.shape[0] != q.shape[0]:
        raise ValueError(f"shapes do not match: codes {tuple(q.shape)}, scales {tuple(scales.shape)}, "
                         f"zeros {tuple(zeros.shape)}")
    if g_idx is None:
        width = q.shape[1] if group_size is None else group_size
        g_idx = torch.arange(q.shape[1], device=q.device) // width
    if g_idx.shape != (q.shape[1],) or int(g_idx.max()) >= scales.shape[1] or int(g_idx.min()) < 0:
        raise ValueError(f"g_idx must map each of the {q.shape[1]} columns to one of "
                         f"{scales.shape[1]} groups")
    g_idx = g_idx.to(q.device)
    return from_grid(q.float(), scales[:, g_idx].float(), zeros[:, g_idx].float())


def fake_quantize(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """`w` rounded to its RTN grid and read back, float32, same shape: the error RTN introduces.

    Computed group by group without materializing codes, so it also cross-checks `quantize`.
    """
    _check_weight(w)
    w = w.float()
    out = torch.empty_like(w)
    width = spec.group_width(w.shape[1])
    for g in range(0, w.shape[1], width):
        block = w[:, g:g + width]
        scale, zero = group_params(block, spec)
        scale, zero = scale[:, None], zero[:, None]
        out[:, g:g + width] = from_grid(to_grid(block, scale, zero, spec), scale, zero)
    return out
