"""From a 4-bit model's own grid to fewer levels, one difference at a time (issue 39's loss decomposition).

The embedded SmolLM2 is a Q4_1 GGUF dequantized (`lab.quant.gguf_grids`): every block of 32 input columns holds
w = d q + m, q in 0..15, with a float16 scale d and minimum m. Re-quantizing it with the lab's RTN at w4g32 costs
8% of the weight norm although the model *is* 4-bit at g32, because RTN's grid differs from Q4_1's in three ways,
and a quantizer with fewer bits adds a fourth. The ladder adds them one at a time, each rung one change from the
one before (all asymmetric, per group of consecutive input columns, round to nearest):

0. `q4_1`: GGUF's Q4_1 as llama.cpp writes it (the model's own grid: exact on this model);
1. `float-offset w4g32`: min-max with a float32 scale s = (max - min) / 15 and offset m = min, w = s q + m;
2. `int-zero w4g32`: the same scale, an *integer* zero point z = round(-min / s), w = s (q - z): the grid is
   shifted by up to s/2 from the block's minimum, and the extremes are clamped;
3. `rtn w4g32`: the range widened to include 0 before the scale is taken (`lab.quant.rtn`, as GPTQ's code does),
   which stretches s whenever a block is all of one sign;
4. `rtn w4g64`, `rtn w4g128`: groups spanning 2 and 4 of the model's blocks, one scale for blocks of different
   ranges;
5. `rtn w3g128`, `rtn w2g128`: 8 and 4 levels instead of 16, at the widest group.

Rungs 0-4 change the grid and keep 4 bits; on an already-4-bit model their cost is a grid mismatch, which a
16-bit model does not have. Rungs 5 are fewer levels. `layer_errors` gives each decoder layer's squared weight
error and squared weight norm, from which a study pools the relative error with an interval over layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from .gguf_grids import fake_quantize_gguf
from .layerwise import LINEAR_STEPS, check_linears
from .rtn import MIN_SCALE, QuantSpec, fake_quantize, from_grid, to_grid


@dataclass(frozen=True)
class Rung:
    """One quantizer of the ladder: its label, what it changes from the rung before, and the fake quantizer."""
    name: str
    change: str
    bits: int
    group: int
    quantize: Callable[[torch.Tensor], torch.Tensor]


def minmax_fake_quantize(w: torch.Tensor, bits: int, group: int, zero: str) -> torch.Tensor:
    """`w` [out, in] on an asymmetric min-max grid per group of `group` columns, float32: `zero` = "float" (offset
    m = min, w = s q + m) or "integer" (z = round(-min / s), w = s (q - z), the range not widened to include 0)."""
    if zero not in ("float", "integer"):
        raise ValueError(f"zero={zero!r}: choose 'float' or 'integer'")
    spec = QuantSpec(bits, group)
    w = w.detach().float()
    out = torch.empty_like(w)
    for g in range(0, w.shape[1], group):
        x = w[:, g:g + group]
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        s = ((hi - lo) / spec.qmax).clamp_min(MIN_SCALE)
        if zero == "float":
            out[:, g:g + group] = s * torch.clamp(torch.round((x - lo) / s), 0, spec.qmax) + lo
        else:
            z = torch.round(-lo / s)
            out[:, g:g + group] = from_grid(to_grid(x, s, z, spec), s, z)
    return out


def ladder(groups: tuple[int, ...] = (64, 128), bits: tuple[int, ...] = (3, 2)) -> list[Rung]:
    """The rungs in order: the four at 4 bits and g32, then RTN at 4 bits with each of `groups`, then RTN with
    each of `bits` at the last group (g32 when `groups` is empty)."""
    rungs = [Rung("q4_1", "GGUF Q4_1: fp16 scale and minimum per 32 columns (the model's own grid)", 4, 32,
                  lambda w: fake_quantize_gguf(w, "q4_1")),
             Rung("float-offset w4g32", "float32 scale and minimum, round to nearest", 4, 32,
                  lambda w: minmax_fake_quantize(w, 4, 32, "float")),
             Rung("int-zero w4g32", "integer zero point", 4, 32, lambda w: minmax_fake_quantize(w, 4, 32, "integer")),
             Rung("rtn w4g32", "range widened to include 0 (= RTN)", 4, 32, _rtn(4, 32))]
    for g in groups:
        rungs.append(Rung(f"rtn w4g{g}", f"groups of {g} columns", 4, g, _rtn(4, g)))
    last = groups[-1] if groups else 32
    for b in bits:
        rungs.append(Rung(f"rtn w{b}g{last}", f"{b} bits", b, last, _rtn(b, last)))
    return rungs


def _rtn(bits: int, group: int) -> Callable[[torch.Tensor], torch.Tensor]:
    spec = QuantSpec(bits, group)  # checked here, when the ladder is built
    return lambda w: fake_quantize(w, spec)


def _linears(model: nn.Module, layers: tuple[int, ...] | None) -> list[tuple[int, nn.Linear]]:
    check_linears(model)
    return [(i, layer.get_submodule(name)) for i, layer in enumerate(model.layers)
            if layers is None or i in layers for name in LINEAR_STEPS]


@torch.no_grad()
def apply_rung(model: nn.Module, rung: Rung, layers: tuple[int, ...] | None = None,
               source: nn.Module | None = None) -> bool:
    """Write `rung`'s fake quantization of the decoder linears of `layers` (None: all) into `model`, from `source`'s
    weights (a model of the same shape, e.g. the unquantized one the copy was made from; None: `model`'s own), so
    one working copy serves every rung. Returns whether any weight changed (a rung that lands on the weights the
    model already holds, e.g. RTN's widening where every group straddles 0, changes none)."""
    changed = False
    pairs = zip(_linears(model, layers), _linears(source if source is not None else model, layers))
    for (_, lin), (_, src) in pairs:
        new = rung.quantize(src.weight).to(lin.weight.dtype)
        changed = changed or not torch.equal(new, lin.weight)
        lin.weight.data.copy_(new)
    return changed


def same_except_linears(reference: nn.Module, model: nn.Module) -> bool:
    """Whether every parameter but the decoder linears' weights is unchanged: False after AWQ, which folds its
    scales into the norms (its linears then hold W diag(s), not W rounded)."""
    linears = {id(m.weight) for m in reference.layers.modules() if isinstance(m, nn.Linear)}
    return all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()) if id(a) not in linears)


@torch.no_grad()
def quantizer_errors(model: nn.Module, quantize: Callable[[torch.Tensor], torch.Tensor],
                     layers: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(squared weight error, squared weight norm) of fake quantizer `quantize` summed over each decoder layer's
    linears, one entry per layer of `layers` (None: all), without changing `model`."""
    err: dict[int, float] = {}
    norm: dict[int, float] = {}
    for i, lin in _linears(model, layers):
        w = lin.weight.float()
        err[i] = err.get(i, 0.0) + float((quantize(w) - w).pow(2).sum())
        norm[i] = norm.get(i, 0.0) + float(w.pow(2).sum())
    return np.array(list(err.values())), np.array(list(norm.values()))


@torch.no_grad()
def layer_errors(reference: nn.Module, model: nn.Module,
                 layers: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(squared weight error, squared weight norm) summed over each decoder layer's linears, one entry per layer of
    `layers` (None: all); None when the models differ elsewhere too (`same_except_linears`)."""
    if not same_except_linears(reference, model):
        return None
    err: dict[int, float] = {}
    norm: dict[int, float] = {}
    for (i, a), (_, b) in zip(_linears(reference, layers), _linears(model, layers)):
        w = a.weight.float()
        err[i] = err.get(i, 0.0) + float((b.weight.float() - w).pow(2).sum())
        norm[i] = norm.get(i, 0.0) + float(w.pow(2).sum())
    return np.array(list(err.values())), np.array(list(norm.values()))
