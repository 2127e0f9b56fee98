"""True-sequential calibration: the decoder layers are visited in order, and each layer sees the
hidden states produced by the layers before it *as already quantized*, so later layers are
calibrated on the errors they will really receive (GPTQ's and AWQ's reference implementations
both work this way).

Calibration sequences of equal length run together as one flat batch whose attention stays within
each sequence (`IndependentSequences`); batched attention is ~3x faster on a CPU than one call per
sequence, and packed calibration sets (`lab.quant.calibration.pack_blocks`) are all one length.

`CalibrationPass.sequential` walks one layer once, linear by linear, in the order their inputs
depend on each other (`LINEAR_STEPS`): the caller changes a linear (quantizes it) before the walk
computes the next one's inputs through it. That is the reference's "true sequential" order at the
cost of one layer forward, instead of one forward of the whole layer per linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lab.models.attention import AttentionLayout, check_plain

# A Llama decoder layer's linears in the order their inputs depend on each other.
LINEAR_STEPS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def check_linears(model: nn.Module) -> None:
    """`LINEAR_STEPS` name a dense layer's linears: refuse a mixture of experts (E of each, and a router) by name
    rather than quantize part of it."""
    c = model.config
    if c.family.mlp != "dense":
        raise ValueError(f"lab.quant quantizes dense decoder layers; {c.architecture} has a mixture of experts, "
                         f"whose experts and router it does not walk")


def check_sequential(model: nn.Module) -> None:
    """`CalibrationPass.sequential` recomputes the residual stream of the pre-norm layer: refuse other layouts (and
    mixtures of experts) by name."""
    check_linears(model)
    c = model.config
    if c.family.norm_layout != "pre":
        raise ValueError(f"calibrated quantization (GPTQ, AWQ) walks the pre-norm layer x + f(norm(x)); "
                         f"{c.architecture} is {c.family.norm_layout}-norm")


class IndependentSequences:
    """An `AttentionContext` for `batch` sequences of `length` tokens laid end to end in one flat
    batch of batch * length tokens, each attending causally within itself. One forward, no cache."""

    def __init__(self, batch: int, length: int, layout: AttentionLayout | None = None):
        self.batch, self.length, self.layout = batch, length, layout or AttentionLayout()

    def attend(self, layer, q, k, v):
        check_plain(self.layout, layer, self.length, "GPTQ/AWQ calibration (lab.quant.layerwise)")
        def heads(x):  # [B * T, h, d] -> [B, h, T, d]
            return x.view(self.batch, self.length, x.shape[1], x.shape[2]).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape)


def _inputs_of(linear: nn.Module, fn) -> list[torch.Tensor]:
    """Inputs `linear` receives while `fn()` runs (its outputs are discarded)."""
    seen: list[torch.Tensor] = []
    hook = linear.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        fn()
    finally:
        hook.remove()
    return seen


class CalibrationPass:
    """Hidden states entering the current layer: one [batch * length, hidden] tensor per group of
    equal-length calibration sequences (`self.hidden`, in the order of `self.shapes`)."""

    def __init__(self, model: nn.Module, calib_token_ids: list[list[int]], layers: list[int] | None = None):
        if not calib_token_ids or any(len(ids) == 0 for ids in calib_token_ids):
            raise ValueError("calib_token_ids must hold at least one non-empty sequence")
        check_sequential(model)
        self.n_layers, self.layout = len(model.layers), model.attention_layout
        self.chosen = sorted(set(range(self.n_layers) if layers is None else layers))
        if not self.chosen or self.chosen[0] < 0 or self.chosen[-1] >= self.n_layers:
            raise ValueError(f"layers={layers!r} must be indices in [0, {self.n_layers})")
        device = model.embed_tokens.weight.device
        by_length: dict[int, list[list[int]]] = {}
        for ids in calib_token_ids:
            by_length.setdefault(len(ids), []).append(list(ids))
        self.shapes = [(len(group), length) for length, group in sorted(by_length.items())]
        self.hidden, self.ropes = [], []
        for (batch, length), group in zip(self.shapes, (by_length[n] for _, n in self.shapes)):
            self.hidden.append(model.embed_tokens(torch.tensor([t for ids in group for t in ids], device=device)))
            self.ropes.append(model.rope(torch.arange(length, device=device).repeat(batch)))

    def _contexts(self):
        return [IndependentSequences(b, n, self.layout) for b, n in self.shapes]

    def run(self, layer: nn.Module) -> list[torch.Tensor]:
        """The layer's outputs for every group (the state is left unchanged)."""
        return [layer(x, rope, ctx) for x, rope, ctx in zip(self.hidden, self.ropes, self._contexts())]

    def advance(self, layer: nn.Module) -> None:
        """Move to the next layer: its inputs are this layer's outputs, with this layer as it now is."""
        self.hidden = self.run(layer)

    def sequential(self, layer: nn.Module):
        """Walk `layer` once: yields (name, per-group inputs) for each of `LINEAR_STEPS` in order.

        Before resuming, the caller may change the named linear; the next inputs are computed with
        it as changed. After the last step `self.hidden` holds the layer's output. The residual
        structure x + attn(norm(x)), then + mlp(norm(.)), is the Llama layer's (`DecoderLayer.forward`);
        inside attention and the MLP the model's own code runs, and hooks read what the o_proj and
        down_proj receive."""
        attn, mlp = layer.self_attn, layer.mlp
        normed = [layer.input_layernorm(x) for x in self.hidden]
        yield LINEAR_STEPS[0], normed
        context = _inputs_of(attn.o_proj, lambda: self.attention(layer, normed))
        yield LINEAR_STEPS[1], context
        resid = [x + attn.o_proj(c) for x, c in zip(self.hidden, context)]
        normed = [layer.post_attention_layernorm(r) for r in resid]
        yield LINEAR_STEPS[2], normed
        acts = _inputs_of(mlp.down_proj, lambda: [mlp(h) for h in normed])
        yield LINEAR_STEPS[3], acts
        self.hidden = [r + mlp.down_proj(a) for r, a in zip(resid, acts)]

    def capture(self, layer: nn.Module, names: list[str]) -> tuple[dict[str, list[torch.Tensor]], list[torch.Tensor]]:
        """Per-group inputs of the named linears of `layer` and the layer's outputs, from one pass."""
        seen = {name: [] for name in names}
        hooks = [layer.get_submodule(name).register_forward_hook(
            lambda _m, args, _out, acc=seen[name]: acc.append(args[0].detach())) for name in names]
        try:
            outputs = self.run(layer)
        finally:
            for h in hooks:
                h.remove()
        return seen, outputs

    def attention(self, layer: nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The attention block's output for per-group (normed) inputs, concatenated over groups."""
        return torch.cat([layer.self_attn(x, rope, ctx)
                          for x, rope, ctx in zip(inputs, self.ropes, self._contexts())])
