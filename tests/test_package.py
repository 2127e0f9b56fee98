"""Packaging: the kernels are `lab.kernels`, and the checkout never shadows a package transformers imports."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_checkout_on_sys_path_does_not_shadow_hugging_faces_kernels():
    """`python -m pytest` (or any `python -c`) from the root puts the checkout first on sys.path. A top-level
    kernels/ folder there was found by transformers 5.25 as Hugging Face's `kernels` package and imported for its
    hub integration (ImportError: cannot import name 'CUDAProperties' from 'kernels'), failing every test that
    builds a transformers model: CI at 5550721."""
    code = ("import importlib.util, pathlib, lab.kernels; "
            "assert pathlib.Path(lab.kernels.__file__).parent == pathlib.Path('lab/kernels').resolve(); "
            "spec = importlib.util.find_spec('kernels'); "
            "print('top-level kernels:', None if spec is None else spec.origin)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # A top-level `kernels` may only be Hugging Face's installed package, never this repository's folder.
    assert "top-level kernels: None" in out.stdout or "site-packages" in out.stdout, out.stdout


def test_transformers_hub_integration_imports_from_the_root():
    """What failed in CI, directly: transformers' kernel-hub module imports with the checkout on sys.path."""
    code = "import transformers.integrations.hub_kernels"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_every_subpackage_is_installed():
    """pyproject's package search (in pyproject it finds namespace folders too, so the data-only presets/ is one)
    takes every folder under lab/ with an __init__.py, the kernels among them, and the presets' JSON."""
    import tomllib

    from setuptools import find_namespace_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    installed = {p for p in find_namespace_packages(str(ROOT), include=include) if "__pycache__" not in p}
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lab").rglob("__init__.py")}
    assert found <= installed and {"lab.kernels", "lab.models.presets"} <= installed
    assert all(p in found or not any((ROOT / p.replace(".", "/")).glob("*.py")) for p in installed), installed - found
