"""`lab run`: execute a study notebook through papermill into its own results directory.

Parameter names are checked against the notebook's `parameters` cell before anything runs (papermill
itself would silently add an unknown name as a new variable); values are checked by the study's
parameter dataclass inside the notebook, before its heavy work. The executed notebook is stored in
the run directory with image outputs stripped (the PNGs are saved beside it), so committed reference
runs stay small.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from .results_index import write_index
from .runs import EXPLICIT_ENV, new_run_id, results_root

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def study_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def resolve_notebook(name: str) -> Path:
    path = Path(name)
    if path.suffix == ".ipynb" and path.exists():
        return path
    candidate = NOTEBOOKS_DIR / f"{path.stem}.ipynb"
    if candidate.exists():
        return candidate
    names = ", ".join(p.stem for p in study_notebooks())
    raise ValueError(f"no notebook {name!r}; the study notebooks are: {names} (or 'all')")


def parse_value(text: str):
    """`-p NAME VALUE` values: Python literals (True, 3, 0.5, 'x', [1, 2]) or else a plain string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def declared_parameters(path: Path) -> dict:
    import papermill

    return papermill.inspect_notebook(str(path))


def check_parameter_names(path: Path, params: dict) -> None:
    declared = declared_parameters(path)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {path.stem}; its parameters are: "
                         f"{', '.join(declared)}")


def strip_images(notebook_path: Path) -> None:
    import nbformat

    nb = nbformat.read(notebook_path, as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for mime in [m for m in data if m.startswith("image/")]:
                del data[mime]
                data.setdefault("text/plain", "[image saved as PNG in the run directory]")
            if "application/vnd.jupyter.widget-view+json" in data:
                del data["application/vnd.jupyter.widget-view+json"]
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, notebook_path)


def run_notebook(name: str, params: dict | None = None, root: Path | None = None, log_output: bool = False) -> Path:
    """Execute one notebook with `params` into a new run directory; returns that directory."""
    import papermill

    path = resolve_notebook(name)
    params = dict(params or {})
    check_parameter_names(path, params)
    root = Path(root) if root else results_root()
    run_dir = root / path.stem / new_run_id()
    run_dir.mkdir(parents=True)
    out = run_dir / path.name
    previous = {k: os.environ.get(k) for k in ("LAB_RUN_DIR", "LAB_RESULTS_DIR", EXPLICIT_ENV)}
    os.environ["LAB_RUN_DIR"], os.environ["LAB_RESULTS_DIR"] = str(run_dir), str(root)
    os.environ[EXPLICIT_ENV] = json.dumps(sorted(params))  # these beat the notebook's preset
    try:
        # papermill writes a tuple as the string of its repr; a list it writes as a list literal.
        injected = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
        papermill.execute_notebook(str(path), str(out), parameters=injected, cwd=str(path.parent),
                                   kernel_name="python3", progress_bar=False, log_output=log_output)
    except Exception as e:
        (run_dir / "metrics.json").write_text(json.dumps({"status": "failed", "error": str(e)[-2000:]}, indent=2))
        raise
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if out.exists():
            strip_images(out)
        write_index(root)
    return run_dir
