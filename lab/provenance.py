"""Provenance for every result the lab writes: what code, what machine, what parameters, when."""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path

import torch

import lab

_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(parameters: dict | None = None) -> dict:
    import transformers

    device = "cuda:" + torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "lab_version": lab.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": f"{platform.machine()}, {platform.processor() or platform.platform()}",
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "parameters": {k: v for k, v in (parameters or {}).items() if not callable(v)},
    }
