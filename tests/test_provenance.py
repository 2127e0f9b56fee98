"""`lab.workflow.provenance`: a change to the code marks a run dirty, what runs write under results/ does not (a `lab
run` of several reference notebooks marked every run after the first dirty, through the results index); the CPU is
recorded with its matrix flags."""

import subprocess

import pytest

import lab.workflow.provenance as provenance


def git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "lab").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "lab" / "study.py").write_text("x = 1\n")
    (tmp_path / "results" / "README.md").write_text("index\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "start")
    monkeypatch.setattr(provenance, "_ROOT", tmp_path)
    return tmp_path


def test_results_written_by_runs_leave_the_code_clean(repo):
    assert provenance.code_dirty() is False
    (repo / "results" / "README.md").write_text("index with a new run\n")
    (repo / "results" / "01_x").mkdir()
    (repo / "results" / "01_x" / "metrics.json").write_text("{}")
    assert provenance.code_dirty() is False


def test_a_changed_code_file_is_dirty(repo):
    (repo / "lab" / "study.py").write_text("x = 2\n")
    assert provenance.code_dirty() is True
    assert provenance.provenance()["git_dirty"] is True


def test_provenance_records_the_cpus_matrix_flags():
    from lab.machine.hardware import MATRIX_FLAGS, cpu_signature

    p = provenance.provenance()
    assert p["cpu_signature"] == cpu_signature()
    if p["cpu_signature"] is not None:  # Linux
        assert p["cpu_signature"]["family"] and set(p["cpu_signature"]["matrix_flags"]) <= set(MATRIX_FLAGS)
        flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0]
        assert [f for f in MATRIX_FLAGS if f" {f} " in f"{flags} "] == p["cpu_signature"]["matrix_flags"]
