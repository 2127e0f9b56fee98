"""Which reference runs no longer match the code (issue 35 item 5): a run is *dirty* when its tree had uncommitted
changes to code (`params.json`'s `git_dirty`), and *stale* when its notebook, or a `lab.studies` module the notebook
imports (directly or through another study module), changed after the run's commit. A stale run is shown, not
refused: a small code change should not force hours of reruns, but a reader must see it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_IMPORT = re.compile(r"lab\.studies(?:\.(\w+)|\s+import\s+\(?([\w\s,]+)\)?)")


def _modules(text: str) -> set[str]:
    names = set()
    for dotted, listed in _IMPORT.findall(text):
        names |= {dotted} if dotted else {n.split(" as ")[0].strip() for n in listed.split(",") if n.strip()}
    return names


def studies_used(notebook: Path, repo: Path) -> list[str]:
    """The repository paths of the `lab.studies` modules `notebook` (its .py twin) imports, transitively (a
    package as its folder)."""
    studies = repo / "lab" / "studies"
    seen, todo = {}, _modules(notebook.read_text())
    while todo:
        name = todo.pop()
        module, package = studies / f"{name}.py", studies / name
        if name in seen or not (module.exists() or package.is_dir()):
            continue
        files = [module] if module.exists() else sorted(package.glob("*.py"))
        seen[name] = f"lab/studies/{name}.py" if module.exists() else f"lab/studies/{name}"
        todo |= set().union(*(_modules(f.read_text()) for f in files)) - set(seen)
    return sorted(seen.values())


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def changed_since(repo: Path, commit: str, paths: list[str]) -> list[str] | None:
    """The `paths` that differ between `commit` and the working tree; None when the commit is unknown here."""
    if not commit or _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return None
    out = _git(repo, "diff", "--name-only", commit, "--", *paths)
    return [line for line in out.stdout.splitlines() if line]


def run_state(run: dict, repo: Path) -> list[str]:
    """Why a run (a `lab.results_index.list_runs` entry) does not match the code: "dirty", "stale: <paths>",
    "unknown commit <c>"; empty when it matches."""
    params, reasons = run["params"], []
    if params.get("git_dirty"):
        reasons.append("dirty: run from a tree with uncommitted code changes")
    notebook = repo / "notebooks" / f"{run['notebook']}.py"
    if not notebook.exists():
        return reasons + [f"stale: notebooks/{run['notebook']}.py no longer exists"]
    paths = [f"notebooks/{run['notebook']}.py", *studies_used(notebook, repo)]
    changed = changed_since(repo, params.get("git_commit", ""), paths)
    if changed is None:
        reasons.append(f"unknown commit {params.get('git_commit')!r}: cannot tell what changed since")
    elif changed:
        reasons.append("stale: changed since its commit: " + ", ".join(changed))
    return reasons

