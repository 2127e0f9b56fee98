"""AWQ: activation-aware weight quantization. Salient input channels (large mean |x|) are protected
by scaling them up before rounding, the inverse scale being folded into the op that feeds them.

Lin, Tang, Tang, Yang, Chen, Wang, Xiao, Dang, Gan, Han, "AWQ: Activation-aware Weight Quantization
for On-Device LLM Compression and Acceleration", MLSys 2024 (section 3). Written for the lab after
the method of the paper and the behaviour of the AutoAWQ reference (no code copied).

For a linear y = x W^T, any per-input-channel s > 0 gives y = (x / s)(W diag(s))^T. Quantizing
W diag(s) instead of W shrinks the relative rounding error of the channels with s > 1. The x / s
costs nothing when it is folded into the previous op: an RMSNorm's weight, or the rows of a linear
that produce x. Per *scaling group* (the linears sharing one input):

- statistic: s_x = mean |x| per input channel over the calibration tokens; with `duo_scaling`,
  also s_w = mean over output rows of |w| / max|w| of its quantization group;
- grid: alpha = k / n_grid, k = 0 .. n_grid - 1 (so in [0, 1)), scales = s_x^alpha
  (duo: s_x^alpha / s_w^(1 - alpha)), clamped to >= 1e-4 and divided by sqrt(max * min);
- loss: MSE between the inspected block's float output and its output with every linear of the
  group replaced by fake_quantize(W diag(s)) diag(s)^-1, on the calibration inputs; the alpha with
  the lowest loss wins. alpha = 0 without duo scaling gives s = 1, i.e. plain RTN, so the chosen
  scales never do worse than RTN on this loss.

Evaluating that loss in float32 for every grid point is where the time goes, so every group first screens
the grid with a cheaper estimate of the same loss (`lab.quant.awq_screen`: bfloat16 products of the changes,
or the inputs' Gram matrix) and evaluates exactly only the points the screen cannot tell from the best; the
choice is the exact search's whenever the screen keeps within its (self-widening) margin.

Scaling groups of a Llama layer and the block each one inspects:

- input_layernorm -> qkv_proj: the whole attention block (q, k, v, RoPE, causal attention over
  each calibration sequence on its own, through a fresh `ContiguousKVCache`, and o_proj). This is
  practical here because the captured inputs are kept per sequence;
- v -> o_proj (the v rows of qkv_proj feed o_proj through attention, which is linear in v per head):
  only when n_kv_heads == n_heads. With GQA (SmolLM2: v has 3 * 64 = 192 outputs, o_proj 576 inputs)
  one v channel feeds several o_proj inputs, so a per-channel scale cannot be folded; the group is
  skipped and the reason recorded in the stats;
- post_attention_layernorm -> gate_up_proj: the MLP's output;
- up -> down_proj (the `up` half of gate_up_proj's rows, since silu(gate) * up is linear in up):
  down_proj's output.

Clipping (after scaling, before rounding; `lab.quant.awq_clip`): for every linear except q and k (their
rows of qkv_proj are left alone, as in the reference: their error goes through softmax, which the per-linear
objective does not see), each (row, quantization group) is clamped to the ratio of its max|w| that minimises
its share of the output error.

The model is processed layer by layer, in order: a layer's inputs come from the earlier layers as
already quantized; every linear's inputs are captured in one pass, and a group's own inputs are divided
by its scales once they are folded (folding in float changes nothing else in the layer); the layer's
linears are fake-quantized at the end (as gptq_quantize_model does), so the model ends in float32
with weights on the RTN grid of the scaled, clipped weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .awq_clip import AWQClipStats, search_clip
from .awq_screen import AttentionScreen, LinearScreen, LossScreen, MLPScreen, confirm
from .layerwise import CalibrationPass
from .rtn import QuantSpec, dequantize, fake_quantize, quantize

MIN_SCALE = 1e-4  # floor on the scales (and the duo denominator), as in the reference


# ---------------------------------------------------------------------------------------------
# Scale search
# ---------------------------------------------------------------------------------------------

def activation_mean(x: torch.Tensor) -> torch.Tensor:
    """s_x: mean |x| per input channel, [in], over every leading index of `x` [..., in]."""
    return x.reshape(-1, x.shape[-1]).float().abs().mean(0)


def weight_mean(weights: list[torch.Tensor], spec: QuantSpec) -> torch.Tensor:
    """s_w: mean over all output rows of the weights stacked along outputs of |w| / max|w|, the max
    taken within each row's quantization group (ragged last group included); [in]."""
    w = torch.cat([w.detach().float() for w in weights]).abs()
    width = spec.group_width(w.shape[1])
    normed = torch.cat([blk / (blk.amax(dim=1, keepdim=True) + 1e-6)
                        for blk in w.split(width, dim=1)], dim=1)
    return normed.mean(0)


def awq_scales(x_mean: torch.Tensor, alpha: float, w_mean: torch.Tensor | None = None) -> torch.Tensor:
    """Scales for one grid point: s_x^alpha (or s_x^alpha / s_w^(1-alpha) when `w_mean` is given),
    clamped to >= MIN_SCALE, normalised by sqrt(max * min) so they straddle 1."""
    if w_mean is None:
        s = x_mean.pow(alpha).clamp(min=MIN_SCALE)
    else:
        s = (x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + MIN_SCALE)).clamp(min=MIN_SCALE)
    return s / (s.max() * s.min()).sqrt()


def scaled_fake_quantize(w: torch.Tensor, scales: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """fake_quantize(W diag(s)) diag(s)^-1: the weight the layer effectively computes with once the
    scales are folded into the previous op and W diag(s) is rounded. s = 1 gives RTN exactly."""
    s = scales.float()[None, :]
    return fake_quantize(w.detach().float() * s, spec) / s


@dataclass
class AWQGroupStats:
    """One scaling group: the chosen alpha, the block-output MSE with RTN (s = 1) and with the
    chosen scales, and the loss at every grid point (alpha = k / n_grid)."""

    alpha: float
    loss_rtn: float
    loss_awq: float
    losses: list[float] = field(default_factory=list)


def search_scales(x: torch.Tensor, weights: list[torch.Tensor],
                  block: Callable[[list[torch.Tensor]], torch.Tensor], spec: QuantSpec,
                  n_grid: int = 20, duo_scaling: bool = False, screen: LossScreen | None = None,
                  ref: torch.Tensor | None = None) -> tuple[torch.Tensor, AWQGroupStats]:
    """Best scales [in] for a group of linears sharing the input `x` [..., in].

    `weights` are the group's float weights [out_i, in]; `block(ws)` must return the inspected
    block's output with the group's weights replaced by `ws` (same order). The reference is
    `ref` if given, else `block(weights)`; the loss is the MSE against it.

    With a `screen` (`lab.quant.awq_screen`), every grid point's loss is first estimated by it, and only the
    points it cannot tell from the best are evaluated exactly (`awq_screen.confirm`): the chosen point is the
    exact search's as long as the screen keeps within its margin. Their losses in the stats are exact, the
    others the screen's.
    """
    if n_grid < 1:
        raise ValueError(f"n_grid={n_grid} must be >= 1")
    weights = [w.detach().float() for w in weights]
    x_mean = activation_mean(x)
    w_mean = weight_mean(weights, spec) if duo_scaling else None
    refs = [] if ref is None else [ref.float()]

    def exact(scales: torch.Tensor) -> float:
        if not refs:
            refs.append(block(weights).float())
        out = block([scaled_fake_quantize(w, scales, spec) for w in weights]).float()
        return float(torch.nn.functional.mse_loss(out, refs[0]))

    def estimate(scales: torch.Tensor) -> float:
        if screen is None:
            return exact(scales)
        return screen([scaled_fake_quantize(w, scales, spec) for w in weights])

    grid = [awq_scales(x_mean, k / n_grid, w_mean) for k in range(n_grid)]
    loss_rtn = estimate(torch.ones_like(x_mean))
    losses = [loss_rtn if (k == 0 and not duo_scaling) else estimate(s) for k, s in enumerate(grid)]
    if screen is not None:
        for k, loss in confirm(losses, lambda k: exact(grid[k]), screen.rtol).items():
            losses[k] = loss
        loss_rtn = loss_rtn if duo_scaling else losses[0]
    best, best_k = math.inf, 0
    for k, loss in enumerate(losses):  # the first of equal losses wins, as a strict < keeps it
        if loss < best:
            best, best_k = loss, k
    if not math.isfinite(best):
        raise ValueError(f"every AWQ grid point gave a non-finite loss ({losses[:3]} ...)")
    return grid[best_k], AWQGroupStats(alpha=best_k / n_grid, loss_rtn=loss_rtn, loss_awq=best, losses=losses)


# ---------------------------------------------------------------------------------------------
# Folding the scales
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def _set_weight(lin: nn.Linear, w: torch.Tensor, rows: slice = slice(None)) -> None:
    # copy_ keeps the weight's storage, so its transposed layout survives.
    lin.weight.data[rows].copy_(w.to(lin.weight.dtype))


@torch.no_grad()
def fold_scales(prev: nn.Module, linears: list[nn.Linear], scales: torch.Tensor,
                prev_rows: slice = slice(None)) -> None:
    """Divide the op feeding the group by `scales` and multiply the group's input columns by them.

    `prev` is an RMSNorm (its weight is divided) or a linear whose output rows `prev_rows` produce
    the group's input (those rows, and their bias if any, are divided)."""
    s = scales.float()
    if isinstance(prev, nn.Linear):
        _set_weight(prev, prev.weight[prev_rows].float() / s[:, None], prev_rows)
        if prev.bias is not None:
            prev.bias.data[prev_rows].div_(s.to(prev.bias.dtype))
    elif hasattr(prev, "weight") and prev.weight.dim() == 1:
        prev.weight.data.copy_((prev.weight.float() / s).to(prev.weight.dtype))
    else:
        raise TypeError(f"cannot fold scales into {type(prev).__name__}")
    for lin in linears:
        _set_weight(lin, lin.weight.float() * s[None, :])


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

@dataclass
class AWQLayerStats:
    """One decoder layer: scale search per group, groups skipped (with the reason), clipping per
    linear, the layer-output MSE on the calibration inputs with RTN and with AWQ, and wall time."""

    groups: dict[str, AWQGroupStats]
    skipped: dict[str, str]
    clip: dict[str, AWQClipStats]
    layer_loss_rtn: float
    layer_loss_awq: float
    seconds: float


@dataclass
class _Group:
    name: str
    prev: nn.Module
    linears: list[str]          # names inside the layer
    prev_rows: slice
    inspect: str                # "attn": the attention block; "mlp"; or a linear's name


def llama_scaling_groups(layer: nn.Module) -> tuple[list[_Group], dict[str, str]]:
    """AWQ's scaling groups for one Llama decoder layer, and the groups skipped with the reason."""
    attn, mlp = layer.self_attn, layer.mlp
    inter = mlp.down_proj.in_features
    groups = [_Group("input_layernorm->qkv_proj", layer.input_layernorm, ["self_attn.qkv_proj"],
                     slice(None), "attn")]
    skipped = {}
    v_rows = slice(attn.q_size + attn.kv_size, attn.q_size + 2 * attn.kv_size)
    if attn.kv_size == attn.o_proj.in_features:
        groups.append(_Group("v->o_proj", attn.qkv_proj, ["self_attn.o_proj"], v_rows, "self_attn.o_proj"))
    else:
        skipped["v->o_proj"] = (f"grouped-query attention: v has {attn.kv_size} outputs ({attn.n_kv} kv heads) "
                                f"but o_proj has {attn.o_proj.in_features} inputs; a v channel feeds "
                                f"{attn.n_heads // attn.n_kv} o_proj inputs, so per-channel scales cannot fold")
    groups.append(_Group("post_attention_layernorm->gate_up_proj", layer.post_attention_layernorm,
                         ["mlp.gate_up_proj"], slice(None), "mlp"))
    groups.append(_Group("up->down_proj", mlp.gate_up_proj, ["mlp.down_proj"], slice(inter, 2 * inter),
                         "mlp.down_proj"))
    return groups, skipped


@torch.no_grad()
def _with_weights(linears: list[nn.Linear], weights: list[torch.Tensor], fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    saved = [lin.weight.detach().clone() for lin in linears]
    try:
        for lin, w in zip(linears, weights):
            _set_weight(lin, w)
        return fn()
    finally:
        for lin, w in zip(linears, saved):
            _set_weight(lin, w)


@torch.no_grad()
def awq_quantize_model(model: nn.Module, calib_token_ids: list[list[int]], spec: QuantSpec,
                       n_grid: int = 20, duo_scaling: bool = False, clip: bool = True,
                       layers: list[int] | None = None, progress: bool = True,
                       clip_grid: int = 20, clip_max_shrink: float = 0.5,
                       clip_tokens: int = 512, results: dict | None = None) -> dict[str, AWQLayerStats]:
    """AWQ-quantize the decoder layers' linears in place (fake-quantized float weights; the norms
    and the up rows absorb the scales), layer by layer. `layers` limits the work to those indices
    (all by default; layers before the first listed one run unquantized). Returns stats by layer
    ("layers.{i}"). Pass a dict as `results` to also get each linear's codes (q, scales, zeros, None)
    of the scaled, clipped weight, which checkpoint export needs."""
    from tqdm.auto import tqdm

    cal = CalibrationPass(model, calib_token_ids, layers)
    stats: dict[str, AWQLayerStats] = {}
    bar = tqdm(total=len(cal.chosen), desc="AWQ", disable=not progress)
    for index in range(cal.chosen[-1] + 1):
        layer = model.layers[index]
        if index not in cal.chosen:
            cal.advance(layer)
            continue
        start = time.perf_counter()
        original = {n: p.detach().clone() for n, p in layer.named_parameters()}
        names = [n for n, m in layer.named_modules() if isinstance(m, nn.Linear)]
        # Every linear's inputs, captured once. Folding a group's scales leaves the float layer
        # unchanged except that the group's own inputs become x / s, so those are divided in
        # place instead of running the layer again (AutoAWQ updates its captured inputs alike).
        # The attention block's float output, the reference of the qkv group's search, comes from the same pass.
        attn_out: list[torch.Tensor] = []
        hook = layer.self_attn.register_forward_hook(lambda _m, _a, out, acc=attn_out: acc.append(out.detach()))
        try:
            inputs, ref_out = cal.capture(layer, names)
        finally:
            hook.remove()
        group_stats, skipped = _scale_layer(cal, layer, inputs, torch.cat(attn_out), spec, n_grid, duo_scaling)
        clip_stats = _clip_layer(layer, names, inputs, spec, clip_grid, clip_max_shrink, clip_tokens) if clip else {}
        _quantize_layer(layer, names, spec, index, results)
        awq_out = cal.run(layer)
        rtn_out = _rtn_output(cal, layer, original, names, spec)
        stats[f"layers.{index}"] = AWQLayerStats(
            groups=group_stats, skipped=skipped, clip=clip_stats,
            layer_loss_rtn=_mse(rtn_out, ref_out), layer_loss_awq=_mse(awq_out, ref_out),
            seconds=time.perf_counter() - start)
        bar.update(1)
        cal.hidden = awq_out  # the layer as quantized: its output feeds the next layer
    bar.close()
    return stats


def _inspected_block(cal: CalibrationPass, layer: nn.Module, grp: _Group, x_in: list[torch.Tensor],
                     x_all: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The output a group's scales are judged on: the attention block, the MLP, or the group's own linear."""
    if grp.inspect == "attn":
        return lambda: cal.attention(layer, x_in)
    module = layer.get_submodule(grp.inspect)
    return lambda: module(x_all)


def _screen(cal: CalibrationPass, layer: nn.Module, grp: _Group, x_in: list[torch.Tensor],
            x: torch.Tensor) -> LossScreen:
    """The cheaper loss estimate for a group's search (`lab.quant.awq_screen`): the attention block, the
    MLP, or else the group's own linear."""
    if grp.inspect == "attn":
        return AttentionScreen(layer.self_attn, lambda inputs: cal.attention(layer, inputs), x,
                               [v.shape[0] for v in x_in])
    if grp.inspect == "mlp":
        return MLPScreen(layer.mlp, x)
    return LinearScreen(x, layer.get_submodule(grp.linears[0]).weight)


def _scale_layer(cal: CalibrationPass, layer: nn.Module, inputs: dict[str, list[torch.Tensor]],
                 attn_out: torch.Tensor, spec: QuantSpec, n_grid: int,
                 duo_scaling: bool) -> tuple[dict[str, AWQGroupStats], dict[str, str]]:
    """Search each scaling group's scales and fold them in, in order; the group's captured inputs become
    x / s. `attn_out` is the float attention block's output on the captured inputs. Returns the stats by
    group and the groups skipped (with the reason)."""
    groups, skipped = llama_scaling_groups(layer)
    group_stats: dict[str, AWQGroupStats] = {}
    for grp in groups:
        lins = [layer.get_submodule(n) for n in grp.linears]
        x_in = inputs[grp.linears[0]]
        x = torch.cat(x_in)
        block_fn = _inspected_block(cal, layer, grp, x_in, x)
        screen = _screen(cal, layer, grp, x_in, x)
        ref = attn_out if grp.inspect == "attn" else screen.reference() if isinstance(screen, MLPScreen) else None
        scales, group_stats[grp.name] = search_scales(
            x, [lin.weight for lin in lins],
            lambda ws, lins=lins, block_fn=block_fn: _with_weights(lins, ws, block_fn),
            spec, n_grid=n_grid, duo_scaling=duo_scaling, screen=screen, ref=ref)
        del screen  # its buffers (~0.7 GB at 32 x 512 tokens) go before the next group's
        fold_scales(grp.prev, lins, scales, grp.prev_rows)
        for name in grp.linears:
            inputs[name] = [v / scales.to(v.dtype) for v in inputs[name]]
    return group_stats, skipped


def _clip_layer(layer: nn.Module, names: list[str], inputs: dict[str, list[torch.Tensor]], spec: QuantSpec,
                n_grid: int, max_shrink: float, n_tokens: int) -> dict[str, AWQClipStats]:
    """Clip every linear's (scaled) weights to the ratio that minimises its output error; stats by linear."""
    attn = layer.self_attn
    clip_stats: dict[str, AWQClipStats] = {}
    for name in names:
        lin = layer.get_submodule(name)
        x = torch.cat(inputs[name])
        # q and k are not clipped: only the v rows of the fused qkv_proj.
        rows = slice(attn.q_size + attn.kv_size, None) if lin is attn.qkv_proj else slice(None)
        clipped, _, clip_stats[name] = search_clip(lin.weight[rows], x, spec, n_grid=n_grid, max_shrink=max_shrink,
                                                   n_tokens=n_tokens)
        _set_weight(lin, clipped, rows)
    return clip_stats


def _quantize_layer(layer: nn.Module, names: list[str], spec: QuantSpec, index: int, results: dict | None) -> None:
    """Round every linear's scaled, clipped weights to the grid (fake-quantized in place)."""
    for name in names:
        lin = layer.get_submodule(name)
        q, scales, zeros = quantize(lin.weight.float(), spec)
        _set_weight(lin, dequantize(q, scales, zeros, group_size=spec.group_size))
        if results is not None:  # the codes, for checkpoint export
            results[f"layers.{index}.{name}"] = (q, scales, zeros, None)


def _rtn_output(cal: CalibrationPass, layer: nn.Module, original: dict[str, torch.Tensor], names: list[str],
                spec: QuantSpec) -> list[torch.Tensor]:
    """The layer's output with RTN on its original weights, for comparison; then the AWQ weights go back."""
    params = dict(layer.named_parameters())
    awq_params = {n: p.detach().clone() for n, p in params.items()}
    for n, p in params.items():
        p.data.copy_(original[n])
    for name in names:
        lin = layer.get_submodule(name)
        _set_weight(lin, fake_quantize(lin.weight, spec))
    rtn_out = cal.run(layer)
    for n, p in params.items():
        p.data.copy_(awq_params[n])
    return rtn_out


def _mse(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float((torch.cat(a).float() - torch.cat(b).float()).pow(2).mean())
