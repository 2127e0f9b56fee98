"""Compiled steps: the model's forward and LM head as one `torch.compile` (inductor) graph, the CPU analogue of
the CUDA graphs a GPU engine replays (seed 003, section 4.2).

Eager PyTorch runs a decode step of SmolLM2 as about 900 small operators, each paying Python and dispatch
overhead; inductor fuses the elementwise work (residual adds, RMSNorm, RoPE, SiLU x mul, casts) into generated
C++ loops around the matmuls, so a step is one compiled call. Attention stays outside the graph, as in vLLM's
piecewise compilation: it is registered as a custom operator (`lab::paged_attention`) that calls the step's
attention context, which the runner sets around each forward (vLLM's "forward context"), so the graph is not
broken at every layer and the paged-cache logic stays the reference code.

Shapes: the number of tokens T and of logit rows change every step. vLLM pads T to a few capture sizes
because a CUDA graph needs static shapes; inductor's dynamic shapes need no padding, so T is marked dynamic
and one graph serves every step (dynamo specializes the sizes 0 and 1 on its own: a decode step at batch 1,
or a chunk that needs no logits, gets its own graph). The graphs are compiled on first use and kept in
inductor's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`, default under /tmp), so a later process reuses them;
`compile_seconds` reports the time spent compiling in this process.
"""

from __future__ import annotations

import time

import torch
from torch import nn

_CONTEXT: list = [None]  # the attention context of the step being run (one engine steps at a time per process)


@torch.library.custom_op("lab::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """The current step's attention for `layer` (it writes k, v into the paged pool: a side effect the graph
    does not see, harmless because only later attention calls read the pool, and they depend on this output).
    Both backends return a new tensor, never a view of q, k or v, as a custom operator must."""
    return _CONTEXT[0].attend(layer, q, k, v)


@paged_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return torch.empty_like(q)


class _OpContext:
    """The attention context the compiled graph's layers see: every call goes through the custom operator."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.lab.paged_attention(q, k, v, layer)


class _Step(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.context = model, _OpContext()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions, self.context)[rows])


class CompiledStep:
    """`lab.engine.model_runner.eager_step` through `torch.compile`: same arguments, same logits up to the order
    of float operations."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.compiled = torch.compile(_Step(model), dynamic=True)
        self.compile_seconds = 0.0  # first calls at a new shape (dynamo traces, inductor compiles or loads)
        self.shapes_seen: set[tuple[bool, bool]] = set()

    def __call__(self, model, input_ids: torch.Tensor, positions: torch.Tensor, context,
                 rows: list[int]) -> torch.Tensor:
        if not rows:  # no logits (a chunk mid-prompt): run it eagerly rather than compile a graph without a head
            return model(input_ids, positions, context).new_empty(0, 0)
        shape = (input_ids.shape[0] == 1, len(rows) == 1)  # the sizes dynamo specializes on
        first = shape not in self.shapes_seen
        start = time.perf_counter()
        _CONTEXT[0] = context
        try:
            logits = self.compiled(input_ids, positions, torch.tensor(rows, device=input_ids.device))
        finally:
            _CONTEXT[0] = None
        if first:
            self.shapes_seen.add(shape)
            self.compile_seconds += time.perf_counter() - start
        return logits
