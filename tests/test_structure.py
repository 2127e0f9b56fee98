"""The code's shape, checked: sizes that fit in a head, dependencies that run one way (issue 17).

- no source file in lab/ or bench/ over 400 lines, no function over 80;
- the engine imports no feature (speculative decoding and replay plug in through lab.engine.extension);
- no import cycle between lab's packages, counting imports inside functions (they hid the old cycles);
- the kernels import only torch, triton, numpy, the standard library and the low-level formats module
  lab.quant.kv;
- no study imports another study (shared helpers live in lab modules); a study may be split into parts named
  after it (`spec_acceptance_claims` is part of `spec_acceptance`);
- no two test modules share a file name: without packages, pytest imports each test file under its base name, so
  tests/test_report.py and tests/browser/test_report.py stopped collection in CI (stop 44).
"""

import ast
import collections
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("lab", "bench") for p in (ROOT / d).rglob("*.py"))
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


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sizes_fit_in_a_head(path):
    source = path.read_text()
    assert source.count("\n") <= MAX_FILE_LINES, f"{path.name} has {source.count(chr(10))} lines"
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


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


def test_kernels_import_only_torch_triton_numpy_and_the_formats_module():
    allowed_lab = {"lab.quant.kv"}
    stdlib = set(sys.stdlib_module_names)
    for path in (ROOT / "lab" / "kernels").rglob("*.py"):
        for m in imports(path):
            top = m.split(".")[0]
            ok = top in ("torch", "triton", "numpy") or top in stdlib or m in allowed_lab or m.startswith("lab.kernels")
            assert ok, f"{path.name} imports {m}"


def test_studies_do_not_import_each_other():
    for path in (ROOT / "lab" / "studies").glob("*.py"):
        me = module_name(path)
        others = {m for m in imports(path) if m.startswith("lab.studies.") and m != me
                  and not m.startswith(me + "_") and not me.startswith(m + "_")}
        assert not others, f"{path.name} imports {sorted(others)}"


def test_no_two_test_modules_share_a_name():
    """pytest's default (prepend) import mode names a test module by its file name alone; two equal names under
    tests/ make the second one an "import file mismatch" error the moment both are collected."""
    by_name = collections.defaultdict(list)
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name != "conftest.py":
            by_name[path.name].append(str(path.relative_to(ROOT)))
    assert {n: ps for n, ps in by_name.items() if len(ps) > 1} == {}
