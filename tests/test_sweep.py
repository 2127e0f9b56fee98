"""`lab sweep`: grid parsing and validation, then real sweeps of 00_engine_tour at the smoke preset: on a local
Ray, rerun (points done are skipped), and with one failing point (recorded, the others finish, exit status 1)."""

import json

import pandas as pd
import pytest

from lab.cli import main
from lab.workflow.sweep import SweepSpec, build_spec, choose_metric, parse_grid_values, plot_metric, split_top_level

NOTEBOOK = "00_engine_tour"


def small(user16) -> list[str]:
    """The sweeps that run points do so on conftest's small random 16-bit checkpoint (with the embedded model's
    tokenizer, which the tour's text requests need): what they check is the sweep (its table, plot, runs, reruns
    and failures). A point on the embedded model took a third longer from the command line (23 against 17.5 s),
    its load and forward passes being checked by the notebook's own smoke test."""
    return ["-p", "MODEL", str(user16)]


def test_values_split_at_top_level_commas_only():
    assert split_top_level("2, 3") == ["2", "3"]
    assert split_top_level("(1,2),(3,4)") == ["(1,2)", "(3,4)"]
    assert split_top_level("[1, [2, 3]],{'a': 1, 'b': 2}") == ["[1, [2, 3]]", "{'a': 1, 'b': 2}"]
    assert split_top_level("'a,b',\"c,(d\",e") == ["'a,b'", '"c,(d"', "e"]
    assert parse_grid_values("(1,2),(3,4)") == [(1, 2), (3, 4)]
    assert parse_grid_values("4,0.5,True,rtn,'x,y'") == [4, 0.5, True, "rtn", "x,y"]
    assert parse_grid_values("[16, 64]") == [[16, 64]]  # one value, a list: the parameter is fixed
    with pytest.raises(ValueError, match="empty value"):
        parse_grid_values("1,,2")


def test_the_grid_is_every_combination_and_its_id_is_stable():
    spec = build_spec(NOTEBOOK, [("NUM_REQUESTS", "2,3"), ("MAX_TOKENS", "4,8"), ("BLOCK_SIZE", "16")], "smoke")
    assert spec.swept == ["NUM_REQUESTS", "MAX_TOKENS"]
    points = spec.points()
    assert len(points) == 4 and points[0] == {"NUM_REQUESTS": 2, "MAX_TOKENS": 4, "BLOCK_SIZE": 16, "PRESET": "smoke"}
    reordered = build_spec(NOTEBOOK, [("MAX_TOKENS", "4,8"), ("BLOCK_SIZE", "16"), ("NUM_REQUESTS", "2,3")], "smoke")
    assert reordered.sweep_id() == spec.sweep_id()  # the same points: the same directory
    assert build_spec(NOTEBOOK, [("NUM_REQUESTS", "2,3"), ("MAX_TOKENS", "4,8"), ("BLOCK_SIZE", "16")],
                      "quick").sweep_id() != spec.sweep_id()
    assert spec.sweep_id().startswith("BLOCK_SIZE=16__MAX_TOKENS=4,8__NUM_REQUESTS=2,3__PRESET=smoke__")
    assert build_spec(NOTEBOOK, [], None).sweep_id().startswith("defaults__")
    tuples = build_spec(NOTEBOOK, [("BUDGETS", "(16,64),(16,32,64)")], "smoke")
    assert [p["BUDGETS"] for p in tuples.points()] == [[16, 64], [16, 32, 64]]  # as papermill injects them
    assert tuples.sweep_id().startswith("BUDGETS=16-64,16-32-64__PRESET=smoke__")
    assert parse_grid_values(spec.command().split(" -p MAX_TOKENS ")[1].split()[0]) == [4, 8]


def test_a_bad_name_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(ValueError, match="NOT_A_PARAMETER.*NUM_REQUESTS"):
        build_spec(NOTEBOOK, [("NUM_REQUESTS", "2,3"), ("NOT_A_PARAMETER", "1,2")])
    with pytest.raises(ValueError, match="twice"):
        build_spec(NOTEBOOK, [("NUM_REQUESTS", "2"), ("NUM_REQUESTS", "3")])
    with pytest.raises(ValueError, match="a value twice"):
        build_spec(NOTEBOOK, [("NUM_REQUESTS", "2,3,2")])
    with pytest.raises(ValueError, match="--preset"):
        build_spec(NOTEBOOK, [("PRESET", "smoke")], "quick")
    assert main(["sweep", NOTEBOOK, "-p", "NOT_A_PARAMETER", "1,2", "--results-dir", str(tmp_path)]) == 2
    assert "NOT_A_PARAMETER" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_plot_takes_categorical_x_and_a_line_per_other_value(tmp_path):
    spec = SweepSpec(tmp_path / "xx.ipynb", {"QUANT": ["rtn", "gptq"], "BITS": [4, 8]})
    points = [{"params": {"QUANT": q, "BITS": b}, "status": "done",
               "metrics": {"duration_s": 1.0, "flag": True, "ppl": 10.0 + b, "claims.a": "yes"}}
              for b in (4, 8) for q in ("rtn", "gptq")]
    points.append({"params": {"QUANT": "awq", "BITS": 4}, "status": "failed", "metrics": {}})
    assert choose_metric(points, None) == "ppl"  # numeric, not a bool, and duration_s only as a last resort
    assert choose_metric(points, "nope") == "ppl" and choose_metric(points, "duration_s") == "duration_s"
    assert plot_metric(spec, points, "ppl", tmp_path / "ppl.png").stat().st_size > 0


def test_a_rerun_retries_the_failed_points_only_and_force_reruns_all(tmp_path, monkeypatch, capsys):
    """The bookkeeping, with a stand-in for run_notebook (the real runs are the slow tests below)."""
    import lab.workflow.sweep as sweep

    calls = []

    def fake_run(name, params, root):
        calls.append(params["NUM_REQUESTS"])
        if params["NUM_REQUESTS"] == 0:
            raise RuntimeError("ValueError: parameter NUM_REQUESTS=0 is outside [1, 4]")
        run_dir = root / name / f"run{len(calls)}"
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps({"requests": params["NUM_REQUESTS"], "claims": {"ok": 1}}))
        return run_dir

    monkeypatch.setattr(sweep, "run_notebook", fake_run)
    spec = build_spec(NOTEBOOK, [("NUM_REQUESTS", "0,2,3")], "smoke")
    first = sweep.run_sweep(spec, sweep.SweepOptions(root=tmp_path, local=True))
    assert [p["status"] for p in first.failed] == ["failed"] and calls == [0, 2, 3]
    assert first.points[1]["metrics"] == {"requests": 2, "claims.ok": 1}
    assert "NUM_REQUESTS=0 is outside" in (first.dir / "README.md").read_text()
    again = sweep.run_sweep(spec, sweep.SweepOptions(root=tmp_path, local=True))
    assert calls == [0, 2, 3, 0] and again.dir == first.dir and again.points[1] == first.points[1]
    assert "2 already done, 1 to run" in capsys.readouterr().out
    sweep.run_sweep(spec, sweep.SweepOptions(root=tmp_path, local=True, force=True))
    assert calls == [0, 2, 3, 0, 0, 2, 3]


@pytest.fixture(scope="module")
def ray_sweep(tmp_path_factory, user16):
    """A 2-point sweep of NUM_REQUESTS at the smoke preset, on a local Ray."""
    root = tmp_path_factory.mktemp("results")
    args = ["sweep", NOTEBOOK, "-p", "NUM_REQUESTS", "2,3", *small(user16), "--preset", "smoke",
            "--results-dir", str(root)]
    status = main(args)
    return root, args, status


@pytest.mark.slow
def test_a_sweep_on_local_ray_gives_one_table_a_plot_and_a_run_per_point(ray_sweep):
    root, _, status = ray_sweep
    assert status == 0
    [sweep_dir] = (root / "sweeps" / NOTEBOOK).iterdir()
    table = pd.read_csv(sweep_dir / "points.csv")
    assert len(table) == 2 and list(table["status"]) == ["done", "done"]
    assert list(table["NUM_REQUESTS"]) == [2, 3] and list(table["requests"]) == [2, 3]  # the metric follows
    assert {"run_dir", "duration_s", "mean_tpot_ms", "prefix_cache_hit_rate"} <= set(table.columns)
    for run_dir in table["run_dir"]:
        assert (root / run_dir / "metrics.json").exists() and (root / run_dir / f"{NOTEBOOK}.ipynb").exists()
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["preset"] == "smoke" and record["grid"]["NUM_REQUESTS"] == [2, 3]
    assert (sweep_dir / "requests.png").exists()  # the first numeric metric
    readme = (sweep_dir / "README.md").read_text()
    assert all(f"(../../../{d}/)" in readme for d in table["run_dir"])


@pytest.mark.slow
def test_a_rerun_skips_the_points_done(ray_sweep, capsys, monkeypatch):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("a sweep with nothing to run started Ray")

    root, args, _ = ray_sweep
    runs = sorted((root / NOTEBOOK).iterdir())
    monkeypatch.setattr(ray, "init", no_ray)
    assert main(args) == 0  # the same command: the same sweep directory, nothing to run, so no Ray started
    assert sorted((root / NOTEBOOK).iterdir()) == runs and len(runs) == 2
    assert "2 already done, 0 to run" in capsys.readouterr().out
    assert len(list((root / "sweeps" / NOTEBOOK).iterdir())) == 1


@pytest.mark.slow
def test_a_failing_point_is_recorded_and_the_others_finish(tmp_path, capsys, user16):
    args = ["sweep", NOTEBOOK, "-p", "NUM_REQUESTS", "0,2", *small(user16), "--preset", "smoke", "--local",
            "--results-dir", str(tmp_path)]
    assert main(args) == 1
    [sweep_dir] = (tmp_path / "sweeps" / NOTEBOOK).iterdir()
    table = pd.read_csv(sweep_dir / "points.csv")
    assert list(table["status"]) == ["failed", "done"]
    assert "NUM_REQUESTS" in table["error"][0]
    # the failed point links the run directory it made, whose metrics.json holds the error (issue 38 item 8)
    assert json.loads((tmp_path / table["run_dir"][0] / "metrics.json").read_text())["status"] == "failed"
    assert "1 done, 1 failed" in capsys.readouterr().out
