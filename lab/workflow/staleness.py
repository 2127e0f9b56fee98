"""Which reference runs no longer match the code: a run is *dirty* when its tree had uncommitted changes to code
(`params.json`'s `git_dirty`), and *stale* when what its notebook runs behaves otherwise now than at the run's
commit: its notebook's code, or a `lab.studies` module it imports (directly or through another study module).

"Behaves otherwise" is read from the code's syntax, not its files (issue 50 item 5): each module's top-level
statements, imports left out, each as its syntax tree without docstrings (comments, blank lines and formatting are
not in the tree), pooled over every module the notebook reaches. A function moved to another module, a module
renamed or split, an import rerouted, a docstring or comment reworded, or markdown in the notebook edited keeps a
run current; a changed statement, default or constant marks it stale, naming the files whose code differs. A stale
run is shown, not refused: a small code change should not force hours of reruns, but a reader must see it.
"""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
from collections import Counter
from pathlib import Path

# `lab.studies.x`, or `from lab.studies import a as b, c` (one line) or `... import (a,\n b)` (parenthesised): a
# listing without parentheses ends at its line, or the next line's `from lab.studies import` would be swallowed
_IMPORT = re.compile(r"lab\.studies(?:\.(\w+)|[ \t]+import[ \t]+(?:\(([\w\s,]+)\)|([\w \t,]+)))")
# `from lab.studies.pkg import a, b as c`: names a package's submodules (or its functions, which name no file)
_FROM_PACKAGE = re.compile(r"from[ \t]+lab\.studies\.(\w+)[ \t]+import[ \t]+(?:\(([\w\s,]+)\)|([\w \t,]+))")


def _names(listing: str) -> set[str]:
    """The names an import listing brings in ("a as b, c" -> {"a", "c"})."""
    return {n.split(" as ")[0].strip() for n in listing.split(",") if n.strip()}


def _modules(text: str) -> set[str]:
    names = set()
    for dotted, grouped, listed in _IMPORT.findall(text):
        names |= {dotted} if dotted else _names(grouped or listed)
    return names


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


class _Tree:
    """The repository's files as they are now (`commit` None) or at `commit`."""

    def __init__(self, repo: Path, commit: str | None = None):
        self.repo, self.commit, self._read = repo, commit, {}

    def read(self, path: str) -> str | None:
        """The file's text, or None where it is not a file (each read once: `git show` for a commit)."""
        if path not in self._read:
            if self.commit is None:
                file = self.repo / path
                self._read[path] = file.read_text() if file.is_file() else None
            else:
                out = _git(self.repo, "show", f"{self.commit}:{path}")
                self._read[path] = out.stdout if out.returncode == 0 else None
        return self._read[path]


_SUBMODULE = re.compile(r"lab\.studies\.(\w+)\.(\w+)")


def _refs(text: str) -> set[str]:
    """The study modules a file names: "x" (a module or a package) and "pkg.sub" (a package's submodule)."""
    listed = {f"{pkg}.{n}" for pkg, grouped, flat in _FROM_PACKAGE.findall(text) for n in _names(grouped or flat)}
    return _modules(text) | {f"{pkg}.{sub}" for pkg, sub in _SUBMODULE.findall(text)} | listed


def _file_of(tree: _Tree, ref: str) -> str | None:
    """The file a reference names: lab/studies/x.py, or a package's __init__.py, or its submodule; None when it
    names none (a function imported from a package, or a module gone)."""
    pkg, _, sub = ref.partition(".")
    paths = [f"lab/studies/{pkg}/{sub}.py"] if sub else [f"lab/studies/{pkg}.py", f"lab/studies/{pkg}/__init__.py"]
    return next((p for p in paths if tree.read(p) is not None), None)


def _closure(tree: _Tree, notebook: str) -> dict[str, list[str]]:
    """The `lab.studies` modules the notebook imports, transitively, as {module or package path: its files}. A
    package counts by its `__init__.py` and the submodules some reached file names (`lab.studies.pkg.sub`): the
    findings package loads each study's module by name for that study's docs (`lab docs` redraws a run's figures
    from its files, so what it draws never makes a run's measurements wrong), and would otherwise tie every
    notebook to every study."""
    files: dict[str, list[str]] = {}
    seen, todo = set(), _refs(tree.read(notebook) or "")
    while todo:
        ref = todo.pop()
        seen.add(ref)
        path = _file_of(tree, ref)
        if path is None:
            continue
        module = path if path.count("/") == 2 else path.rsplit("/", 1)[0]  # a package counts as its folder
        files.setdefault(module, []).append(path)
        todo |= _refs(tree.read(path) or "") - seen
    return {module: sorted(fs) for module, fs in files.items()}


def studies_used(notebook: Path, repo: Path) -> list[str]:
    """The repository paths of the `lab.studies` modules `notebook` (its .py twin) imports, transitively (a
    package as its folder)."""
    return sorted(_closure(_Tree(repo), str(notebook.relative_to(repo))))


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            # a function or class left empty needs a body; a module does not (a `pass` would count as code)
            node.body = body[1:] or ([] if isinstance(node, ast.Module) else [ast.Pass()])


def _strip_imports(tree: ast.AST) -> None:
    """Drop every import, at the top or inside a function, an `if` or a `try`: an import binds a name to code
    that is itself in the pool (a study module) or outside what staleness follows, so a rerouted import (a module
    moved into a package) is not a change in behaviour."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body):
                kept = [s for s in body if not isinstance(s, (ast.Import, ast.ImportFrom))]
                # a block left empty needs a body; a module (or an absent `else`) does not
                setattr(node, field, kept or ([] if isinstance(node, ast.Module) or field != "body" else [ast.Pass()]))


def behaviour(source: str) -> Counter:
    """A module's code as a multiset of its top-level statements, imports left out wherever they stand, each the
    hash of its syntax tree without docstrings; a file that does not parse counts as its text."""
    digest = lambda text: hashlib.sha1(text.encode()).hexdigest()[:16]  # noqa: E731
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Counter([digest(source)])
    _strip_docstrings(tree)
    _strip_imports(tree)
    return Counter(digest(ast.dump(stmt, annotate_fields=False)) for stmt in tree.body)


def _files(tree: _Tree, notebook: str) -> dict[str, Counter]:
    files = [notebook, *(f for fs in _closure(tree, notebook).values() for f in fs)]
    return {f: behaviour(tree.read(f) or "") for f in files}


def behaviour_changed(repo: Path, commit: str, notebook: str) -> list[str] | None:
    """The files whose code behaves otherwise now than at `commit`, for what `notebook` runs: empty when the
    pooled code is the same (whatever moved between files); None when the commit is unknown here."""
    if not commit or _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return None
    then, now = _files(_Tree(repo, commit), notebook), _files(_Tree(repo), notebook)
    pooled_then, pooled_now = sum(then.values(), Counter()), sum(now.values(), Counter())
    if pooled_then == pooled_now:
        return []
    # name only the files holding a statement that is not on the other side (a file moved whole is not named)
    gone, new = pooled_then - pooled_now, pooled_now - pooled_then
    return sorted({f for f, code in then.items() if code & gone} | {f for f, code in now.items() if code & new})


def run_state(run: dict, repo: Path) -> list[str]:
    """Why a run (a `lab.workflow.index.list_runs` entry) does not match the code: "dirty", "stale: <paths>",
    "unknown commit <c>"; empty when it matches."""
    params, reasons = run["params"], []
    if params.get("git_dirty"):
        reasons.append("dirty: run from a tree with uncommitted code changes")
    notebook = f"notebooks/{run['notebook']}.py"
    if not (repo / notebook).exists():
        return reasons + [f"stale: {notebook} no longer exists"]
    changed = behaviour_changed(repo, params.get("git_commit", ""), notebook)
    if changed is None:
        reasons.append(f"unknown commit {params.get('git_commit')!r}: cannot tell what changed since")
    elif changed:
        reasons.append("stale: its code behaves otherwise since its commit: " + ", ".join(changed))
    return reasons
