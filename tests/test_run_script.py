"""`lab run --in-process`: a notebook's jupytext .py twin run without papermill or a kernel (lab.workflow.script), on
small synthetic percent scripts, plus a check that every study notebook's twin parses as papermill reads it."""

import json
import os
import sys
import traceback
from pathlib import Path

import pytest

from lab.workflow.notebook import declared_parameters, study_notebooks
from lab.workflow.script import CellFailed, display, parameter_names, parse_script, run_script
from lab.workflow.run import EXPLICIT_ENV

HEADER = """# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
# ---
"""
PARAMETERS = """# %% tags=["parameters"]
A = 1
B = (1, 2)
NAME = "x"
"""
# A cell that records what the script saw, in the run directory.
RECORD = """# %%
import json
import os
import sys
from pathlib import Path

import matplotlib

Path(os.environ["LAB_RUN_DIR"], "seen.json").write_text(json.dumps({
    "A": A, "B": list(B), "B_type": type(B).__name__, "NAME": NAME, "cwd": os.getcwd(), "name": __name__,
    "explicit": json.loads(os.environ["LAB_EXPLICIT_PARAMS"]), "backend": matplotlib.get_backend().lower()}))
print("hello from the script")
"""


@pytest.fixture
def results(tmp_path, monkeypatch):
    """LAB_RESULTS_DIR in tmp_path (the scripts go to tmp_path/notebooks), the other variables unset."""
    root = tmp_path / "results"
    monkeypatch.setenv("LAB_RESULTS_DIR", str(root))
    monkeypatch.delenv("LAB_RUN_DIR", raising=False)
    monkeypatch.delenv(EXPLICIT_ENV, raising=False)
    return root


def write_script(tmp_path: Path, *cells: str, name: str = "study") -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(HEADER + "\n" + "\n".join(cells))
    return path


def seen(run_dir: Path) -> dict:
    return json.loads((run_dir / "seen.json").read_text())


def test_injected_values_follow_the_parameters_cell_in_the_notebooks_folder(tmp_path, results, capsys):
    path = write_script(tmp_path, PARAMETERS, RECORD)
    run_dir = run_script(str(path), {"A": 5, "B": (3, 4)})
    assert run_dir.parent == results / "study"
    record = seen(run_dir)
    assert record["A"] == 5 and record["B"] == [3, 4] and record["B_type"] == "tuple" and record["NAME"] == "x"
    assert record["cwd"] == str(path.parent) and Path.cwd() != path.parent  # the notebooks folder, then restored
    assert record["name"] == "__main__" and record["explicit"] == ["A", "B"] and record["backend"] == "agg"
    assert "hello from the script" in capsys.readouterr().out  # a tee: the terminal and the log
    assert "hello from the script" in (run_dir / "script.log").read_text()
    assert "LAB_RUN_DIR" not in os.environ and EXPLICIT_ENV not in os.environ
    assert (results / "README.md").exists()  # the results index was refreshed


def test_markdown_cells_are_not_executed(tmp_path, results):
    markdown = '# %% [markdown]\n# # A title\nraise RuntimeError("a markdown cell ran")\n'
    run_dir = run_script(str(write_script(tmp_path, markdown, PARAMETERS, markdown, RECORD)))
    assert seen(run_dir)["A"] == 1


def test_unknown_parameter_is_refused_before_any_cell_runs(tmp_path, results):
    first = '# %%\nfrom pathlib import Path\nPath("side_effect").touch()\n'
    path = write_script(tmp_path, first, PARAMETERS, RECORD)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['C'\] for study; its parameters are: A, B, NAME"):
        run_script(str(path), {"A": 2, "C": 3})
    assert not (path.parent / "side_effect").exists() and not (results / "study").exists()


def test_a_script_without_a_parameters_cell_is_refused(tmp_path, results):
    with pytest.raises(ValueError, match="has no parameters cell"):
        run_script(str(write_script(tmp_path, "# %%\nA = 1\n", RECORD)))
    assert not (results / "study").exists()


def test_a_failing_cell_is_recorded_and_raised_at_its_line_in_the_script(tmp_path, results, monkeypatch):
    monkeypatch.setenv("LAB_RUN_DIR", "before")
    path = write_script(tmp_path, PARAMETERS, "# %%\nx = 1\ny = x / 0\nz = 2\n")
    line = path.read_text().splitlines().index("y = x / 0") + 1
    cwd = Path.cwd()
    with pytest.raises(CellFailed, match=f"line {line - 1} of {path.name} raised ZeroDivisionError") as raised:
        run_script(str(path), {"A": 3})
    where = traceback.extract_tb(raised.value.__cause__.__traceback__)[-1]
    assert (where.filename, where.lineno, where.line) == (str(path), line, "y = x / 0")
    (run_dir,) = (results / "study").iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "failed" and metrics["error"].rstrip().endswith("ZeroDivisionError: division by zero")
    assert "ZeroDivisionError: division by zero\n" in metrics["error"]  # the cause, then the cell that raised
    assert f'File "{path}", line {line}' in metrics["error"]
    assert os.environ["LAB_RUN_DIR"] == "before" and os.environ["LAB_RESULTS_DIR"] == str(results)
    assert EXPLICIT_ENV not in os.environ and Path.cwd() == cwd


def test_display_shows_a_whole_dataframe_and_a_cells_last_expression(tmp_path, results, capsys, monkeypatch):
    cell = ('# %%\nimport pandas as pd\n\ndf = pd.DataFrame({"alpha": range(100), "beta": 0.5})\ndisplay(df)\n'
            'df["beta"].sum()\n')
    run_dir = run_script(str(write_script(tmp_path, PARAMETERS, cell)))
    out = capsys.readouterr().out
    assert "alpha" in out and "\n50 " in out  # every row (pandas' repr would drop the middle ones)
    assert out.rstrip().endswith("50.0")  # the last expression's value, as a notebook shows it
    assert out == (run_dir / "script.log").read_text()
    monkeypatch.setitem(sys.modules, "IPython.display", None)  # no IPython: printed
    display("plain text")
    assert capsys.readouterr().out == "plain text\n"


def test_lab_run_in_process_runs_the_script(tmp_path, results, capsys):
    from lab.cli import main

    path = write_script(tmp_path, PARAMETERS, RECORD)
    assert main(["run", str(path), "--in-process", "-p", "A", "7", "--results-dir", str(results)]) == 0
    (run_dir,) = (results / "study").iterdir()
    assert str(run_dir) in capsys.readouterr().out and seen(run_dir)["A"] == 7
    assert main(["run", str(path), "--in-process", "-p", "C", "1", "--results-dir", str(results)]) == 2
    assert "unknown parameter(s) ['C']" in capsys.readouterr().err
    # A cell's own ValueError (a bad parameter value) fails that notebook only, as under papermill: exit 1
    # with the notebook named, where a refusal before the run (the unknown name above) is a usage error (2).
    bad = write_script(tmp_path, PARAMETERS, "# %%\nraise ValueError('A is out of range')\n")
    assert main(["run", str(bad), "--in-process", "--results-dir", str(results)]) == 1
    assert "FAILED: CellFailed" in capsys.readouterr().err


def test_parse_script_finds_the_cells_and_their_lines():
    cells = parse_script(HEADER + "\n" + PARAMETERS + "\n# %% [markdown]\n# text\n\n# %%\nprint(A)\n")
    assert [c.kind for c in cells] == ["code", "parameters", "text", "code"]
    assert cells[1].line == HEADER.count("\n") + 3 and cells[3].source.strip() == "print(A)"
    assert parameter_names(cells[1]) == ["A", "B", "NAME"]


@pytest.mark.parametrize("notebook", study_notebooks(), ids=lambda p: p.stem)
def test_every_study_notebooks_twin_declares_papermills_parameters(notebook):
    cells = parse_script(notebook.with_suffix(".py").read_text())
    (parameters,) = [c for c in cells if c.kind == "parameters"]
    assert parameter_names(parameters) == list(declared_parameters(notebook))


def test_lab_run_all_goes_on_past_a_failure_and_names_its_cell(tmp_path, results, capsys, monkeypatch):
    """`lab run all` runs every notebook after a failed one, exits 1, and its summary names each failure with
    the cell and the error's last line (issue 33: 02's crash was one line in the middle of a 30-minute log)."""
    import lab.workflow.notebook
    from lab.cli import main

    monkeypatch.setattr(lab.workflow.notebook, "NOTEBOOKS_DIR", tmp_path / "notebooks")
    bad = "# %%\nraise ValueError(\"first line\\n'yerr' must not contain negative values\")\n"
    for name, cell in (("01_ok", RECORD), ("02_bad", bad), ("03_ok", RECORD)):
        write_script(tmp_path, PARAMETERS, cell, name=name).with_suffix(".ipynb").write_text("{}")
    script = (tmp_path / "notebooks" / "02_bad.py").read_text().splitlines()
    line = next(i for i, text in enumerate(script, start=1) if text.startswith("raise ValueError"))
    assert main(["run", "all", "--in-process", "--results-dir", str(results)]) == 1
    err = capsys.readouterr().err
    assert sorted(p.name for p in results.iterdir() if p.is_dir()) == ["01_ok", "02_bad", "03_ok"]
    assert seen(next((results / "03_ok").iterdir()))["A"] == 1  # the notebook after the failure ran
    summary = err[err.index("failed: 1 of 3 notebooks"):]
    assert f"02_bad: cell at line {line} of 02_bad.py: ValueError: 'yerr' must not contain negative values" in summary


def test_describe_failure_names_papermills_cell():
    from papermill.exceptions import PapermillExecutionError

    from lab.cli.runs import describe_failure

    e = PapermillExecutionError(14, 9, "plot(...)", "ValueError", "'yerr' must not contain negative values", [])
    assert describe_failure(e) == "cell 14 (In [9]): ValueError: 'yerr' must not contain negative values"
    assert describe_failure(RuntimeError("kernel died\nDeadKernelError: exit 137")) == \
        "RuntimeError: DeadKernelError: exit 137"


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_relative_results_directory_is_resolved_where_it_was_given(tmp_path, results, monkeypatch, how):
    """`--results-dir results/gpu` (the GPU suite's default) or a relative LAB_RESULTS_DIR: the run changes into
    the notebooks folder, so the path is taken relative to where the user stood, once, before it does."""
    path = write_script(tmp_path, PARAMETERS, RECORD)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    if how == "environment":
        monkeypatch.setenv("LAB_RESULTS_DIR", "rel/results")
    run_dir = run_script(str(path), root=Path("rel/results") if how == "argument" else None)
    assert run_dir.is_absolute() and run_dir.parent == work / "rel" / "results" / "study"
    assert seen(run_dir)["A"] == 1 and (run_dir / "script.log").exists()
    assert (work / "rel" / "results" / "README.md").exists()
