"""The notebook convention: every study notebook runs headless at PRESET="smoke", records provenance,
keeps its jupytext pair in sync, and rejects bad parameters before heavy work.

The smoke runs are made on a user's model (issue 51): a small random-weight 16-bit Qwen3 passed as MODEL, so one run
per notebook checks the convention, the switch (every model the run loaded is that checkpoint) and a family other
than the embedded model's Llama (its q/k norms and explicit head_dim). The
notebooks' runs on the embedded model are `make run`'s (its quick preset; CI runs both), so `make test` does not
run them again (issue 52)."""

import json
from pathlib import Path

import jupytext
import nbformat
import pandas as pd
import pytest
import torch

from lab.workflow.notebook import NOTEBOOKS_DIR, declared_parameters, run_notebook, study_notebooks
from lab.workflow.profile import CELLS_FILE, FUNCTIONS_FILE
from lab.cli import main as lab_main
from lab.workflow.run import MODELS_LOADED, foreign_loads, start_run

NOTEBOOKS = [p.stem for p in study_notebooks()]
REPO = Path(__file__).resolve().parents[1]
PROVENANCE_FIELDS = ["created", "git_commit", "git_dirty", "python", "packages", "cpu", "cpu_cores", "gpu",
                     "parameters", "notebook", "run_id"]


def test_there_are_study_notebooks():
    assert "00_engine_tour" in NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_smoke_mode_with_provenance_on_the_model_given(name, tmp_path, monkeypatch, user16):
    """Smoke sizes with INTERACTIVE on, so the widget cells run too: each builds and displays its panels, and
    (`lab.workflow.widgets` under $LAB_WIDGET_CHECK) moves every control once to a non-default value through the
    ipywidgets API; the output must redraw, differently, without an error. MODEL is a 16-bit checkpoint, and the
    run loads that model and no other."""
    from lab.workflow.widgets import CHECK_ENV, CHECKS_FILE

    monkeypatch.setenv(CHECK_ENV, "1")
    # A smoke cell takes seconds: past 300 s a cell is stuck, and the test fails instead of holding CI (a missed
    # kernel reply once held cells for exactly this timeout: `lab.workflow.kernel_client`).
    run_dir = run_notebook(name, {"PRESET": "smoke", "INTERACTIVE": True, "MODEL": str(user16)}, root=tmp_path,
                           cell_timeout=300)
    params = json.loads((run_dir / "params.json").read_text())
    assert all(f in params for f in PROVENANCE_FIELDS)
    assert params["parameters"]["PRESET"] == "smoke" and params["notebook"] == name
    assert params["parameters"]["MODEL"] == str(user16)
    assert (run_dir / MODELS_LOADED).exists(), f"{name} loaded no model at all"
    assert foreign_loads(run_dir, user16) == [], name
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["duration_s"] > 0
    assert (run_dir / f"{name}.ipynb").exists() and list(run_dir.glob("*.png")) and list(run_dir.glob("*.csv"))
    # where its time went (issue 52): papermill's per-cell record, and the kernel's sampled functions
    cells, functions = (pd.read_csv(run_dir / f) for f in (CELLS_FILE, FUNCTIONS_FILE))
    assert len(cells) == sum(c.cell_type == "code" for c in nbformat.read(run_dir / f"{name}.ipynb", 4).cells)
    assert cells["seconds"].sum() > 0 and not functions.empty, name
    executed = nbformat.read(run_dir / f"{name}.ipynb", as_version=4)
    # every figure the run saves as a file is inline too (issue 35): at least as many inline PNGs as saved ones,
    # outside the widget cells; progress bars are text in their final state, not the widget's first ("0%")
    main = [c for c in executed.cells if c.cell_type == "code" and not c.source.startswith("if INTERACTIVE")]
    inline = [o["data"]["image/png"] for c in main for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(inline) >= len(list(run_dir.glob("*.png"))) and all(len(png) > 1000 for png in inline), name
    # every saved figure keeps the plot standard's mechanical rules (docs/plotting.md, `lab.figures.check`)
    figures = json.loads((run_dir / "figure_checks.json").read_text())
    assert set(figures) == {p.stem for p in run_dir.glob("*.png")}, name
    assert not any(figures.values()), {k: v for k, v in figures.items() if v}
    texts = [o.get("data", {}).get("text/plain", "") for c in main for o in c.get("outputs", [])]
    assert not any(t.lstrip().startswith("0%|") or "widget-view" in t for t in texts), name
    widget_cells = [c for c in executed.cells if c.cell_type == "code" and c.source.startswith("if INTERACTIVE")]
    assert widget_cells, "every study notebook has a widget cell"
    for cell in widget_cells:
        shown = [o.get("data", {}).get("text/plain", "") for o in cell.outputs if o.get("output_type") == "display_data"]
        assert any(t.startswith(("VBox(", "HBox(", "interactive(")) for t in shown), (name, shown)
    checks = json.loads((run_dir / CHECKS_FILE).read_text())
    assert checks and all(p["controls"] for p in checks), checks
    for p in checks:
        for c in p["controls"]:
            assert c["error"] is None and c["redraws"] >= 1 and c["changed"] and c["from"] != c["to"], (name, p, c)
    assert name in (tmp_path / "README.md").read_text()
    if name == "02_quantization_accuracy":
        _ledger_decides_the_weight_accuracy_rows(run_dir, tmp_path)
    if name == "04_replay_break_even":  # Qwen3's keys pass a k_norm: HCache is not timed, and the run says why
        summary = pd.read_csv(run_dir / "measured_summary.csv")
        assert summary["hcache_speedup_over_recompute_median"].isna().all()
        assert summary["hcache_not_measured"].str.contains("k_norm").all()


def _ledger_decides_the_weight_accuracy_rows(run_dir, tmp_path):
    """Notebook 02 on 16-bit weights: its detector says so, and `lab claims --runs` decides the weight-accuracy rows
    that the committed ledger, measured on the already-4-bit embedded model, leaves "not checkable here"."""
    assert json.loads((run_dir / "metrics.json").read_text())["weights16"] is True
    # the finding is the measurement on these weights, not the embedded model's "already 4-bit" (which read
    # "already None-bit" here before it had a 16-bit case)
    from lab.studies.findings import sentence

    said = sentence("02_quantization_accuracy", run_dir)
    assert said.startswith("On these 16-bit weights the best 4-bit method") and "None" not in said, said
    # random weights pass none of the sensitive items: AWQ cannot be "steadier" than GPTQ from that floor (it read
    # "wrong" from 0 - 0 pts before the floor reached this row)
    assert pd.read_csv(run_dir / "grid.csv")["pass_all"].iloc[0] == 0
    table = pd.read_csv(run_dir / "claims.csv").set_index("claim")
    steadier = table.loc[table.index.str.startswith("AWQ is steadier than GPTQ")].iloc[0]
    assert steadier["verdict"] == "not checkable here" and "passes none of the sensitive items" in steadier["note"]
    ledger = tmp_path / "ledger"
    assert lab_main(["claims", "--runs", str(tmp_path), "--out", str(ledger)]) == 0
    yours = pd.read_csv(ledger / "CLAIMS.csv", dtype=str).fillna("").set_index("id")
    committed = pd.read_csv(REPO / "results" / "CLAIMS.csv", dtype=str).fillna("").set_index("id")
    rows = committed.index[(committed["scope"] == "weight-accuracy")
                           & (committed["notebook"] == "02_quantization_accuracy")]
    assert len(rows) >= 3  # 003-15, 003-18, 003-19
    # the embedded model's weights are 4-bit already: the committed rows stay undecided by weight precision...
    assert set(committed.loc[rows, "verdict"]) == {"not checkable here"}
    assert committed.loc[rows, "undecided by"].str.startswith("weight precision").all()
    # ... and the 16-bit checkpoint decides them by measurement, through the same rules and scopes
    measured = {"holds", "wrong", "wrong by rounding", "not distinguishable"}
    assert set(yours.loc[rows, "verdict"]) <= measured, yours.loc[rows, ["verdict", "undecided by"]]
    beside = pd.read_csv(ledger / "BESIDE.csv", dtype=str).set_index("id")
    assert set(beside.loc[rows, "stands"]) == {"decided by your runs"}
    site = tmp_path / "site"
    assert lab_main(["report", "--out", str(site), "--beside", str(ledger)]) == 0
    html = (site / "index.html").read_text()
    assert "Your runs beside the committed ledger" in html and all(r in html for r in rows)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameters_cell_comes_first_and_pair_is_in_sync(name):
    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert {"PRESET", "INTERACTIVE"} <= set(declared_parameters(NOTEBOOKS_DIR / f"{name}.ipynb"))
    assert not any(c.get("outputs") for c in code), "commit notebooks without outputs"
    # an empty code cell is never run, so JupyterLab's "Run All" leaves it unnumbered (the browser test waits for
    # every cell to be numbered, and timed out on one)
    assert all(c.source.strip() for c in code), f"{name}: an empty code cell"
    twin = jupytext.read(NOTEBOOKS_DIR / f"{name}.py")
    assert [(c.cell_type, c.source) for c in twin.cells] == [(c.cell_type, c.source) for c in nb.cells], \
        "the .ipynb and its .py twin differ: run `make sync-notebooks`"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_assignment_in_the_parameters_cell_is_a_parameter(name):
    """papermill skips a line it cannot parse (it did, on a comment holding '; x = y'), and the name then
    silently stops being a parameter; every assigned name must come back from its parser."""
    import ast

    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)]
    assert list(declared_parameters(NOTEBOOKS_DIR / f"{name}.ipynb")) == assigned


def test_unknown_parameter_is_rejected_before_running(tmp_path):
    with pytest.raises(ValueError, match="NOT_A_PARAMETER"):
        run_notebook("00_engine_tour", {"NOT_A_PARAMETER": 1}, root=tmp_path)
    assert not list(tmp_path.glob("*/*"))


def test_bad_value_stops_the_run_with_a_message(tmp_path):
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="NUM_REQUESTS"):
        run_notebook("00_engine_tour", {"PRESET": "smoke", "NUM_REQUESTS": 0}, root=tmp_path)


def test_unknown_notebook_names_the_available_ones():
    with pytest.raises(ValueError, match="00_engine_tour"):
        run_notebook("99_nope")


def test_runs_never_collide_or_overwrite(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("LAB_RUN_DIR", raising=False)
    a, b = start_run("xx_test", {"A": 1}), start_run("xx_test", {"A": 1})
    assert a.dir != b.dir and a.dir.parent == b.dir.parent
    monkeypatch.setenv("LAB_RUN_DIR", str(a.dir))
    with pytest.raises(FileExistsError):
        start_run("xx_test", {"A": 2})
    assert json.loads((a.dir / "params.json").read_text())["parameters"] == {"A": 1}


def test_results_index_lists_latest_run_and_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("LAB_RUN_DIR", raising=False)
    first = start_run("yy_test", {})
    first.save_metrics(answer=41)
    first.finish()
    second = start_run("yy_test", {})
    second.save_metrics(answer=42, claims={"fp8 is safe": "no"})
    second.finish()
    quick = start_run("yy_test", {"PRESET": "quick"})
    quick.save_metrics(answer=7)
    quick.finish()
    failed = start_run("zz_test", {})
    (failed.dir / "metrics.json").write_text(json.dumps({"status": "failed", "error": "Traceback\n  a | b\nValueError: x"}))
    from lab.workflow.index import write_index

    index = write_index(tmp_path).read_text()
    assert second.dir.name in index and "answer: 42" in index and "answer: 41" not in index
    assert "claims.fp8 is safe: no" in index
    assert "| 2 |" in index  # two reference runs of that notebook
    # The quick run has its own row, marked, and does not hide the latest reference run.
    quick_row = next(line for line in index.splitlines() if quick.dir.name in line)
    assert "**quick** (not a reference result)" in quick_row and "answer: 7" in quick_row
    # A failed run's traceback stays in its row: its last line only, so the table keeps its shape.
    row = next(line for line in index.splitlines() if line.startswith("| zz_test"))
    assert "error: ValueError: x" in row and "Traceback" not in index


def test_lab_run_cli_prints_the_run_directory(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "lab.cli", "run", "00_engine_tour", "-p", "NOT_A_PARAMETER", "1",
                          "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "NOT_A_PARAMETER" in out.stderr
    assert not list(Path(tmp_path).glob("*/*")), "a rejected run must not leave a run directory"


def test_preset_values_yield_to_explicit_parameters_and_params_json_records_them(tmp_path, monkeypatch, capsys):
    from lab.workflow.run import EXPLICIT_ENV, params_from_namespace, start_run
    from lab.studies.spec_acceptance import SpecParams

    monkeypatch.delenv(EXPLICIT_ENV, raising=False)
    defaults = SpecParams()  # the reference values
    # Edited in the parameters cell (differs from the reference): explicit, the preset leaves it alone.
    params = params_from_namespace(SpecParams, {"PRESET": "smoke", "MAX_TOKENS": 16, "K": defaults.K})
    assert params.MAX_TOKENS == 16 and params.K == SpecParams.PRESETS["smoke"]["K"]
    assert "MAX_TOKENS" not in params.preset_values and params.preset_values["K"] == 2
    assert "preset 'smoke' sets" in capsys.readouterr().out
    # Injected by `lab run` with the reference's own value: still explicit, so the preset does not replace it.
    monkeypatch.setenv(EXPLICIT_ENV, json.dumps(["K", "PRESET"]))
    assert params_from_namespace(SpecParams, {"PRESET": "smoke", "K": defaults.K}).K == defaults.K
    monkeypatch.delenv(EXPLICIT_ENV)
    assert params_from_namespace(SpecParams, {"PRESET": "reference"}).MAX_TOKENS == defaults.MAX_TOKENS
    assert params_from_namespace(SpecParams, {}).PRESET == "quick"  # the default preset
    with pytest.raises(ValueError, match="PRESET='fast'"):
        params_from_namespace(SpecParams, {"PRESET": "fast"})
    monkeypatch.setenv("LAB_RUN_DIR", str(tmp_path / "run"))
    record = json.loads((start_run("05_speculative_acceptance", params).dir / "params.json").read_text())
    assert record["parameters"]["MAX_TOKENS"] == 16 and record["preset_values"]["K"] == 2


def _study_class(name: str):
    """The parameter dataclass a notebook builds (`params_from_namespace(study.X, globals())`)."""
    import importlib
    import re

    source = (NOTEBOOKS_DIR / f"{name}.py").read_text()
    cls = re.search(r"params_from_namespace\((\w+)\.(\w+), globals\(\)\)", source)
    # `from lab.studies import pkg as study` (a package that re-exports) or `from lab.studies.pkg import measure as
    # study, ...` (a package's module)
    module = cls and (re.search(rf"from (lab\.studies) import (\w+) as {cls[1]}\b", source)
                      or re.search(rf"from (lab\.studies\.\w+) import (?:[\w ,]*?, )?(\w+) as {cls[1]}\b", source))
    assert module, name
    return getattr(importlib.import_module(f"{module[1]}.{module[2]}"), cls[2])


@pytest.mark.usefixtures("gpu_memory")  # the gpu presets' 8B models are checked against a GPU's memory
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameters_cell_holds_the_reference_values_and_every_preset_names_real_parameters(name):
    """A value that differs from the dataclass default counts as explicit and beats the preset, so a parameters
    cell that drifted from its dataclass would silently switch the presets off for that parameter."""
    import dataclasses

    cls = _study_class(name)
    namespace = {}
    exec(next(c for c in nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4).cells
              if c.cell_type == "code").source, namespace)
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    assert set(declared_parameters(NOTEBOOKS_DIR / f"{name}.ipynb")) == set(fields), name
    drift = {k: (namespace[k], v) for k, v in fields.items()
             if (tuple(namespace[k]) if isinstance(namespace[k], list) else namespace[k]) != v}
    assert not drift, drift
    from lab.workflow.run import PRESETS, params_from_namespace

    for preset in PRESETS:  # builds and validates each preset's values (an unknown name in a table is refused)
        if preset == "gpu" and not torch.cuda.is_available():
            # every notebook has a gpu preset; without CUDA it is refused by name, and its values still validate
            with pytest.raises(ValueError, match="CUDA is not available"):
                params_from_namespace(cls, {**namespace, "PRESET": preset})
            cls(**{**{k: namespace[k] for k in fields}, **cls.PRESETS["gpu"], "DEVICE": "cpu", "PRESET": "gpu"})
            continue
        assert params_from_namespace(cls, {**namespace, "PRESET": preset}).PRESET == preset


def test_lab_run_all_says_what_runs_with_its_last_duration_and_how_long_each_took(tmp_path, monkeypatch, capsys):
    import argparse

    import lab.workflow.notebook as rn
    from lab.cli import runs

    done = []

    def fake_run(name, params, root=None, log_output=False):
        if name == "02_quantization_accuracy":
            raise RuntimeError("a cell failed")
        done.append(name)
        d = Path(root) / name / f"2026{len(done):02d}"
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"parameters": {"PRESET": params.get("PRESET", "quick")}}))
        (d / "metrics.json").write_text(json.dumps({"duration_s": 90.0}))
        return d

    monkeypatch.setattr(rn, "run_notebook", fake_run)
    args = argparse.Namespace(param=[], notebook="all", results_dir=str(tmp_path), log_output=False, preset=None,
                              model=None, in_process=False)
    assert runs._run(args) == 1  # one notebook failed; the others ran
    assert runs._run(argparse.Namespace(**{**vars(args), "notebook": "00_engine_tour"})) == 0
    out = capsys.readouterr()
    n = len(rn.study_notebooks())
    assert f"[1/{n}] running 00_engine_tour ..." in out.out and "00_engine_tour done in" in out.out
    assert "02_quantization_accuracy failed in" in out.out and "total" in out.out
    assert "[1/1] running 00_engine_tour (its last run took 1.5 min) ..." in out.out
    assert "02_quantization_accuracy FAILED: RuntimeError: a cell failed" in out.err


def test_lab_run_all_model_reaches_every_notebook_and_a_refusal_is_said_not_failed(tmp_path, monkeypatch, capsys):
    """`lab run all --model M` gives every notebook MODEL=M; one that refuses it up front (`ModelRefused`, here
    through the in-process runner's wrapping) is listed with its reason, the others run, and the run succeeds."""
    import argparse

    import lab.workflow.notebook as rn
    from lab.cli import runs
    from lab.workflow.run import ModelRefused
    from lab.workflow.script import CellFailed

    given = {}

    def fake_run(name, params, root=None, log_output=False):
        given[name] = params["MODEL"]
        if name == "07_structured_output":
            raise CellFailed("the cell at line 60 raised ModelRefused") from ModelRefused("no tokenizer: grammars")
        d = Path(root) / name / "20260101"
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"parameters": {"PRESET": "smoke", "MODEL": params["MODEL"]}}))
        (d / "metrics.json").write_text(json.dumps({"duration_s": 1.0}))
        return d

    monkeypatch.setattr(rn, "run_notebook", fake_run)
    args = argparse.Namespace(param=[], notebook="all", results_dir=str(tmp_path), log_output=False, preset="smoke",
                              model="/my/model", in_process=False)
    assert runs._run(args) == 0
    assert set(given) == {p.stem for p in rn.study_notebooks()} and set(given.values()) == {"/my/model"}
    # a relative path is made absolute: the notebooks run in notebooks/, not where `lab run` was called
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert runs._run(argparse.Namespace(**{**vars(args), "model": "mine", "results_dir": str(tmp_path / "again")})) == 0
    assert set(given.values()) == {str(tmp_path / "mine")}
    out = capsys.readouterr().out
    assert "07_structured_output refused its model: no tokenizer: grammars" in out
    assert "refused: 1 of 10 notebooks could not run on MODEL='/my/model'" in out
