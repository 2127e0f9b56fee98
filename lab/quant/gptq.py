"""GPTQ: weight quantization that feeds each column's rounding error back into the columns not yet
quantized, weighted by the inverse Hessian of the layer's squared output error.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023 (Algorithm 1), following the IST-DASLab reference code.

For a linear layer with calibration inputs X (n rows), minimizing ||X W^T - X Q^T||^2 over the
quantized Q row by row has Hessian H = 2/n X^T X, shared by all rows. Columns are quantized in
order; after column i is rounded, the remaining columns absorb its error through row i of the upper
Cholesky factor U of H^-1 (U replaces the repeated OBS downdates of H^-1, and is numerically stable).
Updates are applied lazily: inside a block of 128 columns eagerly, to the columns after the block in
one matrix product when the block is done.

Details kept from the reference:
- dampening percdamp * mean(diag H) is added to the diagonal; here, when a Cholesky still fails, it
  is raised tenfold and retried, and the dampening that worked is reported;
- dead inputs (diag H == 0: the input column is always 0) get H_ii = 1 and their weights set to 0;
- act_order quantizes columns by descending diag(H) (most salient first); `g_idx` then records the
  group of every column in the original order, since groups are formed in the permuted order;
- static_groups computes all group parameters up front on the unpermuted weight, so groups stay
  contiguous (g_idx = j // group_size) even with act_order;
- otherwise a group's scale and zero are computed when the column loop enters the group. Unlike the
  reference, they are computed from the weights as already updated by the error feedback inside the
  current block (the reference reads the block's columns before those updates); at block-aligned
  group starts the two are the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from .layerwise import LINEAR_STEPS, CalibrationPass
from .rtn import QuantSpec, from_grid, group_params, to_grid

# Raising the dampening tenfold this many times covers 1% of mean(diag H) up to 100x mean(diag H),
# by which point H + damp*I is diagonal-dominated; failing beyond that means H itself is broken.
MAX_DAMP_TRIES = 5
# When the caller asked for no dampening and the Cholesky fails, start retrying from this fraction.
FIRST_RETRY_DAMP = 1e-4


class HessianAccumulator:
    """Running H = 2/n sum x x^T over the calibration inputs of one linear layer.

    Each batch's x^T x is computed in the inputs' own precision (a float32 GEMM for float32 inputs,
    several times faster than float64 on a CPU, and a batch is at most a few thousand rows) and the
    running sum is kept in float64, since a sum of many batches loses the small eigenvalues that
    the inverse depends on."""

    def __init__(self, in_features: int, device: torch.device | str = "cpu"):
        if in_features < 1:
            raise ValueError(f"in_features={in_features} must be >= 1")
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.n = 0

    @property
    def H(self) -> torch.Tensor:
        return self.sum * (2.0 / self.n) if self.n else self.sum.clone()

    def add_batch(self, x: torch.Tensor) -> None:
        """Add inputs `x` [..., in_features] (every leading index is one sample)."""
        if x.shape[-1] != self.sum.shape[0]:
            raise ValueError(f"input has {x.shape[-1]} features; the accumulator expects {self.sum.shape[0]}")
        x = x.reshape(-1, x.shape[-1])
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        self.sum += (x.t() @ x).to(device=self.sum.device, dtype=torch.float64)
        self.n += x.shape[0]


@dataclass(frozen=True)
class GPTQConfig:
    """percdamp: dampening as a fraction of mean(diag H); blocksize: columns per lazy batch update."""

    percdamp: float = 0.01
    blocksize: int = 128
    act_order: bool = False
    static_groups: bool = False

    def __post_init__(self):
        if not 0 <= self.percdamp <= 1:
            raise ValueError(f"percdamp={self.percdamp!r} must be in [0, 1]")
        if isinstance(self.blocksize, bool) or not isinstance(self.blocksize, int) or self.blocksize < 1:
            raise ValueError(f"blocksize={self.blocksize!r} must be an int >= 1")


@dataclass
class GPTQStats:
    """damp: dampening finally added to diag H (absolute); damp_tries: Cholesky attempts it took;
    seconds: wall time; error: sum over columns of (w - q)^2 / (2 U_ii^2), GPTQ's own estimate of
    ||X W^T - X Q^T||^2 / n on the calibration inputs (exact without dampening; with it, the
    estimate includes the damp term and so runs high)."""

    damp: float
    damp_tries: int
    seconds: float
    error: float


@dataclass
class GPTQResult:
    """weight: fake-quantized [out, in] float32; scales/zeros [out, groups]; g_idx [in] group of
    each input column in the original column order."""

    weight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    stats: GPTQStats


def inverse_hessian_factor(H: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, float, int]:
    """Upper Cholesky factor of (H + damp I)^-1, raising damp tenfold until both factorizations work."""
    mean_diag = float(torch.diagonal(H).mean())
    damp = percdamp * mean_diag
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    for tries in range(1, MAX_DAMP_TRIES + 2):
        L, info = torch.linalg.cholesky_ex(H + damp * eye)
        if info == 0:
            U, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(L), upper=True)
            if info == 0 and torch.isfinite(U).all():
                return U, damp, tries
        damp = damp * 10 if damp > 0 else FIRST_RETRY_DAMP * mean_diag
    raise ValueError(f"Hessian not positive definite even with dampening {damp / 10:.3g} "
                     f"({MAX_DAMP_TRIES} retries from percdamp={percdamp}); is it finite and symmetric?")


def gptq_quantize(weight: torch.Tensor, H: torch.Tensor, spec: QuantSpec,
                  config: GPTQConfig = GPTQConfig()) -> GPTQResult:
    """GPTQ-quantize `weight` [out, in] given the Hessian `H` [in, in] of its calibration inputs."""
    start = time.perf_counter()
    if weight.dim() != 2 or H.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(f"weight {tuple(weight.shape)} and Hessian {tuple(H.shape)} do not match: "
                         f"H must be [in, in] for weight [out, in]")
    W = weight.detach().float().clone()
    H = H.detach().to(device=W.device, dtype=torch.float32, copy=True)  # GPTQ runs where the weight lives
    rows, cols = W.shape
    width = spec.group_width(cols)

    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    static = None
    if config.static_groups:
        static = [group_params(W[:, g:g + width], spec) for g in range(0, cols, width)]

    perm = torch.argsort(torch.diagonal(H), descending=True) if config.act_order else None
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]

    U, damp, tries = inverse_hessian_factor(H, config.percdamp)
    del H

    Q = torch.zeros_like(W)
    losses = torch.zeros_like(W)
    group_scales, group_zeros = [], []
    scale = zero = None
    for b1 in range(0, cols, config.blocksize):
        b2 = min(b1 + config.blocksize, cols)
        W1, U1 = W[:, b1:b2].clone(), U[b1:b2, b1:b2]
        err = torch.zeros_like(W1)
        for i in range(b2 - b1):
            col = b1 + i
            if static is not None:
                scale, zero = static[(int(perm[col]) if perm is not None else col) // width]
            elif col % width == 0:
                # The group's columns as they stand now: the rest of this block (already updated by
                # the feedback above) followed by columns past the block.
                end = min(col + width, cols)
                members = torch.cat([W1[:, i:], W[:, b2:]], dim=1)[:, :end - col]
                scale, zero = group_params(members, spec)
                group_scales.append(scale)
                group_zeros.append(zero)
            w, d = W1[:, i], U1[i, i]
            q = from_grid(to_grid(w, scale, zero, spec), scale, zero)
            Q[:, col] = q
            losses[:, col] = (w - q) ** 2 / (2 * d ** 2)
            e = (w - q) / d
            W1[:, i:] -= e[:, None] * U1[i, i:][None, :]
            err[:, i] = e
        W[:, b2:] -= err @ U[b1:b2, b2:]

    if static is not None:
        scales = torch.stack([s for s, _ in static], dim=1)
        zeros = torch.stack([z for _, z in static], dim=1)
        g_idx = torch.arange(cols, device=W.device) // width
    else:
        scales, zeros = torch.stack(group_scales, dim=1), torch.stack(group_zeros, dim=1)
        g_idx = torch.arange(cols, device=W.device) // width  # group of each position in quantization order
    if perm is not None:
        inv = torch.argsort(perm)
        Q = Q[:, inv]
        if static is None:
            g_idx = g_idx[inv]
    stats = GPTQStats(damp=damp, damp_tries=tries, seconds=time.perf_counter() - start,
                      error=float(losses.sum()))
    return GPTQResult(weight=Q, scales=scales, zeros=zeros.to(torch.int32), g_idx=g_idx, stats=stats)




@torch.no_grad()
def gptq_quantize_model(model: nn.Module, calib_token_ids: list[list[int]], spec: QuantSpec,
                        config: GPTQConfig = GPTQConfig(), layers: list[int] | None = None,
                        progress: bool = True, results: dict[str, GPTQResult] | None = None) -> dict[str, GPTQStats]:
    """Quantize the decoder layers' linears in place, layer by layer, linear by linear.

    Each linear's Hessian comes from inputs produced by the already-quantized parts of the model
    (earlier layers, and earlier linears of the same layer), so later layers learn to compensate
    for the errors of earlier ones. `layers` limits the work to those layer indices (all by
    default; layers before the first listed one are run unquantized). Returns stats by module name;
    pass a dict as `results` to also keep each linear's GPTQResult (its codes' scales, zeros, g_idx),
    which checkpoint export needs: scales cannot be re-derived exactly from the quantized weights.
    """
    from tqdm.auto import tqdm

    cal = CalibrationPass(model, calib_token_ids, layers)
    stats: dict[str, GPTQStats] = {}
    bar = tqdm(total=len(cal.chosen) * len(LINEAR_STEPS), desc="GPTQ", disable=not progress)
    for index in range(cal.chosen[-1] + 1):
        layer = model.layers[index]
        if index not in cal.chosen:
            cal.advance(layer)
            continue
        # One walk through the layer; each linear's inputs already see the linears quantized before it.
        for name, inputs in cal.sequential(layer):
            lin = layer.get_submodule(name)
            acc = HessianAccumulator(lin.in_features, device=lin.weight.device)
            for x in inputs:
                acc.add_batch(x)
            result = gptq_quantize(lin.weight, acc.H, spec, config)
            # copy_ keeps the weight's storage, so its transposed layout survives.
            lin.weight.data.copy_(result.weight.to(lin.weight.dtype))
            stats[f"layers.{index}.{name}"] = result.stats
            if results is not None:
                results[f"layers.{index}.{name}"] = result
            bar.update(1)
    bar.close()
    return stats
