"""One patch of `triton.language` per kernel launch in Triton's interpreter (TRITON_INTERPRET=1, no GPU).

The interpreter runs a kernel by swapping `triton.language`'s builtins for numpy-backed ones when the launch starts
(`triton.runtime.interpreter._patch_lang`, undone when it ends), and again on every call of a `@triton.jit` device
function inside it: each of those walks four namespaces with `inspect.getmembers` and is never undone. The lab's
kernels are built from device functions called once per program per tile (`kv_codec.load_tile`, `quantize_tile`,
`paged_attention._attend`), so the walk was about a third of an interpreted engine step: two prompts and two new
tokens of SmolLM2 over an int8 pool took 32.3 s and 21.2 s with one patch per launch, over a plain pool 16.2 and
12.4 s, the same tokens (7 December; torch's backend took 0.4 s).

`install` makes the launch's patch cover every module a device function can see through it (the interpreter looks
for `triton.language` and `triton.language.core` in the function's globals; `triton.language.standard`'s functions
see the second, the lab's kernels the first) and each device call's patch a no-op while that patch holds; both are
undone when the launch ends. What runs is unchanged: the same builtins are swapped in, once. Installed only where
the interpreter is the one this was checked on (`CHECKED`); elsewhere it runs as shipped, slower.
"""

from __future__ import annotations

import types

CHECKED = ("3.9.",)  # Triton releases whose interpreter patches as described above
_state = {"installed": False, "depth": 0}


class _LaunchPatch:
    """The launch's patch (the interpreter's own scope), counted so device calls inside it patch nothing."""

    def __init__(self, scope):
        self._scope = scope
        _state["depth"] += 1

    def restore(self) -> None:
        _state["depth"] -= 1
        self._scope.restore()


class _Nothing:
    def restore(self) -> None:
        pass


def install() -> bool:
    """Replace the interpreter's per-call patch with one per launch; True where installed (idempotent)."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    if _state["installed"]:
        return True
    if not triton.__version__.startswith(CHECKED) or not hasattr(interpreter, "_patch_lang"):
        return False
    shipped = interpreter._patch_lang
    both = types.SimpleNamespace(__globals__={"tl": tl, "core": tl.core})  # what any device function can see

    def patch_lang(fn):
        if _state["depth"]:  # a device call inside a launch: its modules are patched already
            return _Nothing()
        return _LaunchPatch(shipped(both))

    interpreter._patch_lang = patch_lang
    _state["installed"] = True
    return True
