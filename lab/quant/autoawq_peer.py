"""AutoAWQ as a peer: its quantizer's own search methods called on the lab's layers and inputs, for the
cross-check tests (tests/test_quant_awq_reference.py) and the timing in `lab bench quant`.

AutoAWQ (Casper Hansen et al., github.com/casper-hansen/AutoAWQ, archived; 0.2.9 here) is deprecated; installed
without its dependencies it still imports beside transformers 5. Its `AwqQuantizer.__init__` loads a Hugging
Face model and hub calibration data, so the quantizer is built without it, holding only the settings its
search methods read.

One AutoAWQ behaviour matters on a CPU: `_compute_best_scale` saves the inspected module's weights as
`{k: v.cpu()}` and restores them after each grid point. For GPU tensors `.cpu()` copies; for CPU tensors it
returns the same tensor, which the first grid point's in-place `weight.mul_(scales)` changes, so every later
grid point is evaluated on W diag(s_0) instead of W. Without duo scaling s_0 = 1 and nothing shows; with it
the search goes wrong. `copying_state_dict` restores the GPU behaviour for a faithful comparison.
"""

from __future__ import annotations

import torch
from torch import nn


def available() -> str:
    """Empty when AutoAWQ imports, else why not."""
    try:
        import awq.quantize.quantizer  # noqa: F401
    except Exception as exc:  # ImportError, or a deprecated package failing beside newer libraries
        return f"AutoAWQ does not import here ({type(exc).__name__}: {str(exc)[:200]})"
    return ""


def quantizer(bits: int = 4, group_size: int = 64, zero_point: bool = True, duo_scaling: bool = True):
    from awq.quantize.quantizer import AwqQuantizer

    q = AwqQuantizer.__new__(AwqQuantizer)
    q.w_bit, q.group_size, q.zero_point, q.duo_scaling = bits, group_size, zero_point, duo_scaling
    q.n_parallel_calib_samples, q.max_chunk_memory = None, 1024 ** 3
    return q


class _Pair(nn.Module):
    """The op feeding a scaling group and the inspected module side by side, so AutoAWQ can name them."""

    def __init__(self, prev: nn.Module, inspected: nn.Module):
        super().__init__()
        self.prev, self.inspected = prev, inspected


def copying_state_dict(module: nn.Module) -> nn.Module:
    """Make `module.state_dict()` return copies, as `.cpu()` does for GPU tensors (see the docstring)."""
    plain = module.state_dict
    module.state_dict = lambda *a, **k: {n: v.clone() for n, v in plain(*a, **k).items()}
    return module


def plain_linear(lin: nn.Linear) -> nn.Linear:
    """A contiguous copy of `lin` (the lab stores weights transposed; AutoAWQ views them in groups)."""
    out = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
    out.weight.data.copy_(lin.weight.detach())
    if lin.bias is not None:
        out.bias.data.copy_(lin.bias.detach())
    return out


@torch.no_grad()
def search_scales(x: torch.Tensor, linears: list[nn.Linear], inspected: nn.Module | None = None,
                  bits: int = 4, group_size: int = 64, duo_scaling: bool = True) -> torch.Tensor:
    """AutoAWQ's `_search_best_scale` for `linears` fed by `x`, inspecting `inspected` (default: the one
    linear). The caller decides whether `inspected` copies its state dict (`copying_state_dict`)."""
    prev = nn.Identity()
    pair = _Pair(prev, inspected if inspected is not None else linears[0])
    q = quantizer(bits, group_size, duo_scaling=duo_scaling)
    return q._search_best_scale(pair, prev, linears, x, module2inspect=inspected)[2].float()


@torch.no_grad()
def clip_thresholds(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int = 64) -> torch.Tensor:
    """AutoAWQ's `_compute_best_clip`: the clipping threshold per (row, group), [out, groups]."""
    return quantizer(bits, group_size)._compute_best_clip(w, x).squeeze(-1)
