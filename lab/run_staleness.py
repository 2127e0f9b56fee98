"""Which reference runs no longer match the code (issue 35 item 5): a run is *dirty* when its tree had uncommitted
changes to code (`params.json`'s `git_dirty`), and *stale* when its notebook, or a `lab.studies` module the notebook
imports (directly or through another study module), changed after the run's commit. A stale run is shown, not
refused: a small code change should not force hours of reruns, but a reader must see it. The notebook counts by
its code cells only: its markdown (how to run it on another model, a caveat reworded) changes nothing a run
measured, so a reference run of hours does not turn stale over prose.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# `lab.studies.x`, or `from lab.studies import a as b, c` (one line) or `... import (a,\n b)` (parenthesised): a
# listing without parentheses ends at its line, or the next line's `from lab.studies import` would be swallowed
_IMPORT = re.compile(r"lab\.studies(?:\.(\w+)|[ \t]+import[ \t]+(?:\(([\w\s,]+)\)|([\w \t,]+)))")


def _modules(text: str) -> set[str]:
    names = set()
    for dotted, grouped, listed in _IMPORT.findall(text):
        names |= {dotted} if dotted else {n.split(" as ")[0].strip() for n in (grouped or listed).split(",")
                                          if n.strip()}
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


def code_cells(text: str) -> str:
    """The code of a jupytext percent-format notebook: its markdown cells dropped (a cell runs from one `# %%`
    line to the next; markdown cells are `# %% [markdown]`), then the cell markers and blank lines, so splitting
    or joining cells does not count as a change either."""
    cells = re.split(r"(?m)^(?=# %%)", text)
    code = "".join(c for c in cells if not c.startswith("# %% [markdown]"))
    return "\n".join(line for line in code.splitlines() if line.strip() and not line.startswith("# %%"))


def _notebook_code_changed(repo: Path, commit: str, path: str) -> bool:
    then = _git(repo, "show", f"{commit}:{path}")
    if then.returncode:  # the notebook did not exist at that commit
        return True
    return code_cells(then.stdout) != code_cells((repo / path).read_text())


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
    if changed and paths[0] in changed and not _notebook_code_changed(repo, params["git_commit"], paths[0]):
        changed.remove(paths[0])  # its markdown only
    if changed is None:
        reasons.append(f"unknown commit {params.get('git_commit')!r}: cannot tell what changed since")
    elif changed:
        reasons.append("stale: changed since its commit: " + ", ".join(changed))
    return reasons

