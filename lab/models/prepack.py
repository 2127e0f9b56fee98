"""Weights reordered once for the CPU's matmul library: the float counterpart of `lab.quant.packed`.

`F.linear` on a CPU hands a plain row-major weight to oneDNN (bfloat16) or MKL (float32), which re-block it for
their microkernels on every call; at the few rows of a decode step that per-call work, not the weight read,
is most of the time. `torch.ops.mkldnn._reorder_linear_weight` does the blocking once and
`torch.ops.mkldnn._linear_pointwise` multiplies against the blocked weight, the pair inductor's `freezing`
pass substitutes for every linear of a frozen graph. Measured on this machine (one thread, median of
repeats, the LM head 49152 x 576): bfloat16 10.5 -> 3.9 ms at 1 row, 12.7 -> 3.5 ms at 5 rows (a speculative
verification costs what one row does), 22.9 -> 14.6 ms at 32 rows; float32 14.0 -> 11.6, 29.1 -> 16.3 and
50.9 -> 37.4 ms. The blocked copy is not bit-identical to `F.linear` in float32 (another summation order:
differences of ~1e-4 on the LM head's logits), so it is an optimised path compared against the reference
path in the tests, not a replacement for it.

`prepack(model)` swaps every `nn.Linear` of a model for a `PrepackedLinear` holding the blocked copy beside
the original weight (kept: the tied embedding, replay's K/V rebuild and the byte accounts read it), so the
weights take twice their memory.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


def available(device: torch.device | str) -> bool:
    """A CPU, and a torch built with oneDNN that has the two operators (private ones: they are what inductor's
    freezing pass emits, so they live as long as inductor's CPU path does)."""
    return (torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


@torch.library.custom_op("lab::prepacked_linear", mutates_args=())
def prepacked_linear(x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None,
                     out_features: int) -> torch.Tensor:
    """x [rows, in] against a weight `blocked` by `_reorder_linear_weight`. An operator of its own so that a
    compiled graph (`lab.engine.compiled`) calls the blocked weight as one opaque node and inductor fuses the
    elementwise work around it; tracing oneDNN's operator itself would need a fake tensor of the opaque blocked
    layout, which dynamo cannot make."""
    return torch.ops.mkldnn._linear_pointwise(x, blocked, bias, "none", [], "")


@prepacked_linear.register_fake
def _(x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class PrepackedLinear(nn.Module):
    """An `nn.Linear` whose weight is also held in oneDNN's blocked layout; the forward uses that copy."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        with torch.no_grad():
            self.blocked = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)

    def __deepcopy__(self, memo):
        # The blocked copy is an opaque oneDNN tensor that deepcopy cannot read: block the copied weight again.
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = copy.deepcopy(self.weight, memo)
        linear.bias = copy.deepcopy(self.bias, memo)
        return PrepackedLinear(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype or x.device.type != "cpu" or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)  # what the blocked copy cannot serve: the reference
        bias = None if self.bias is None else self.bias.detach()
        rows = x.reshape(-1, self.in_features)
        if torch.compiler.is_compiling():  # one opaque node in the graph (eager skips the custom op's dispatch)
            out = prepacked_linear(rows, self.blocked, bias, self.out_features)
        else:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.blocked, bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def wanted(model: nn.Module) -> bool:
    """Whether prepacking pays for `model`: 16-bit weights on a CPU that has the operators (float32 gained
    nothing measurable, see the module docstring)."""
    weight = next(model.parameters())
    return weight.dtype in (torch.bfloat16, torch.float16) and available(weight.device)


def prepack(model: nn.Module) -> nn.Module:
    """Swap every `nn.Linear` of `model` for a `PrepackedLinear`, in place; returns the model."""
    if not available(next(model.parameters()).device):
        raise ValueError("prepacked weights need a CPU model and a torch built with oneDNN (mkldnn)")
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, PrepackedLinear(child))
    return model


def where_it_pays(model: nn.Module) -> nn.Module:
    """`prepack(model)` if `wanted(model)`, else `model` as it is; returns the model."""
    return prepack(model) if wanted(model) else model


def count(model: nn.Module) -> int:
    """How many of `model`'s linears are prepacked."""
    return sum(isinstance(m, PrepackedLinear) for m in model.modules())


def unprepack(model: nn.Module) -> nn.Module:
    """Undo `prepack`, in place: plain `nn.Linear`s on the same weights (what code that rewrites weights, such as
    quantization, needs: the blocked copy would not follow)."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, PrepackedLinear):
                linear = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                   device="meta")
                linear.weight, linear.bias = child.weight, child.bias
                setattr(module, child_name, linear)
    return model
