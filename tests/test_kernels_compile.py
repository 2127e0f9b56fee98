"""Every kernel specialization the lab launches compiles for Hopper (sm_90) and Ampere (sm_80) with Triton's
ahead-of-time compiler, on this CPU machine (`lab.kernels.aot`): the interpreter tests cannot catch what only
the GPU compiler rejects (it found Ampere's missing e4m3 type). And none spills registers to the stack (it found
spills in the prefill at Triton's default 4 warps and in the per-token quantized decode; see
`lab.kernels.paged_attention.decode_warps`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_and_sm80(tmp_path):
    # A fresh cache: every specialization is compiled here, none taken from an earlier run's cache.
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "lab.kernels.aot"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-3000:]  # 1: a launch spills
    for arch in ("sm_90", "sm_80"):
        assert f"{arch}: 38 specializations compiled" in proc.stdout
    assert "spills" not in proc.stderr
