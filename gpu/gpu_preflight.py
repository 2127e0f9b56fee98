"""Pre-flight for a GPU run: in under a minute, what must hold before the suite's minutes are worth spending.

A session is lent 15 minutes of GPU time in all, so a suite that dies at minute four on an import or a device
mismatch costs the whole loan. The checks, in order, each timed:

1. versions: torch, its CUDA, Triton, transformers, the device's name and memory, and what differs from the
   versions the CPU tests pass with (reported; a Triton older than the oldest checked is refused);
2. `lab.kernels` imports, and is compiled, not interpreted (`TRITON_INTERPRET` unset on a GPU);
3. each kernel against its float32 reference on small shapes, in bfloat16 and float16, for head_dim 16, 64
   and 128 (`CHECK_LAYOUTS`): decode with the split-KV merge running and for every cache format, and prefill
   (the checks of `gpu/kernels_gpu.py`, with its tolerance in units of the dtype's last place); SDPA, the
   prefill's peer, is reported when it misses, never fatal;
4. the engine on both attention backends gives the same greedy tokens (`random:tiny`, in float32);
5. a seeded sampled request draws the same tokens twice, on the engine's device (a CPU generator beside CUDA
   probabilities made every seeded request fail).

`--dry-run` runs the same on the CPU (float32, Triton's interpreter): the tests run it. Writes
`preflight.json` to `--out`; exits 1 if a check fails, so `gpu/gpu_suite.sh` stops there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from kernels_gpu_sweep import DRY_RUN_SWEEP, Heads
from kernels_gpu_timing import Bench
from lab.workflow.provenance import provenance
from lab.bench.caselog import CaseLog
from lab.workflow.run import json_safe

# On CUDA the wrapper picks the split count (what the engine gets); 600 tokens make it split (>= 3 of 256).
GPU_CHECK_SWEEP = dataclasses.replace(DRY_RUN_SWEEP, device="cuda", dtype="bfloat16", decode_num_splits=None,
                                      decode_check_contexts=(600, 37, 5), tolerance_ulps=4, flush_bytes=1024**2)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 10], [1, 2, 3, 4, 5, 1, 2, 3]]


# What the CPU test suite passes with here (the Makefile pins torch; triton and transformers as installed then),
# and the oldest Triton whose compiled kernels were checked here: Triton 3.6.0 (the device image's) installed
# beside torch 2.13 compiles all 38 launches for sm_90 and sm_80, but the replay kernel and the int8 per-token
# prefill at head_dim 128 spill registers there (docs/gpu.md, "Versions"), and its interpreter cannot run them.
TESTED_WITH = {"torch": "2.13.0", "triton": "3.9.0", "transformers": "5.24.0"}
MIN_TRITON = (3, 6)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:2] if x.isdigit())


def versions(device: torch.device) -> dict:
    """The versions found, what differs from `TESTED_WITH` (said, not fatal), and a refusal below MIN_TRITON."""
    import transformers
    import triton

    found = {"torch": torch.__version__.split("+")[0], "triton": triton.__version__,
             "transformers": transformers.__version__}
    out = {**found, "cuda": torch.version.cuda, "triton_interpret": os.environ.get("TRITON_INTERPRET"),
           "tested_with": TESTED_WITH,
           "differs": {k: {"found": v, "tested": TESTED_WITH[k]} for k, v in found.items() if v != TESTED_WITH[k]}}
    if out["differs"].get("triton") and _release(triton.__version__) < (3, 9):
        out["note"] = ("Triton before 3.9: the replay kernel and the int8 per-token prefill at head_dim 128 spill "
                       "registers (checked with 3.6.0); their timings may suffer, their results do not")
    if _release(triton.__version__) < MIN_TRITON:
        raise RuntimeError(f"Triton {triton.__version__} is older than {'.'.join(map(str, MIN_TRITON))}, the "
                           f"oldest whose compile of lab.kernels was checked; install triton>=3.6")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out |= {"device": props.name, "memory_GiB": props.total_memory / 2**30,
                "capability": f"{props.major}.{props.minor}"}
    return out


def kernels_compiled(dry_run: bool) -> dict:
    import lab.kernels.paged_attention  # noqa: F401  (the import is the check)

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if interpreted != dry_run:
        raise RuntimeError(f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}: the kernels would be "
                           f"{'interpreted on a GPU' if interpreted else 'compiled in a dry run'}")
    return {"interpreted": interpreted}


# The head layouts every check covers: the sweep's tiny one, SmolLM2's (head_dim 64, 3 query heads per KV head)
# and a head_dim-128 one (Llama 3's); the lab's kernels specialise on head_dim, so each is its own compile.
CHECK_LAYOUTS = (DRY_RUN_SWEEP.heads, Heads("smollm2-like", 9, 3, 64), Heads("hd128", 8, 2, 128))
GPU_CHECK_DTYPES = ("bfloat16", "float16")  # the serving dtypes; a dry run checks float32


def kernel_checks(dry_run: bool) -> dict:
    """Decode and prefill against their float32 references for each layout and each 16-bit dtype (float32 in a
    dry run), decode with the split-KV merge running (a 600-token context: on CUDA the default split count is
    1 up to 256 tokens); the quantized cache formats on the tiny layout, judged by `judge_kernel_checks`."""
    return judge_kernel_checks(run_kernel_checks(dry_run))


def run_kernel_checks(dry_run: bool) -> list[dict]:
    """Each check's record (`kernel_checks`), unjudged."""
    from kernels_gpu_decode import check_decode
    from kernels_gpu_prefill import check_prefill

    base = DRY_RUN_SWEEP if dry_run else GPU_CHECK_SWEEP
    checks = []
    for dtype in (("float32",) if dry_run else GPU_CHECK_DTYPES):
        for heads in CHECK_LAYOUTS:
            bench = Bench.create(dataclasses.replace(base, dtype=dtype, heads=heads))
            formats = ("plain", "fp8_e4m3", "int8") if heads == base.heads else ("plain",)
            checks += [dict(check_decode(bench, heads, fmt), dtype=dtype) for fmt in formats]
            checks += [dict(c, dtype=dtype) for c in check_prefill(bench)]
    return checks


def judge_kernel_checks(checks: list[dict]) -> dict:
    """Only the lab's kernels can fail the pre-flight: SDPA, the prefill's peer, is reported when it misses the
    tolerance, as a fact about the peer; a check set in which no decode ran the split-KV merge is refused."""
    merged = [c for c in checks if c["kernel"] == "paged_decode_attention" and c["shape"]["num_splits"] > 1]
    if not merged:
        raise RuntimeError("no decode check ran the split-KV merge (every check took one split)")
    failed = [c for c in checks if not c["ok"] and c["kernel"] != "scaled_dot_product_attention"]
    if failed:
        raise RuntimeError(f"{len(failed)} kernel check(s) out of tolerance: {failed}")
    peer_misses = [c for c in checks if not c["ok"] and c["kernel"] == "scaled_dot_product_attention"]
    return {"checks": checks, "split_kv_merge_checks": len(merged), "peer_misses": peer_misses}


def _engine(device: torch.device, backend: str):
    from lab.engine import LLM
    from lab.models import load_model

    model, _ = load_model("random:tiny", dtype=torch.float32, device=device)
    return LLM(model, num_kv_blocks=32, max_model_len=128, attention_backend=backend)


def engine_backends(device: torch.device) -> dict:
    from lab.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {b: [o.token_ids for o in _engine(device, b).generate(PROMPTS, params)] for b in ("torch", "triton")}
    if tokens["torch"] != tokens["triton"]:
        raise RuntimeError(f"greedy tokens differ between the backends: {tokens}")
    return {"tokens": tokens["torch"]}


def seeded_sampling(device: torch.device) -> dict:
    from lab.engine import SamplingParams

    llm = _engine(device, "torch")
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=8, ignore_eos=True)
    draws = [[o.token_ids for o in llm.generate(PROMPTS, params)] for _ in range(2)]
    if draws[0] != draws[1]:
        raise RuntimeError(f"one seed gave two different draws: {draws}")
    return {"tokens": draws[0], "device": str(llm.device)}


def run(dry_run: bool, log: CaseLog | None = None) -> dict:
    device = torch.device("cpu" if dry_run else "cuda")
    checks = [("versions", lambda: versions(device)), ("kernels_compiled", lambda: kernels_compiled(dry_run)),
              ("kernel_checks", lambda: kernel_checks(dry_run)), ("engine_backends", lambda: engine_backends(device)),
              ("seeded_sampling", lambda: seeded_sampling(device))]
    results, started = [], time.perf_counter()
    for name, check in checks:
        t = time.perf_counter()
        try:
            detail, ok = check(), True
        except Exception as e:  # every check runs and is reported, whatever an earlier one did
            detail, ok = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}, False
        results.append({"check": name, "ok": ok, "seconds": time.perf_counter() - t, **detail})
        if log is not None:
            log.write("check", results[-1])  # kept if the suite stops this step before preflight.json
        print(f"{'ok  ' if ok else 'FAIL'} {name:<17} {results[-1]['seconds']:6.1f} s"
              + ("" if ok else f"  {detail['error'][:300]}"))
    return {"dry_run": dry_run, "ok": all(r["ok"] for r in results), "seconds": time.perf_counter() - started,
            "provenance": provenance({"dry_run": dry_run}), "checks": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the same checks on the CPU, in Triton's interpreter")
    parser.add_argument("--out", type=Path, default=Path("results/gpu"), help="folder for preflight.json")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import, which reads it once
    elif not torch.cuda.is_available():
        print("gpu/gpu_preflight.py checks a GPU, and CUDA is not available: use --dry-run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args.dry_run, CaseLog(args.out / "preflight.jsonl"))
    (args.out / "preflight.json").write_text(json.dumps(json_safe(result), indent=1, allow_nan=False) + "\n")
    print(f"pre-flight {'passed' if result['ok'] else 'FAILED'} in {result['seconds']:.0f} s: "
          f"{args.out / 'preflight.json'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
