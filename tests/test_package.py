"""Packaging: `kernels/` is importable as `lab.kernels` and never as a top-level `kernels`."""

import subprocess
import sys


def test_kernels_import_as_lab_kernels_only(tmp_path):
    code = ("import importlib.util, lab.kernels, pathlib; "
            "assert pathlib.Path(lab.kernels.__file__).parent.name == 'kernels'; "
            "spec = importlib.util.find_spec('kernels'); "
            "print('top-level kernels:', None if spec is None else spec.origin)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # A top-level `kernels` may only be Hugging Face's package, never this repository's folder.
    assert "top-level kernels: None" in out.stdout or "site-packages" in out.stdout


def test_every_subpackage_is_listed_for_installation():
    """pyproject lists packages explicitly (for the kernels/ mapping): a new subpackage must be added there."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "lab").rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
