"""The fault suite's notebook case (issue 53): a run whose results directory stops being writable midway fails with
a clear error naming the directory, and leaves nothing that any listing, ledger or report could take as a
finished run (`INCOMPLETE` stays in it: `lab.workflow.index`)."""
import os
import subprocess

import pytest

from lab.workflow.index import INCOMPLETE, list_runs


def _make_unwritable(path):
    """No entry can be created in `path` any more: for root (whom permissions do not stop) through the immutable
    attribute, for anyone else through its mode. Returns the undo."""
    if os.geteuid() == 0:
        r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot make a directory unwritable for root here (chattr: {r.stderr.strip()})")
        return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
    os.chmod(path, 0o555)
    return lambda: os.chmod(path, 0o755)


def test_a_run_whose_directory_becomes_unwritable_fails_by_name_and_is_never_a_result(tmp_path, monkeypatch, capsys):
    import lab.workflow.run as run_module
    from lab.cli import main

    undo = []
    original = run_module.Run.save_table

    def save_table(self, name, df):  # the directory goes read-only as the notebook saves its first table
        if not undo:
            undo.append(_make_unwritable(self.dir))
        return original(self, name, df)

    monkeypatch.setattr(run_module.Run, "save_table", save_table)
    try:
        code = main(["run", "04_replay_break_even", "--in-process", "--preset", "smoke", "--model", "random:tiny",
                     "--results-dir", str(tmp_path)])
    finally:
        for u in undo:
            u()
    out = capsys.readouterr()
    assert undo, "the notebook never saved a table: the fault was not injected"
    (run_dir,) = (tmp_path / "04_replay_break_even").iterdir()
    assert code != 0
    said = out.out + out.err
    assert f"the run directory {run_dir} stopped being writable during the run" in said, said[-3000:]
    assert (run_dir / INCOMPLETE).exists() and (run_dir / "params.json").exists()  # half-written, and marked so
    assert list_runs(tmp_path) == [] and list_runs(tmp_path, include_failed=True) == []


def test_a_results_directory_that_cannot_be_written_at_all_runs_nothing(tmp_path, capsys):
    from lab.cli import main

    undo = _make_unwritable(tmp_path)
    try:
        code = main(["run", "04_replay_break_even", "--in-process", "--preset", "smoke", "--model", "random:tiny",
                     "--results-dir", str(tmp_path)])
    finally:
        undo()
    said = "".join(capsys.readouterr())
    assert code != 0 and f"the results directory {tmp_path} cannot be written" in said and "nothing was run" in said


def test_a_killed_run_that_left_metrics_is_not_listed(tmp_path):
    """A run killed after its notebook saved some metrics (metrics.json exists) but before it finished."""
    run = tmp_path / "00_engine_tour" / "20261206T000000.000000Z-abcdef"
    run.mkdir(parents=True)
    (run / "params.json").write_text('{"parameters": {"PRESET": "reference"}}')
    (run / "metrics.json").write_text('{"ttft_ms": 12.0}')
    (run / INCOMPLETE).write_text("")
    assert list_runs(tmp_path) == []
    (run / INCOMPLETE).unlink()  # as `lab run` removes it once everything is written
    assert [r["dir"] for r in list_runs(tmp_path)] == [run]
