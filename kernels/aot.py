"""Compile every kernel for a GPU without a GPU: Triton's ahead-of-time path, down to a cubin via ptxas.

The interpreter runs a kernel as Python over numpy, so it accepts constructs the GPU compiler rejects (and
never exercises bf16 or the compiler's type rules). Compiling each specialization the engine and benchmark
launch, for the architectures the lab targets, catches those on a CPU machine. It does not run anything:
correctness is the interpreter tests' job, speed the GPU benchmark's.

    TRITON_INTERPRET=0 python -m lab.kernels.aot        # Hopper (sm_90) and Ampere (sm_80)

TRITON_INTERPRET must be 0 before Triton is first imported (`import lab` sets it to 1 on a machine without
CUDA unless it is set), so this runs as its own process.
"""

from __future__ import annotations

import os
import sys
import time

from lab.quant.kv import KVCacheFormat

from .kv_codec import PLAIN, fp8_limits, kernel_flags

ARCHITECTURES = (90, 80)
_MODEL = "bf16"  # the engine's dtype on CUDA


def _cache_types(kind: int, per_token: bool) -> dict:
    """Pointer types of the pool arguments: model dtype or bytes; fp16 per-token scales, fp32 static ones."""
    data = f"*{_MODEL}" if kind == PLAIN else "*u8"
    meta = "*fp16" if per_token else "*fp32"
    return dict(kc_ptr=data, vc_ptr=data, ks_ptr=meta, vs_ptr=meta, kz_ptr="*fp16", vz_ptr="*fp16")


def _formats():
    """(label, constexpr flags) of every KV format the kernels read."""
    yield "plain", kernel_flags(None), None  # bf16 (2 bytes)
    for fmt in (KVCacheFormat("int8"), KVCacheFormat("int4"), KVCacheFormat("int2"), KVCacheFormat("int8", "per-head"),
                KVCacheFormat("fp8_e4m3"), KVCacheFormat("fp8_e4m3", "per-token"), KVCacheFormat("fp8_e5m2", "per-token")):
        yield f"{fmt.dtype}/{fmt.granularity}", kernel_flags(fmt), fmt


def specializations():
    """(name, kernel, pointer/float argument types, constexprs) for each launch the lab makes."""
    from . import paged_attention as pa
    from . import kv_write as rc
    from . import replay

    q = {"q_ptr": f"*{_MODEL}", "out_ptr": f"*{_MODEL}", "lse_ptr": "*fp32", "tables_ptr": "*i32",
         "lens_ptr": "*i32", "starts_ptr": "*i32", "qlens_ptr": "*i32", "qk_scale": "fp32"}
    for label, flags, fmt in _formats():
        types = {**q, **_cache_types(flags["KIND"], flags["PER_TOKEN"])}
        for write_lse in (False, True):
            yield (f"decode {label} splits={'n' if write_lse else 1}", pa._decode_kernel, types,
                   dict(GROUP=4, BLOCK_H=16, BLOCK_N=32, BLOCK_D=128, **flags, PRECISION="tf32", WRITE_LSE=write_lse))
        yield (f"prefill {label}", pa._prefill_kernel, types,
               dict(GROUP=3, QUERIES=21, BLOCK_R=64, BLOCK_N=32, BLOCK_D=64, **flags, PRECISION="tf32"))
        write = {"k_ptr": f"*{_MODEL}", "v_ptr": f"*{_MODEL}", "slot_ptr": "*i64",
                 **_cache_types(flags["KIND"], flags["PER_TOKEN"])}
        yield (f"reshape_and_cache {label}", rc._reshape_and_cache_kernel, write,
               dict(BLOCK_T=16, BLOCK_D=128, **flags, **fp8_limits(fmt)))
    yield ("merge", pa._merge_kernel, {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": f"*{_MODEL}"},
           dict(BLOCK_S=8, BLOCK_D=128))
    for bias in (False, True):
        types = {n: f"*{_MODEL}" for n in ("x_ptr", "w_ptr", "b_ptr", "k_out", "v_out")}
        types.update(pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", slot_ptr="*i64")
        yield (f"replay bias={bias}", replay._replay_kernel, types,
               dict(HAS_BIAS=bias, BLOCK_M=32, BLOCK_K=64, BLOCK_HALF=64, PRECISION="tf32"))


def compile_all(capability: int) -> list[tuple[str, float]]:
    """Compile every specialization for sm_<capability>; returns (name, seconds). Raises on the first failure,
    naming the specialization."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", capability, 32)
    done = []
    for name, kernel, types, constexprs in specializations():
        signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in kernel.arg_names}
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={(kernel.arg_names.index(a),): v for a, v in constexprs.items()})
        start = time.perf_counter()
        try:
            triton.compile(source, target=target)
        except Exception as e:
            raise RuntimeError(f"{name} does not compile for sm_{capability}: {e}") from e
        done.append((name, time.perf_counter() - start))
    return done


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "0":
        print("set TRITON_INTERPRET=0: the kernels must be defined for the compiler, not the interpreter",
              file=sys.stderr)
        return 2
    for capability in ARCHITECTURES:
        compiled = compile_all(capability)
        print(f"sm_{capability}: {len(compiled)} specializations compiled in {sum(s for _, s in compiled):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
