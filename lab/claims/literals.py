"""Verdict literals in study code (issue 34 item 8, issue 48 item 4): a decided verdict typed instead of computed.

A verdict on a measured or computed claim comes from `lab.claims.rules` (`verdict`, `from_flag`, `all_of`), so
the code that builds claims tables (`lab/studies` and the articles' arithmetic, `lab/claims/arithmetic`) never needs the
decided words themselves. This scan reads each module's syntax tree and reports what would put one there by
hand: importing `HOLDS`, `WRONG`, `ROUNDING` or `NOT_DISTINGUISHABLE` from any module (`lab.stats.intervals` has a
significance word equal to a verdict: study code asks `lab.stats.intervals.significance_word` for it), reading one as
an attribute of any module (`claims.HOLDS`), a string constant that is exactly one of those words,
`from_flag(True)` / `from_flag(False)`, and a constant passed as the lab's value to `judged` or `verdict` (a
figure the rules cannot be wrong about). "not checkable here" and "wrong by argument" are not decided by
evidence and stay allowed (each with its reason in the row). Prose that merely mentions a word ("not a plain
'holds'" in a docstring) is not a constant equal to it, so it passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

from lab.claims.rules import HOLDS, NOT_DISTINGUISHABLE, ROUNDING, WRONG

DECIDED = {"HOLDS": HOLDS, "WRONG": WRONG, "ROUNDING": ROUNDING, "NOT_DISTINGUISHABLE": NOT_DISTINGUISHABLE}
LAB = Path(__file__).resolve().parents[1]
STUDIES = LAB / "studies"
SCANNED = (LAB / "studies", LAB / "claims" / "arithmetic")  # the code that builds claims tables
JUDGES = ("judged", "verdict")  # the rules' entry points that take the lab's value second


def _found(node: ast.AST) -> str | None:
    """What makes `node` a verdict literal, or None."""
    if isinstance(node, ast.ImportFrom):
        names = sorted(a.name for a in node.names if a.name in DECIDED)
        return f"imports {', '.join(names)} from {node.module}" if names else None
    if isinstance(node, ast.Attribute) and node.attr in DECIDED and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DECIDED.values():
        return f"the string {node.value!r}"
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "from_flag" \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bool):
        return f"from_flag({node.args[0].value})"
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in JUDGES \
            and len(node.args) >= 2 and _constant(node.args[1]):
        return f"a constant judged ({ast.unparse(node.args[1])})"
    return None


def _constant(node: ast.AST) -> bool:
    """A number written into the code (a signed one too), not a value computed from evidence."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)) \
        and not isinstance(node.value, bool)


def scan(source: str, name: str = "<source>") -> list[str]:
    """The verdict literals in one module's source, as "name:line: what"."""
    return [f"{name}:{node.lineno}: {what}" for node in ast.walk(ast.parse(source, name))
            if (what := _found(node)) is not None]


def find(*directories: Path) -> list[str]:
    """The verdict literals in every module under `directories` (default: `SCANNED`, lab/studies and
    lab/claims/arithmetic)."""
    directories = directories or SCANNED
    missing = [str(d) for d in directories if not Path(d).is_dir()]
    if missing:  # a moved folder would otherwise be scanned as empty, and pass
        raise FileNotFoundError(f"no such folder to scan for verdict literals: {', '.join(missing)}")
    return [hit for directory in directories for path in sorted(Path(directory).rglob("*.py"))
            for hit in scan(path.read_text(), str(path.relative_to(Path(directory).parent)))]
