"""The GPU pre-flight's kernel checks (issue 38 item 3): head_dim 16, 64 and 128, each 16-bit dtype, the split-KV
merge actually running, and SDPA (a peer) reported rather than fatal. Run here in the CPU interpreter (`lab` sets
TRITON_INTERPRET on a machine without CUDA) in float16, which the interpreter computes as the GPU's contract
asks; bfloat16 is not faithful in the interpreter, so its check waits for a GPU."""

import dataclasses
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "gpu"


def _preflight(monkeypatch):
    """gpu/gpu_preflight.py, importable from gpu/, checking float16 only (module docstring)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_preflight

    monkeypatch.setattr(gpu_preflight, "GPU_CHECK_DTYPES", ("float16",))
    return gpu_preflight


@pytest.fixture
def preflight(monkeypatch):
    return _preflight(monkeypatch)


def _on_cpu(preflight, monkeypatch, **changes):
    monkeypatch.setattr(preflight, "GPU_CHECK_SWEEP", dataclasses.replace(preflight.GPU_CHECK_SWEEP, device="cpu",
                                                                          **changes))


@pytest.fixture(scope="module")
def split_checks():
    """The pre-flight's check records with three splits (the interpreter's own default is one), run once for the
    tests that judge them (each run takes 9 s in the interpreter)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        preflight = _preflight(monkeypatch)
        _on_cpu(preflight, monkeypatch, decode_num_splits=3)
        return preflight.run_kernel_checks(dry_run=False)


def test_every_layout_and_the_split_kv_merge_are_checked(preflight, split_checks):
    result = preflight.judge_kernel_checks(split_checks)
    decode = [c for c in result["checks"] if c["kernel"] == "paged_decode_attention"]
    assert {(c["heads"], c["kv_format"]) for c in decode} == {
        ("tiny", "plain"), ("tiny", "fp8_e4m3"), ("tiny", "int8"), ("smollm2-like", "plain"), ("hd128", "plain")}
    assert {c["dtype"] for c in result["checks"]} == {"float16"} and all(c["ok"] for c in result["checks"])
    assert result["split_kv_merge_checks"] == len(decode) and result["peer_misses"] == []
    prefill = {c["heads"] for c in result["checks"] if c["kernel"] == "paged_prefill_attention"}
    assert prefill == {"tiny", "smollm2-like", "hd128"}


def test_a_check_set_that_never_splits_is_refused(preflight, monkeypatch):
    _on_cpu(preflight, monkeypatch)  # split count left to the wrapper: one split on a CPU
    with pytest.raises(RuntimeError, match="no decode check ran the split-KV merge"):
        preflight.kernel_checks(dry_run=False)


def test_sdpa_missing_its_tolerance_is_reported_not_fatal(preflight, split_checks):
    missed = lambda kernel: [dict(c, ok=False) if c["kernel"] == kernel else c for c in split_checks]  # noqa: E731
    result = preflight.judge_kernel_checks(missed("scaled_dot_product_attention"))
    assert len(result["peer_misses"]) == 3 and all(c["kernel"] == "scaled_dot_product_attention"
                                                   for c in result["peer_misses"])
    with pytest.raises(RuntimeError, match="3 kernel check"):  # the lab's own kernel still fails the pre-flight
        preflight.judge_kernel_checks(missed("paged_prefill_attention"))


def test_versions_say_what_differs_from_the_tested_ones_and_refuse_a_triton_too_old(preflight, monkeypatch):
    """The device image has torch 2.11 / Triton 3.6 where the tests run 2.13 / 3.9 (issue 38 item 9)."""
    import torch
    import triton

    same = preflight.versions(torch.device("cpu"))
    assert same["tested_with"] == preflight.TESTED_WITH and set(same) >= {"torch", "triton", "transformers"}
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    image = preflight.versions(torch.device("cpu"))
    assert image["differs"]["triton"] == {"found": "3.6.0", "tested": preflight.TESTED_WITH["triton"]}
    assert image["differs"]["torch"]["found"] == "2.11.0" and "spill registers" in image["note"]
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    with pytest.raises(RuntimeError, match="Triton 3.5.1 is older than 3.6"):
        preflight.versions(torch.device("cpu"))
