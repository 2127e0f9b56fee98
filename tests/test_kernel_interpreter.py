"""`lab.kernels.interpreter`: in Triton's interpreter, `triton.language` is patched once per kernel launch however
many device functions the kernel calls, the kernel computes what it did, and the launch leaves `triton.language`
as it found it (the shipped interpreter left the patches of device calls in place)."""

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

import lab.kernels  # noqa: F401  installs it where the interpreter runs
from lab.kernels import interpreter as one_patch

pytestmark = pytest.mark.skipif(not one_patch.install(), reason="not Triton's interpreter of a checked release")


@triton.jit
def _double(x):
    return x * 2 + tl.zeros_like(x)  # zeros_like is triton.language.standard's: it sees triton.language.core


@triton.jit
def _doubling_kernel(x_ptr, out_ptr, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(CALLS):
        x = _double(x)
    tl.store(out_ptr + offs, x)


def _launch(calls: int) -> None:
    x = torch.arange(16, dtype=torch.float32)
    out = torch.empty_like(x)
    _doubling_kernel[(2,)](x, out, CALLS=calls, BLOCK=16)
    torch.testing.assert_close(out, x * 2**calls)


def _walks(monkeypatch, calls: int) -> int:
    """How many namespaces the launch walked to patch them."""
    count = [0]
    shipped = interpreter._patch_builtin

    def counting(*args, **kwargs):
        count[0] += 1
        return shipped(*args, **kwargs)

    monkeypatch.setattr(interpreter, "_patch_builtin", counting)
    _launch(calls)
    monkeypatch.setattr(interpreter, "_patch_builtin", shipped)
    return count[0]


def test_a_launch_patches_once_however_many_device_calls_it_makes(monkeypatch):
    # as shipped: 33 walks against 260, each device call in each of the 2 programs walking them again
    assert _walks(monkeypatch, 1) == _walks(monkeypatch, 8) > 0


def _namespaces() -> dict:
    spaces = {"tl": tl, "core": tl.core, "math": tl.math, "tensor": tl.tensor, "standard": tl.standard}
    return {(label, name): getattr(space, name) for label, space in spaces.items() for name in dir(space)}


def test_a_launch_leaves_triton_language_as_it_found_it():
    _launch(1)  # whatever a first launch sets up
    before, again = _namespaces(), _namespaces()
    _launch(3)
    after = _namespaces()
    stable = [k for k in before if again[k] is before[k]]  # not __dict__ or a bound method: new at each read
    assert [k for k in stable if after.get(k) is not before[k]] == [] and after.keys() == before.keys()


def test_a_launch_that_fails_does_not_leave_later_launches_unpatched():
    with pytest.raises(TypeError):
        _doubling_kernel[(1,)](torch.zeros(16), CALLS=1, BLOCK=16)  # out_ptr missing
    assert one_patch._state["depth"] == 0
    _launch(2)
