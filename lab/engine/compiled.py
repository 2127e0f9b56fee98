"""Compiled steps: the model's forward and LM head as one `torch.compile` (inductor) graph, the CPU analogue of
the CUDA graphs a GPU engine replays (seed 003, section 4.2).

Eager PyTorch runs a decode step of SmolLM2 as about 900 small operators, each paying Python and dispatch
overhead; inductor fuses the elementwise work (residual adds, RMSNorm, RoPE, SiLU x mul, casts) into generated
C++ loops around the matmuls, so a step is one compiled call. A bfloat16 model's linears stay prepacked for
oneDNN (`lab.models.prepack`): each is one opaque custom operator in the graph (`lab::prepacked_linear`), which
inductor leaves alone and fuses around. Attention stays outside the graph, as in vLLM's
piecewise compilation: it is registered as a custom operator (`lab::paged_attention_<n>`, one per
`CompiledStep`) that calls the step's attention context, which the `CompiledStep` holds around each forward
(vLLM's "forward context"), so the graph is not broken at every layer and the paged-cache logic stays the
reference code. The operator reaches that context through a slot of its own `CompiledStep`, not a module
global, so two engines in one process never see each other's step.

Shapes: the number of tokens T and of logit rows change every step. vLLM pads T to a few capture sizes
because a CUDA graph needs static shapes; inductor's dynamic shapes need no padding, so T and the rows are marked
dynamic and one graph serves every step (dynamo specializes the sizes 0 and 1 on its own: a decode step at batch
1, or a chunk that needs no logits, gets its own graph). Only those: the weights' sizes and the modules' float
attributes stay static. With `torch.compile(dynamic=True)` every size and float was symbolic, the RMSNorms' eps
and offset among them; dynamo then discarded its first trace of the whole model and restarted
(`TensorifyScalarRestartAnalysis`), 22 s of an 80-s compile on 2 cores. The graphs are compiled on first use and kept in
inductor's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`, default under /tmp), so a later process reuses them;
`compile_seconds` reports the time spent compiling in this process. The first `CompiledStep` of every process
registers operator 0, so a later process finds its graphs in that cache; a second compiled engine in one
process compiles its own.
"""

from __future__ import annotations

import itertools
import time

import torch
from torch import nn


class _Slot:
    """The attention context of the step a `CompiledStep` is running (None between steps). It holds nothing else,
    so the registered operator that keeps it alive keeps no model alive."""

    context = None


def _attention_op(slot: _Slot, n: int):
    """Register `lab::paged_attention_<n>`: the current step's attention for `layer`, read from `slot`. It writes
    k, v into the paged pool, a side effect the graph does not see, harmless because only later attention calls
    read the pool, and they depend on this output. Both backends return a new tensor, never a view of q, k or v,
    as a custom operator must."""

    @torch.library.custom_op(f"lab::paged_attention_{n}", mutates_args=())
    def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        return slot.context.attend(layer, q, k, v)

    @paged_attention.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        return torch.empty_like(q)

    return paged_attention


class _OpContext:
    """The attention context the compiled graph's layers see: every call goes through the custom operator."""

    def __init__(self, op):
        self.op = op

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.op(q, k, v, layer)


class _Step(nn.Module):
    def __init__(self, model: nn.Module, context: _OpContext):
        super().__init__()
        self.model, self.context = model, context

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions, self.context)[rows])


def _guards_kept(entries) -> list[bool]:
    """Which of dynamo's guards a compiled step keeps: none on the model's modules and weights, which the engine
    never changes after building the step (torch's `skip_guard_on_all_nn_modules_unsafe`; vLLM skips dynamo's
    guards altogether), except those on the step's own attention operator (`self.context.op`), so that a second
    engine in the process, whose operator differs, does not run this one's graph. Checking every module and
    weight cost about 1 ms a call on 2 cores ("TorchDynamo Cache Lookup" in `lab bench engine --profile`)."""
    return [not e.orig_guard.source.is_unspecialized_nn_module() or e.name == "self"
            or e.name.startswith("self.context") for e in entries]


class CompiledStep:
    """`lab.engine.model_runner.eager_step` through `torch.compile`: same arguments, same logits up to the order
    of float operations."""

    _ops = itertools.count()  # operator numbers, in the order this process builds compiled steps

    def __init__(self, model: nn.Module):
        self.model, self.slot = model, _Slot()
        self.compiled = torch.compile(_Step(model, _OpContext(_attention_op(self.slot, next(self._ops)))),
                                      options={"guard_filter_fn": _guards_kept})
        self.compile_seconds = 0.0  # first calls at a new shape (dynamo traces, inductor compiles or loads)
        self.shapes_seen: set[tuple[bool, bool]] = set()

    def __call__(self, model, input_ids: torch.Tensor, positions: torch.Tensor, context,
                 rows: list[int]) -> torch.Tensor:
        if not rows:  # no logits (a chunk mid-prompt): run it eagerly rather than compile a graph without a head
            return model(input_ids, positions, context).new_empty(0, 0)
        shape = (input_ids.shape[0] == 1, len(rows) == 1)  # the sizes dynamo specializes on
        first = shape not in self.shapes_seen
        start = time.perf_counter()
        rows = torch.tensor(rows, device=input_ids.device)
        for t in (input_ids, positions, rows):  # only the step's sizes are dynamic (see the module docstring)
            torch._dynamo.maybe_mark_dynamic(t, 0)
        self.slot.context = context
        try:
            logits = self.compiled(input_ids, positions, rows)
        finally:
            self.slot.context = None
        if first:
            self.shapes_seen.add(shape)
            self.compile_seconds += time.perf_counter() - start
        return logits
