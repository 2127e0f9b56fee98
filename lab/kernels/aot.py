"""Compile every kernel for a GPU without a GPU: Triton's ahead-of-time path, down to a cubin via ptxas.

The interpreter runs a kernel as Python over numpy, so it accepts constructs the GPU compiler rejects (and
never exercises bf16 or the compiler's type rules). Compiling each specialization the engine and benchmark
launch, for the architectures the lab targets, catches those on a CPU machine. It does not run anything:
correctness is the interpreter tests' job, speed the GPU benchmark's. It does read what ptxas allocated to each
compiled kernel (`cuobjdump --dump-resource-usage`, shipped with Triton): registers per thread and the stack
frame, where registers that do not fit are spilled (to local memory, an HBM round trip per spill). A launch
that spills fails the run: the attention kernels' warps and tile rows (`paged_attention.decode_warps`,
`PREFILL_WARPS`, `prefill_block_rows`) were chosen by it, at head_dim 128 (Llama) and 256 (Gemma).

    TRITON_INTERPRET=0 python -m lab.kernels.aot        # Hopper (sm_90) and Ampere (sm_80)

TRITON_INTERPRET must be 0 before Triton is first imported (`import lab` sets it to 1 on a machine without
CUDA unless it is set), so this runs as its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from lab.kv.format import KVCacheFormat

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
    """(name, kernel, pointer/float argument types, constexprs, num_warps) for each launch the lab makes: every
    KV format at head_dim 128, and the bf16 cache's attention at head_dim 256 too."""
    from . import paged_attention as pa
    from . import kv_write as rc
    from . import replay

    q = {"q_ptr": f"*{_MODEL}", "out_ptr": f"*{_MODEL}", "lse_ptr": "*fp32", "tables_ptr": "*i32",
         "lens_ptr": "*i32", "starts_ptr": "*i32", "qlens_ptr": "*i32", "qk_scale": "fp32"}
    for label, flags, fmt in _formats():
        types = {**q, **_cache_types(flags["KIND"], flags["PER_TOKEN"])}
        for head_dim in (128, 256) if fmt is None else (128,):
            for write_lse in (False, True):
                yield (f"decode {label} D={head_dim} splits={'n' if write_lse else 1}", pa._decode_kernel, types,
                       dict(GROUP=4, BLOCK_H=16, BLOCK_N=32, BLOCK_D=head_dim, **flags, PRECISION="tf32",
                            WRITE_LSE=write_lse), pa.decode_warps(flags["PER_TOKEN"]))
            rows = pa.prefill_block_rows(head_dim, flags)
            yield (f"prefill {label} D={head_dim}", pa._prefill_kernel, types,
                   dict(GROUP=4, QUERIES=rows // 4, BLOCK_R=rows, BLOCK_N=32, BLOCK_D=head_dim, **flags,
                        PRECISION="tf32"), pa.PREFILL_WARPS)
        write = {"k_ptr": f"*{_MODEL}", "v_ptr": f"*{_MODEL}", "slot_ptr": "*i64",
                 **_cache_types(flags["KIND"], flags["PER_TOKEN"])}
        yield (f"reshape_and_cache {label}", rc._reshape_and_cache_kernel, write,
               dict(BLOCK_T=16, BLOCK_D=128, **flags, **fp8_limits(fmt)), 4)
    yield ("merge", pa._merge_kernel, {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": f"*{_MODEL}"},
           dict(BLOCK_S=8, BLOCK_D=128), 4)
    for bias in (False, True):
        types = {n: f"*{_MODEL}" for n in ("x_ptr", "w_ptr", "b_ptr", "k_out", "v_out")}
        types.update(pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", slot_ptr="*i64")
        yield (f"replay bias={bias}", replay._replay_kernel, types,
               dict(HAS_BIAS=bias, BLOCK_M=32, BLOCK_K=64, BLOCK_HALF=64, PRECISION="tf32"), 4)


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers per thread and stack bytes per thread ptxas gave a compiled kernel (cuobjdump's REG, STACK)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True)
    fields = dict(item.split(":", 1) for line in out.stdout.splitlines() if "REG:" in line for item in line.split())
    return {"registers": int(fields["REG"]), "stack_bytes": int(fields["STACK"])}


def compile_all(capability: int) -> list[dict]:
    """Compile every specialization for sm_<capability>; returns each one's name, seconds, registers and stack
    bytes. Raises on the first failure, naming the specialization."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", capability, 32)
    done = []
    for name, kernel, types, constexprs, num_warps in specializations():
        signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in kernel.arg_names}
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={(kernel.arg_names.index(a),): v for a, v in constexprs.items()})
        start = time.perf_counter()
        try:
            compiled = triton.compile(source, target=target, options={"num_warps": num_warps})
        except Exception as e:
            raise RuntimeError(f"{name} does not compile for sm_{capability}: {e}") from e
        done.append({"name": name, "seconds": time.perf_counter() - start, "num_warps": num_warps,
                     **resource_usage(compiled.asm["cubin"])})
    return done


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "0":
        print("set TRITON_INTERPRET=0: the kernels must be defined for the compiler, not the interpreter",
              file=sys.stderr)
        return 2
    spilled = []
    for capability in ARCHITECTURES:
        compiled = compile_all(capability)
        print(f"sm_{capability}: {len(compiled)} specializations compiled in "
              f"{sum(c['seconds'] for c in compiled):.1f} s, at most {max(c['registers'] for c in compiled)} "
              f"registers per thread")
        spilled += [f"sm_{capability} {c['name']}: {c['stack_bytes']} stack bytes, {c['registers']} registers, "
                    f"{c['num_warps']} warps" for c in compiled if c["stack_bytes"]]
    for line in spilled:
        print(f"spills: {line}", file=sys.stderr)
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
