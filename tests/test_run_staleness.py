"""`lab runs --stale` (issue 35 item 5): a reference run is stale when its notebook or a study module it imports
(transitively, packages included) changed after the run's commit, and dirty when its tree was."""

import subprocess

from lab.workflow.staleness import run_state, studies_used


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "lab" / "studies" / "pkg").mkdir(parents=True)
    (repo / "notebooks" / "01_x.py").write_text("from lab.studies import alpha as a, gamma\nimport numpy\n")
    (repo / "lab" / "studies" / "alpha.py").write_text("from lab.studies.beta import f\n")
    (repo / "lab" / "studies" / "beta.py").write_text("from lab.studies import pkg\n")
    (repo / "lab" / "studies" / "pkg" / "__init__.py").write_text("X = 1\n")
    (repo / "lab" / "studies" / "unused.py").write_text("Y = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "add", "-A")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "one")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return repo, commit


def _run(commit, dirty=False):
    return {"notebook": "01_x", "params": {"git_commit": commit, "git_dirty": dirty}}


def test_the_modules_a_notebook_uses_are_found_transitively(tmp_path):
    repo, _ = _repo(tmp_path)
    assert studies_used(repo / "notebooks" / "01_x.py", repo) == [
        "lab/studies/alpha.py", "lab/studies/beta.py", "lab/studies/pkg"]  # gamma does not exist: skipped


def test_consecutive_aliased_imports_are_each_found():
    """`from lab.studies import a as x` on consecutive lines: each module counts (an unparenthesised listing once ran
    on into the next line and hid every second module, so a changed claims module left notebook 02 current)."""
    from lab.workflow.staleness import _modules

    text = ("from lab.studies import quant_accuracy as study\nfrom lab.studies import quant_accuracy_ladder as ladder\n"
            "from lab.studies import quant_accuracy_plots as plots\nfrom lab.studies import quant_accuracy_stats as stats\n"
            "from lab.studies import (alpha,\n    beta as b)\nimport lab.studies.gamma\n")
    assert _modules(text) == {"quant_accuracy", "quant_accuracy_ladder", "quant_accuracy_plots", "quant_accuracy_stats",
                              "alpha", "beta", "gamma"}


def test_a_run_is_stale_only_when_what_it_ran_changed(tmp_path):
    repo, commit = _repo(tmp_path)
    assert run_state(_run(commit), repo) == []
    (repo / "lab" / "studies" / "unused.py").write_text("Y = 2\n")  # not imported: still matches
    assert run_state(_run(commit), repo) == []
    (repo / "lab" / "studies" / "pkg" / "__init__.py").write_text("X = 2\n")  # two imports away, in a package
    (state,) = run_state(_run(commit), repo)
    assert state.startswith("stale") and "lab/studies/pkg/__init__.py" in state


def test_a_notebook_whose_markdown_alone_changed_is_not_stale(tmp_path):
    repo, commit = _repo(tmp_path)
    notebook = repo / "notebooks" / "01_x.py"
    code = notebook.read_text()
    notebook.write_text(f"# %% [markdown]\n# How to run it on your model\n\n# %%\n{code}")
    assert run_state(_run(commit), repo) == []
    notebook.write_text(f"# %% [markdown]\n# How to run it on your model\n\n# %%\n{code}x = 1\n")
    (state,) = run_state(_run(commit), repo)
    assert state.startswith("stale") and "notebooks/01_x.py" in state


def test_a_dirty_run_and_an_unknown_commit_are_said(tmp_path):
    repo, commit = _repo(tmp_path)
    assert run_state(_run(commit, dirty=True), repo)[0].startswith("dirty")
    assert run_state(_run("0" * 40), repo)[0].startswith("unknown commit")


def test_archive_moves_every_superseded_run_under_earlier(tmp_path):
    import json

    from lab.workflow.index import archive, list_runs

    for nb, run, preset in (("01_x", "20260101T000000Z-a", "reference"), ("01_x", "20260102T000000Z-b", "reference"),
                            ("01_x", "20260103T000000Z-c", "quick"), ("02_y", "20260101T000000Z-d", "reference")):
        d = tmp_path / nb / run
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"parameters": {"PRESET": preset}}))
        (d / "metrics.json").write_text("{}")
    moved = archive(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in moved] == ["01_x/earlier/20260101T000000Z-a"]
    assert {r["run_id"] for r in list_runs(tmp_path)} == {"20260102T000000Z-b", "20260103T000000Z-c",
                                                           "20260101T000000Z-d"}


def test_a_run_still_executing_or_failed_is_not_a_result(tmp_path):
    """A reference run in progress (no metrics.json yet) or one that failed must not become the notebook's latest
    run: the ledger, the docs and the report would read an empty run, and `archive` would move the finished one."""
    import json

    from lab.workflow.index import archive, list_runs, reference_states

    for run, metrics in (("20260101T000000Z-a", {"duration_s": 1}), ("20260102T000000Z-b", None),
                         ("20260103T000000Z-c", {"status": "failed", "error": "boom"})):
        d = tmp_path / "01_x" / run
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"parameters": {"PRESET": "reference"}}))
        if metrics is not None:
            (d / "metrics.json").write_text(json.dumps(metrics))
    assert [r["run_id"] for r in list_runs(tmp_path)] == ["20260101T000000Z-a"]
    assert reference_states(tmp_path, tmp_path)["01_x"][0].name == "20260101T000000Z-a"
    assert archive(tmp_path) == []
    assert (tmp_path / "01_x" / "20260102T000000Z-b").is_dir()


def test_no_latest_reference_run_in_the_repository_is_dirty():
    """A run from a tree with uncommitted changes cannot be reproduced from its commit: the latest reference run of
    every notebook must come from a clean tree (a stale one is shown, not refused: `lab runs --stale`)."""
    from pathlib import Path

    from lab.workflow.index import list_runs

    root = Path(__file__).resolve().parents[1] / "results"
    latest = {r["notebook"]: r for r in list_runs(root) if r["preset"] == "reference"}
    assert len(latest) >= 10  # every study notebook has a committed reference run
    assert [nb for nb, r in sorted(latest.items()) if r["params"].get("git_dirty")] == []


def _commit(repo, message="two"):
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "add", "-A")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", message)


def test_a_move_a_rename_or_a_reworded_docstring_keeps_a_run_current(tmp_path):
    """Issue 50 item 5: staleness follows what the code does, so a refactor that moves code costs no rerun."""
    repo, commit = _repo(tmp_path)
    studies = repo / "lab" / "studies"
    (studies / "beta.py").write_text('from lab.studies import pkg\n\n\ndef g(x):\n    """New words."""\n    return x\n')
    _commit(repo)
    (state,) = run_state(_run(commit), repo)  # a function added: new behaviour
    assert state.startswith("stale") and "lab/studies/beta.py" in state
    repo, commit = _repo(tmp_path / "again")
    (studies := repo / "lab" / "studies")
    # pkg's X moves into a new module that beta imports instead; alpha's import is rerouted; comments added
    (studies / "pkg" / "__init__.py").write_text('"""A package, reworded."""\n')
    (studies / "moved.py").write_text("# X lives here now\nX = 1\n")
    (studies / "beta.py").write_text("from lab.studies import pkg  # still imported\nfrom lab.studies import moved\n")
    _commit(repo)
    assert run_state(_run(commit), repo) == []
    (studies / "moved.py").write_text("X = 3\n")  # and now it does something else
    (state,) = run_state(_run(commit), repo)
    assert state.startswith("stale") and "lab/studies/moved.py" in state and "beta.py" not in state


def test_a_renamed_study_module_keeps_its_run_current(tmp_path):
    repo, commit = _repo(tmp_path)
    studies = repo / "lab" / "studies"
    (studies / "alpha.py").rename(studies / "alpha_renamed.py")
    notebook = repo / "notebooks" / "01_x.py"
    notebook.write_text(notebook.read_text().replace("alpha as a", "alpha_renamed as a"))
    assert run_state(_run(commit), repo) == []


def test_a_package_counts_by_its_init_and_the_submodules_named(tmp_path):
    """The findings package loads each study's module by name for the docs: a notebook that imports the package
    depends on its `__init__.py` and on the submodules some file names (`lab.studies.pkg.sub`), not on all."""
    repo, commit = _repo(tmp_path)
    studies = repo / "lab" / "studies"
    (studies / "pkg" / "other.py").write_text("Z = 1\n")  # in the package, named by nothing reached
    assert run_state(_run(commit), repo) == []
    (studies / "beta.py").write_text("from lab.studies import pkg\nfrom lab.studies.pkg.other import Z\n")
    (state,) = run_state(_run(commit), repo)  # now reached: its code is new to the run
    assert state.startswith("stale") and "lab/studies/pkg/other.py" in state


def test_a_module_moved_into_a_package_with_its_lazy_imports_rerouted_keeps_a_run_current(tmp_path):
    """The relayout of issue 50 item 4: a flat study module moves into its study's package, the notebook imports
    it as `from lab.studies.pkg import sub`, and an import inside a function names the new path. Before imports
    were left out wherever they stand, the rerouted lazy import alone marked the run stale."""
    repo, commit = _repo(tmp_path)
    studies = repo / "lab" / "studies"
    (studies / "gamma.py").write_text("def h():\n    from lab.studies.beta import f\n    return f\n")
    _commit(repo, "gamma")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (studies / "gamma.py").rename(studies / "pkg" / "gamma.py")
    (studies / "pkg" / "gamma.py").write_text("def h():\n    from lab.studies.alpha import f\n    return f\n")
    notebook = repo / "notebooks" / "01_x.py"
    notebook.write_text(notebook.read_text().replace("alpha as a, gamma", "alpha as a\nfrom lab.studies.pkg import gamma"))
    _commit(repo)
    from lab.workflow.staleness import _closure, _Tree

    # reached through `from lab.studies.pkg import gamma`
    assert "lab/studies/pkg/gamma.py" in _closure(_Tree(repo), "notebooks/01_x.py")["lab/studies/pkg"]
    assert run_state(_run(commit), repo) == []
    (studies / "pkg" / "gamma.py").write_text("def h():\n    from lab.studies.alpha import f\n    return None\n")
    (state,) = run_state(_run(commit), repo)  # the same import, another result: stale, and only gamma named
    assert state.startswith("stale") and state.endswith("lab/studies/pkg/gamma.py")
