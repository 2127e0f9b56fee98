"""gpu/kernels_gpu.py: its CPU dry run (the same code path as on a GPU, tiny shapes in Triton's interpreter)
writes a complete JSON and a plot, every kernel passes its correctness check, and without a GPU the real run
refuses with a pointer to --dry-run. Run as subprocesses: the dry run must set TRITON_INTERPRET before triton's
first import, which this test process may already have done."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "gpu" / "kernels_gpu.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def _positive_finite(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_dry_run_writes_checked_results(tmp_path):
    proc = _run("--dry-run", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "kernels_gpu.json").read_text())
    assert {"provenance", "device", "peers", "checks", "decode", "prefill", "targets"} <= result.keys()
    assert result["dry_run"] is True and "not GPU figures" in result["note"]
    assert result["provenance"]["parameters"]["dry_run"] is True

    # Every kernel (each decode cache format and head layout, prefill) and the SDPA peer agree with the
    # float32 reference.
    kernels = {(c["kernel"], c["heads"], c["kv_format"]) for c in result["checks"]}
    assert {k for k, _, _ in kernels} == {"paged_decode_attention", "paged_prefill_attention",
                                          "scaled_dot_product_attention"}
    assert {f for k, _, f in kernels if k == "paged_decode_attention"} == {"plain", "fp8_e4m3", "int8"}
    for check in result["checks"]:
        assert check["ok"] and check["max_abs_error"] < 1e-4, check

    peers = result["peers"]
    assert _positive_finite(peers["copy"]["bytes_per_s"]) and _positive_finite(peers["matmul"]["flops_per_s"])
    decode = result["decode"]
    assert decode["points"] and decode["skipped"], "the dry run has points past its cache cap, to be skipped"
    assert all(s["cache_bytes"] > s["cap_bytes"] for s in decode["skipped"])
    assert any(p["num_splits"] > 1 for p in decode["points"]), "the split-KV merge path should run"
    for p in decode["points"] + [decode["floor"]]:
        assert all(_positive_finite(p[k]) for k in ("ms", "bytes_per_s", "fraction_of_copy")), p
        assert p["bytes"] > p["batch"] * p["context"] * 2 * p["n_kv"] * p["head_dim"]  # K/V at least
    kinds = {p["kind"] for p in result["prefill"]["points"]}
    assert kinds == {"fresh", "chunk"}
    for p in result["prefill"]["points"] + [result["prefill"]["floor"]]:
        assert all(_positive_finite(p[k]) for k in ("triton_ms", "triton_flops_per_s", "sdpa_flops_per_s",
                                                    "ratio_vs_sdpa", "triton_fraction_of_matmul")), p

    # Verdicts are computed from the points, not asserted: the dry run's are meaningless but must be consistent.
    targets = result["targets"]
    for name, key in (("decode", "fraction_of_copy"), ("prefill", "ratio_vs_sdpa")):
        verdict = targets[name]
        assert verdict["points"] > 0
        assert verdict["met"] == (verdict[f"worst_{key}"] >= verdict["threshold"])
    assert targets["checks"]["all_within_tolerance"] is True

    png = tmp_path / "kernels_gpu.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "correctness" in proc.stdout and "vs SDPA" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the real run would start")
def test_without_gpu_points_to_dry_run(tmp_path):
    proc = _run("--out", str(tmp_path))
    assert proc.returncode != 0
    assert "--dry-run" in proc.stderr and "GPU" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_a_check_tolerance_follows_the_dtype_resolution_at_the_outputs_magnitude(monkeypatch):
    """A fixed 2e-2 is below bfloat16's half-step for outputs from 8 up: a correctly rounded kernel failed."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from kernels_gpu_caches import check_record
    from kernels_gpu_sweep import GPU_SWEEP, Heads

    heads = Heads("h", 4, 2, 16)
    ref = torch.linspace(8.0, 15.9, 256)
    out = ref.bfloat16()  # correctly rounded: error up to half of bf16's 2^-4 step from 8 up
    assert float((out.float() - ref).abs().max()) > 2e-2
    ok = check_record("k", heads, "plain", {}, out, ref, GPU_SWEEP.tolerance_ulps)
    assert ok["ok"] and ok["tolerance"] == pytest.approx(GPU_SWEEP.tolerance_ulps * 2 ** -7 * 15.9)
    wrong = check_record("k", heads, "plain", {}, (ref + 0.5).bfloat16(), ref, GPU_SWEEP.tolerance_ulps)
    assert not wrong["ok"]
    nan = check_record("k", heads, "plain", {}, torch.full_like(out, float("nan")), ref, GPU_SWEEP.tolerance_ulps)
    assert not nan["ok"]


def test_a_nan_costs_its_value_not_the_result_file():
    from lab.workflow.run import json_safe

    result = {"checks": [{"max_abs_error": float("nan"), "ok": False}], "peers": (1.5, float("inf")), "n": 3}
    text = json.dumps(json_safe(result), allow_nan=False)
    assert json.loads(text) == {"checks": [{"max_abs_error": None, "ok": False}], "peers": [1.5, None], "n": 3}
