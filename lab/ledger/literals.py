"""Verdict literals in study code (issue 34 item 8): a decided verdict a study types instead of computing it.

A verdict on a measured or computed claim comes from `lab.ledger.rules` (`verdict`, `from_flag`, `all_of`), so
study code never needs the decided words themselves. This scan reads each module's syntax tree and reports what
would put one there by hand: importing `HOLDS`, `WRONG`, `ROUNDING` or `NOT_DISTINGUISHABLE` from `lab.claims`
or `lab.ledger.rules` (or reading them as `claims.X` / `rules.X`), a string constant that is exactly one of
those words, and `from_flag(True)` / `from_flag(False)`. "not checkable here" and "wrong by argument" are not
decided by evidence and stay allowed (each with its reason in the row). Prose that merely mentions a word
("not a plain 'holds'" in a docstring) is not a constant equal to it, so it passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

from lab.ledger.rules import HOLDS, NOT_DISTINGUISHABLE, ROUNDING, WRONG

DECIDED = {"HOLDS": HOLDS, "WRONG": WRONG, "ROUNDING": ROUNDING, "NOT_DISTINGUISHABLE": NOT_DISTINGUISHABLE}
RULE_MODULES = ("lab.claims", "lab.ledger.rules")
STUDIES = Path(__file__).resolve().parents[1] / "studies"


def _found(node: ast.AST) -> str | None:
    """What makes `node` a verdict literal, or None."""
    if isinstance(node, ast.ImportFrom) and node.module in RULE_MODULES:
        names = sorted(a.name for a in node.names if a.name in DECIDED)
        return f"imports {', '.join(names)} from {node.module}" if names else None
    if isinstance(node, ast.Attribute) and node.attr in DECIDED and isinstance(node.value, ast.Name) \
            and node.value.id in ("claims", "rules"):
        return f"{node.value.id}.{node.attr}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DECIDED.values():
        return f"the string {node.value!r}"
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "from_flag" \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bool):
        return f"from_flag({node.args[0].value})"
    return None


def scan(source: str, name: str = "<source>") -> list[str]:
    """The verdict literals in one module's source, as "name:line: what"."""
    return [f"{name}:{node.lineno}: {what}" for node in ast.walk(ast.parse(source, name))
            if (what := _found(node)) is not None]


def find(directory: Path = STUDIES) -> list[str]:
    """The verdict literals in every module under `directory` (default: lab/studies)."""
    return [hit for path in sorted(Path(directory).rglob("*.py"))
            for hit in scan(path.read_text(), str(path.relative_to(Path(directory).parent)))]
