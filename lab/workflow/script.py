"""`lab run --in-process`: papermill's contract without a kernel, on a notebook's jupytext twin.

Every study notebook `notebooks/NN_name.ipynb` has a "percent" twin `NN_name.py` kept in sync. The GPU
machine has torch and the study's libraries but not papermill, ipykernel, jupytext or nbformat, so this
runs the twin in this process with the standard library only, keeping what papermill promises a notebook:
the parameter names are checked against the `parameters` cell before anything runs, the injected values
are assigned right after that cell, the cells run in order in one namespace (`__main__`, with `display`)
with the notebooks folder as the working directory, and the run gets the same directory, environment and
failure record as a papermill run (`lab.workflow.notebook.run_environment`). Instead of the executed notebook,
the run directory keeps `script.log`: everything the run printed.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import re
import sys
import time
from pathlib import Path

from .notebook import check_parameter_names, resolve_notebook, run_environment
from .profile import CELLS_FILE, cell_table

_MARKER = "# %%"
_TEXT_CELL = re.compile(r"\[(markdown|md|raw)\]")  # jupytext's non-code cell types
_PARAMETERS_TAG = re.compile(r"""tags\s*=\s*\[[^\]]*["']parameters["']""")


class CellFailed(RuntimeError):
    """A cell raised (the original is its cause): as papermill's execution error, it fails this notebook
    only, whatever the cell raised, so `lab run all` goes on with the others."""


@dataclasses.dataclass(frozen=True)
class Cell:
    kind: str  # "code", "parameters" or "text" (markdown or raw: never executed)
    line: int  # the script's line number of the cell's first source line
    source: str


def resolve_script(name: str) -> Path:
    """A `.py` path as given, else the `.py` twin of the notebook `resolve_notebook` finds for `name`."""
    path = Path(name)
    if path.suffix == ".py" and path.exists():
        return path
    script = resolve_notebook(name).with_suffix(".py")
    if not script.exists():
        raise FileNotFoundError(f"{script} does not exist: the notebook has no jupytext .py twin")
    return script


def parse_script(text: str) -> list[Cell]:
    """The cells of a percent-format script. The text before the first marker (the jupytext header, a
    comment block) is a code cell too, as jupytext reads it: comments only, it does nothing."""
    cells, kind, start, lines = [], "code", 1, []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(_MARKER):
            cells.append(Cell(kind, start, "\n".join(lines)))
            kind = ("text" if _TEXT_CELL.search(line) else
                    "parameters" if _PARAMETERS_TAG.search(line) else "code")
            start, lines = number + 1, []
        else:
            lines.append(line)
    cells.append(Cell(kind, start, "\n".join(lines)))
    return cells


def parameter_names(cell: Cell) -> list[str]:
    """The names the parameters cell assigns at top level, in order (what papermill reads as parameters)."""
    names = []
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return list(dict.fromkeys(names))


def display(*objs) -> None:
    """The notebook's `display` outside a kernel. A table (anything with `to_string`: a DataFrame, a Series)
    is printed whole, as the log is the run's record and pandas' repr drops rows and columns; the rest goes
    to IPython's display where IPython is installed (it prints outside a shell), else is printed."""
    try:
        from IPython.display import display as ipython_display
    except ImportError:
        ipython_display = print
    for obj in objs:
        if hasattr(obj, "to_string"):
            print(obj.to_string())
        else:
            ipython_display(obj)


def run_cell(cell: Cell, path: Path, namespace: dict) -> None:
    """Run one cell as the script's own lines (tracebacks name `path` and the line), then display its last
    expression's value, as a notebook shows it."""
    # Blank lines before the source put every statement at its line in the script.
    tree = ast.parse("\n" * (cell.line - 1) + cell.source, str(path))
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    # dont_inherit: the cells must not get this module's `from __future__ import annotations`.
    exec(compile(tree, str(path), "exec", dont_inherit=True), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), str(path), "eval", dont_inherit=True), namespace)
        if value is not None:
            namespace["display"](value)


class _Tee:
    """A stdout that also writes to a log file (the other attributes are the real stdout's)."""

    def __init__(self, stream, log):
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._log.flush()
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _notebook_process(cwd: Path, log: Path):
    """What the kernel gives a notebook: the notebooks folder as working directory (papermill's `cwd`), a
    non-interactive matplotlib (Agg: no display on the GPU machine), and stdout kept, here in `log`."""
    import matplotlib

    matplotlib.use("Agg")
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with open(log, "w") as f, contextlib.redirect_stdout(_Tee(sys.stdout, f)):
            yield
    finally:
        os.chdir(previous)


def _close_figures() -> None:
    """The inline backend closes a cell's figures once shown; without it, a study's figures would pile up."""
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def run_script(name: str, params: dict | None = None, root: Path | None = None) -> Path:
    """Run the `.py` twin of notebook `name` (or a `.py` path) with `params` into a new run directory in this
    process; returns that directory. Names are checked before anything runs, as `run_notebook` checks them."""
    path = resolve_script(name)
    params = dict(params or {})
    cells = parse_script(path.read_text())
    found = [c for c in cells if c.kind == "parameters"]
    if not found:
        raise ValueError(f"{path} has no parameters cell (a cell marked '# %% tags=[\"parameters\"]')")
    check_parameter_names(path, params, declared=parameter_names(found[0]))
    with run_environment(path, params, root) as run_dir, _notebook_process(path.parent, run_dir / "script.log"):
        namespace = {"__name__": "__main__", "display": display}
        timed = []  # (cell, first line, seconds): papermill's record, kept here (`lab.workflow.profile`)
        for cell in cells:
            if cell.kind == "text":
                continue
            t = time.perf_counter()
            try:
                run_cell(cell, path, namespace)
            except Exception as e:
                raise CellFailed(f"the cell at line {cell.line} of {path.name} raised {type(e).__name__}: {e}") from e
            timed.append((len(timed), (cell.source.strip().splitlines() or [""])[0][:120], time.perf_counter() - t))
            _close_figures()
            if cell is found[0]:
                # papermill's injected cell comes right after the (first) parameters cell; the values are
                # assigned as they are, not written as `NAME = repr(value)`, whose text may not read back (inf).
                namespace.update(params)
        cell_table(timed).to_csv(run_dir / CELLS_FILE, index=False)
    return run_dir
