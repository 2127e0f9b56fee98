"""`make run`'s recipe: the benchmark runs even after a notebook failed, and then `make run` fails (issue 33).

Run with a stand-in `lab` in a stand-in venv (its install stamp newer than pyproject.toml and the Makefile, so
make does not set anything up), which records its calls and fails where told to.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_run(tmp_path: Path, fail: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    lab = venv / "bin" / "lab"
    lab.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$1 $2" in "{fail}") exit 3;; esac\nexit 0\n')
    lab.chmod(0o755)
    stamp = venv / ".installed"
    stamp.touch()
    newer = max((ROOT / "Makefile").stat().st_mtime, (ROOT / "pyproject.toml").stat().st_mtime) + 10
    os.utime(stamp, (newer, newer))
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "run", f"VENV={venv}"], capture_output=True, text=True,
                          timeout=60)
    return proc, calls.read_text().splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("fail", ["run all", "bench engine", "none"])
def test_make_run_benchmarks_after_a_failed_notebook_then_fails(tmp_path, fail):
    proc, calls = make_run(tmp_path, fail)
    # the benchmark and the report ran either way
    assert [c.split()[:2] for c in calls] == [["run", "all"], ["bench", "engine"], ["report", "--quick"]]
    assert "--preset quick" in calls[0] and "compiled" not in calls[1]  # make run skips the compiled variant
    assert (proc.returncode != 0) == (fail != "none"), proc.stderr
