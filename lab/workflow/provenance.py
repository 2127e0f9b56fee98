"""Provenance for every result the lab writes: what code, what machine, what parameters, when."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

import lab
from lab.machine.hardware import cpu_model, cpu_signature

_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_info() -> dict | None:
    if not torch.cuda.is_available():
        return None
    driver = None
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return {"name": torch.cuda.get_device_name(), "driver": driver, "cuda": torch.version.cuda}


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def code_dirty() -> bool | None:
    """Whether a tracked file outside `results/` differs from the commit (None without git). Runs write into
    results/ (their directories, the index, the ledger): a run there is no change to the code that measures, so
    a reference run after another one in the same `lab run` is still a run of the committed code."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return None if status is None else bool(status)


def provenance(parameters: dict | None = None) -> dict:
    """Everything needed to trace a result back: code, packages, machine, parameters, start time."""
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": code_dirty(),
        "lab_version": lab.__version__,
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in ("torch", "transformers", "triton", "numpy")},
        "cpu": cpu_model(),
        "cpu_signature": cpu_signature(),  # family, model and matrix flags: the name alone hides AMX (hardware.py)
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu_info(),
        "parameters": {k: v for k, v in (parameters or {}).items() if not callable(v)},
    }
