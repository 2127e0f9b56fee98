"""Measured memory traffic of kernels run in Triton's interpreter: every byte their programs load and store.

A kernel's docstring predicts its traffic as a formula; on a GPU the benchmark divides that formula by a
measured time. Without a GPU the formula can still be checked: the interpreter executes each `tl.load` and
`tl.store` as numpy gathers and scatters at explicit addresses, so wrapping them counts, per named tensor,

- `requested`: bytes the programs asked for (a value loaded twice counts twice: what caches must serve), and
- `unique`: distinct bytes touched (what DRAM moves if every reuse hits a cache: what the formulas state).

Their ratio is the kernel's reuse, e.g. the block table entry loaded once per token of its block, or an int4
code byte loaded once for each of its two elements. Addresses are attributed to the tensors passed by name
(views included); anything else is counted under "other".
"""

from __future__ import annotations

import os
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Traffic:
    requested: dict = field(default_factory=lambda: defaultdict(lambda: {"read": 0, "written": 0}))
    _addresses: dict = field(default_factory=lambda: defaultdict(lambda: {"read": [], "written": []}))

    @property
    def unique(self) -> dict:
        """Distinct bytes read and written per tensor."""
        return {name: {kind: int(np.unique(np.concatenate(a)).size) if a else 0 for kind, a in kinds.items()}
                for name, kinds in self._addresses.items()}

    def total(self, kind: str, unique: bool = True, exclude: tuple = ()) -> int:
        table = self.unique if unique else self.requested
        return sum(v[kind] for name, v in table.items() if name not in exclude)


@contextmanager
def measure_traffic(**tensors: torch.Tensor):
    """Count the bytes the interpreted kernels launched inside the block load and store, by tensor name."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("traffic is measured in Triton's interpreter (TRITON_INTERPRET=1); on a GPU use a "
                           "profiler")
    from triton.runtime import interpreter

    regions = [(name, t.data_ptr(), t.data_ptr() + _extent(t)) for name, t in tensors.items()]
    traffic = Traffic()

    def record(kind: str, ptrs: np.ndarray, mask, itemsize: int) -> None:
        addr = ptrs if mask is None else ptrs[np.broadcast_to(mask, ptrs.shape)]
        addr = addr.astype(np.int64).ravel()
        owner = np.full(addr.shape, -1)
        for i, (_, lo, hi) in enumerate(regions):
            owner[(addr >= lo) & (addr < hi)] = i
        for i in np.unique(owner):
            name = regions[i][0] if i >= 0 else "other"
            mine = addr[owner == i]
            traffic.requested[name][kind] += mine.size * itemsize
            # every byte of each element, so elements of different sizes count right
            traffic._addresses[name][kind].append((mine[:, None] + np.arange(itemsize)).ravel())

    builder = interpreter.interpreter_builder
    saved = {n: getattr(builder, n) for n in ("create_load", "create_store", "create_masked_load",
                                              "create_masked_store")}

    def itemsize(ptrs) -> int:
        return np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize

    def masked_load(ptrs, mask, *args):
        record("read", ptrs.data, mask.data, itemsize(ptrs))
        return saved["create_masked_load"](ptrs, mask, *args)

    def load(ptr, *args):
        record("read", ptr.data, None, itemsize(ptr))
        return saved["create_load"](ptr, *args)

    def masked_store(ptrs, value, mask, *args):
        record("written", ptrs.data, mask.data, itemsize(ptrs))
        return saved["create_masked_store"](ptrs, value, mask, *args)

    def store(ptr, value, *args):
        record("written", ptr.data, None, itemsize(ptr))
        return saved["create_store"](ptr, value, *args)

    builder.create_masked_load, builder.create_load = masked_load, load
    builder.create_masked_store, builder.create_store = masked_store, store
    try:
        yield traffic
    finally:
        for name in saved:
            delattr(builder, name)  # back to the class's methods


def _extent(t: torch.Tensor) -> int:
    """Bytes from a view's first element to one past its last."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()
