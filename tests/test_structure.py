"""The code's shape, checked: sizes that fit in a head, dependencies that run one way (issue 17).

- a size review, not a test: files in lab/ or gpu/ over 400 lines and functions over 80 are listed after
  every run (`oversized`, printed by conftest.py) for a reviewer to read; none is split to meet a number (issue 50);
- the engine imports no feature (speculative decoding and replay plug in through lab.engine.extension);
- no import cycle between lab's packages, counting imports inside functions (they hid the old cycles);
- the kernels import only torch, triton, numpy, the standard library and the low-level formats module
  lab.kv.format;
- no study imports another study (shared helpers live in lab modules); each study is one package, and lab's top
  level holds packages only, grouped by what they are (issue 50 item 4);
- no two test modules share a file name: without packages, pytest imports each test file under its base name, so
  tests/test_report.py and tests/browser/test_report.py stopped collection in CI (stop 44).
"""

import ast
import collections
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("lab", "gpu") for p in (ROOT / d).rglob("*.py"))
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function, resolved to absolute names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            else:
                found.add(node.module)
    return found


def unit(module: str) -> str | None:
    """The unit a lab module belongs to: its subpackage (lab.engine), or itself for a top-level module."""
    parts = module.split(".")
    return None if parts[0] != "lab" or len(parts) < 2 else ".".join(parts[:2])


def oversized(paths=SOURCES) -> list[str]:
    """Files over MAX_FILE_LINES lines and functions over MAX_FUNCTION_LINES, for a reviewer to read (issue 50: a
    size is a hint, never the design; no test splits a file to meet it). `pytest_terminal_summary` in
    conftest.py prints them after every run."""
    found = []
    for path in paths:
        source = path.read_text()
        name = path.relative_to(ROOT)
        if source.count("\n") > MAX_FILE_LINES:
            found.append(f"{name}: {source.count(chr(10))} lines")
        found += [f"{name}: {node.name} has {node.end_lineno - node.lineno + 1} lines"
                  for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    return found


def test_the_size_review_names_what_is_over_its_hint(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES + 1) + "y = 2\n" * MAX_FILE_LINES)
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert oversized([long]) == [f"long.py: {MAX_FILE_LINES + MAX_FUNCTION_LINES + 2} lines",
                                     f"long.py: f has {MAX_FUNCTION_LINES + 2} lines"]
    finally:
        ROOT = root


def test_the_engine_imports_no_feature():
    engine = [p for p in SOURCES if module_name(p).startswith("lab.engine")]
    assert engine
    bad = {module_name(p): sorted(m for m in imports(p) if unit(m) in ("lab.speculative", "lab.replay")) for p in engine}
    assert not {k: v for k, v in bad.items() if v}


def package_graph() -> dict[str, set[str]]:
    units = {unit(module_name(p)) for p in SOURCES} - {None}
    graph = collections.defaultdict(set)
    for path in SOURCES:
        src = unit(module_name(path))
        for dst in map(unit, imports(path)):
            if src and dst in units and dst != src:
                graph[src].add(dst)
    return graph


def test_no_cycles_between_lab_packages():
    graph = package_graph()
    assert graph["lab.engine"] and graph["lab.speculative"]  # the graph is not empty by mistake

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))
    assert not cycles


def runtime_imports(path: Path) -> set[str]:
    """The lab modules `path` imports when it runs (at the top or in a function; `if TYPE_CHECKING:` blocks, which
    never run, left out), each resolved to the module it names: `from lab.studies import x` names lab.studies.x."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING") for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_import_circles_between_modules():
    """No lab module imports, through others, a module that imports it (issue 50: three studies and their claims
    modules, re-exporting each other, made three such circles). A package's `__init__` re-exporting its own
    submodules is not a circle of the code, only of the names: it is left out as a target of its submodules."""
    modules = {module_name(p): p for p in SOURCES if module_name(p).startswith("lab")}
    graph = {}
    for name, path in modules.items():
        targets = {m for m in runtime_imports(path) if m in modules and m != name}
        graph[name] = {m for m in targets if not name.startswith(m + ".")}  # a submodule naming its own package
    assert graph["lab.engine.llm"], "the graph is not empty by mistake"
    assert not module_cycles(graph)
    assert module_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_kernels_import_only_torch_triton_numpy_and_the_formats_module():
    allowed_lab = {"lab.kv.format"}
    stdlib = set(sys.stdlib_module_names)
    for path in (ROOT / "lab" / "kernels").rglob("*.py"):
        for m in imports(path):
            top = m.split(".")[0]
            ok = top in ("torch", "triton", "numpy") or top in stdlib or m in allowed_lab or m.startswith("lab.kernels")
            assert ok, f"{path.name} imports {m}"


def test_studies_do_not_import_each_other():
    """A study is a package (`lab/studies/kv_quantization/`): its modules import each other, never another
    study's; `evidence` and `findings` read every study by design."""
    def study(module: str) -> str:
        return module.split(".")[2]

    for path in (ROOT / "lab" / "studies").rglob("*.py"):
        me = module_name(path)
        if me == "lab.studies" or study(me) in ("evidence", "findings"):
            continue
        others = {m for m in imports(path) if m.startswith("lab.studies.") and study(m) != study(me)}
        assert not others, f"{path.relative_to(ROOT)} imports {sorted(others)}"


def test_each_study_is_a_package_and_the_top_level_holds_packages():
    """Issue 50 item 4: a study's parts live in its package, not beside it as flat modules held together by
    names, and lab's top level is a handful of packages named by what they are (the run workflow, publishing,
    statistics, claims, ...), not a flat list of modules."""
    flat_studies = sorted(p.name for p in (ROOT / "lab" / "studies").glob("*.py") if p.name != "__init__.py")
    assert not flat_studies, f"study modules outside a study's package: {flat_studies}"
    flat_top = sorted(p.name for p in (ROOT / "lab").glob("*.py") if p.name != "__init__.py")
    assert not flat_top, f"modules directly under lab/ (put each in the package of what it is): {flat_top}"


def test_no_two_test_modules_share_a_name():
    """pytest's default (prepend) import mode names a test module by its file name alone; two equal names under
    tests/ make the second one an "import file mismatch" error the moment both are collected."""
    by_name = collections.defaultdict(list)
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name != "conftest.py":
            by_name[path.name].append(str(path.relative_to(ROOT)))
    assert {n: ps for n, ps in by_name.items() if len(ps) > 1} == {}
