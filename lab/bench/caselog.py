"""Results written case by case: one JSON line per finished case, flushed at once.

A benchmark that writes its JSON only at the end loses everything when it is stopped, and the GPU suite stops
every step at a time limit (gpu/gpu_suite.sh). So each step also appends its cases to a `.jsonl` file as
they finish; after a timeout that file holds what was measured, and the suite's summary counts it.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.workflow.run import json_safe


class CaseLog:
    """Appends `{"kind": kind, **record}` lines to `path` (nothing when `path` is None). The file is started
    afresh, so a rerun into the same folder does not mix two runs' cases."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def write(self, kind: str, record: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(json_safe({"kind": kind, **record}), allow_nan=False, default=str) + "\n")


def read_cases(path: str | Path) -> list[dict]:
    """The cases a `CaseLog` wrote (a last line cut off by a kill is left out)."""
    cases = []
    for line in Path(path).read_text().splitlines():
        try:
            cases.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return cases
