"""`lab run`: execute a study notebook through papermill into its own results directory.

Parameter names are checked against the notebook's `parameters` cell before anything runs (papermill
itself would silently add an unknown name as a new variable); values are checked by the study's
parameter dataclass inside the notebook, before its heavy work. The executed notebook is stored in
the run directory with image outputs stripped (the PNGs are saved beside it), so committed reference
runs stay small. `run_environment` is the part of a run that does not depend on how the notebook is executed:
`lab run --in-process` (`lab.workflow.script`) shares it.
"""

from __future__ import annotations

import ast
import contextlib
import html
import json
import os
import shutil
import traceback
from pathlib import Path

from .atomic import write_atomic
from .index import INCOMPLETE, write_index
from .profile import CELLS_FILE, cells_from_notebook, finish_sampling
from .run import EXPLICIT_ENV, new_run_id, refusal, results_root

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"


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


def check_parameter_names(path: Path, params: dict, declared=None) -> None:
    """Refuse a name the parameters cell does not assign; `declared` defaults to papermill's reading of it."""
    declared = declared_parameters(path) if declared is None else declared
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {path.stem}; its parameters are: "
                         f"{', '.join(declared)}")


WIDGET_VIEW, WIDGET_STATE = "application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json"


def _progress_text(states: dict, model_id: str) -> str | None:
    """A tqdm widget's last state as the text bar it stands for ("mask cost: 100%|##########| 6/6 [00:09<00:00]"):
    tqdm.notebook draws an HBox of a label, a progress bar and a counter; nbclient saves their final values in the
    notebook's widget state. None when the state is not such a box."""
    box = states.get(model_id, {}).get("state", {})
    parts = [states.get(str(c).removeprefix("IPY_MODEL_"), {}).get("state", {}) for c in box.get("children", [])]
    bars = [p for p in parts if "max" in p and "value" in p]
    labels = [p.get("value", "") for p in parts if "max" not in p and isinstance(p.get("value"), str)]
    if len(bars) != 1 or len(labels) != 2:
        return None
    bar = bars[0]
    done = bar["value"] / bar["max"] if bar.get("max") else 0.0
    filled = int(round(10 * done))
    # tqdm's labels are HTML with figure spaces: its left one ends with the percentage, its right one the counts
    left, right = (html.unescape(t).replace("\u2007", " ").strip() for t in labels)
    return f"{left}|{'#' * filled}{' ' * (10 - filled)}| {right}"


def tidy_outputs(notebook_path: Path) -> None:
    """An executed notebook as a reader should see it: its figures kept inline as PNG (other image types, larger
    and redundant, dropped), and each progress bar replaced by its final state as text, since the widget itself
    does not render outside a live kernel and its saved text is the bar's first state ("0%| 0/N")."""
    import nbformat

    nb = nbformat.read(notebook_path, as_version=4)
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for mime in [m for m in data if m.startswith("image/") and m != "image/png"]:
                del data[mime]
            view = data.pop(WIDGET_VIEW, None)
            if view is not None:
                text = _progress_text(states, view.get("model_id", ""))
                if text:  # a progress bar; other widgets (a study's panels) keep their own text
                    data["text/plain"] = text
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, notebook_path)


class RunDirUnwritable(OSError):
    """A run's directory could not be written to the end: the run is left incomplete (`INCOMPLETE` stays in it)."""


@contextlib.contextmanager
def run_environment(path: Path, params: dict, root: Path | None = None):
    """A new run directory for the notebook at `path` (yielded), with what a notebook reads while it runs:
    `LAB_RUN_DIR` (where `start_run` writes), `LAB_RESULTS_DIR` and the injected names in `EXPLICIT_ENV`.
    The variables are restored afterwards, a failure is recorded in metrics.json (then re-raised) and the
    results index is refreshed either way. `lab run` executes through papermill (`run_notebook`) or in this
    process (`lab.workflow.script`); both go through here, so a run looks the same whichever executed it.

    The directory holds `INCOMPLETE` (`lab.workflow.index`) until the run has written everything: a run killed
    midway, or whose directory stopped being writable (a full disk, a read-only mount, permissions), never looks
    complete; where even the failure cannot be recorded, `RunDirUnwritable` names the directory and the cause."""
    # Absolute once, here: both executors change into the notebooks folder, where a relative path (the GPU
    # suite's `--results-dir results/gpu`, a relative LAB_RESULTS_DIR) would point somewhere else.
    root = (Path(root) if root else results_root()).absolute()
    run_dir = root / path.stem / new_run_id()
    try:
        run_dir.mkdir(parents=True)
        (run_dir / INCOMPLETE).write_text("this run has not finished writing its results (lab run)\n")
    except OSError as e:
        raise RunDirUnwritable(f"the results directory {root} cannot be written ({e.strerror or e}): nothing "
                               f"was run") from e
    previous = {k: os.environ.get(k) for k in ("LAB_RUN_DIR", "LAB_RESULTS_DIR", EXPLICIT_ENV)}
    os.environ["LAB_RUN_DIR"], os.environ["LAB_RESULTS_DIR"] = str(run_dir), str(root)
    os.environ[EXPLICIT_ENV] = json.dumps(sorted(params))  # these beat the notebook's preset
    try:
        yield run_dir
        try:
            (run_dir / INCOMPLETE).unlink()
        except OSError as e:
            raise RunDirUnwritable(f"the run directory {run_dir} could not be written at the end of the run "
                                   f"({e.strerror or e}): the run stays marked incomplete ({INCOMPLETE})") from e
    except RunDirUnwritable:
        raise
    except Exception as e:
        if refusal(e) is not None:  # refused before any work (`ModelRefused`): no run to keep; `lab run` says why
            shutil.rmtree(run_dir)
            raise
        # The whole traceback: the index shows its last line (the exception), and in-process runs keep the
        # script's file and line (papermill's error text ends with the cell's own traceback).
        error = "".join(traceback.format_exception(e))[-2000:]
        e.run_dir = run_dir  # a sweep links a failed point to the directory it made
        try:
            write_atomic(run_dir / "metrics.json", json.dumps({"status": "failed", "error": error}, indent=2))
        except OSError as unwritable:  # the notebook's own error is most likely this one: say both, plainly
            last = error.strip().splitlines()[-1] if error.strip() else type(e).__name__
            why = unwritable.strerror or str(unwritable)
            failure = RunDirUnwritable(
                f"the run directory {run_dir} stopped being writable during the run ({why}): the notebook failed "
                f"({last}) and not even its failure could be recorded; the run stays marked incomplete "
                f"({INCOMPLETE}), so no listing, ledger or report takes it as a result")
            failure.run_dir = run_dir
            raise failure from e
        raise
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            finish_sampling(run_dir)  # a run executed here that failed before `Run.finish`: its profile still
            write_index(root)
        except OSError as e:  # a derived view: say so, and let the run's own outcome stand
            print(f"lab run: the results index under {root} could not be refreshed ({e.strerror or e})")


def run_notebook(name: str, params: dict | None = None, root: Path | None = None, log_output: bool = False,
                 cell_timeout: float | None = None) -> Path:
    """Execute one notebook with `params` into a new run directory; returns that directory. `cell_timeout`:
    seconds a cell may take before nbclient gives up on it (none by default: reference cells run for an hour)."""
    import papermill

    from .kernel_client import PollingKernelManager

    path = resolve_notebook(name)
    params = dict(params or {})
    check_parameter_names(path, params)
    with run_environment(path, params, root) as run_dir:
        out = run_dir / path.name
        try:
            # papermill writes a tuple as the string of its repr; a list it writes as a list literal.
            injected = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
            papermill.execute_notebook(str(path), str(out), parameters=injected, cwd=str(path.parent),
                                       kernel_name="python3", progress_bar=False, log_output=log_output,
                                       execution_timeout=cell_timeout, kernel_manager_class=PollingKernelManager)
        finally:
            if out.exists():
                tidy_outputs(out)
        if out.exists():  # papermill's per-cell durations (an executor that writes no notebook has none)
            cells_from_notebook(out).to_csv(run_dir / CELLS_FILE, index=False)
    return run_dir
