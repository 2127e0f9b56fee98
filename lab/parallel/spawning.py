"""Starting rank processes so that a rank which cannot start says why.

A spawned rank is a fresh interpreter that first re-imports the caller's main module (multiprocessing's
"spawn" start method does, so that functions defined there can be unpickled) and only then runs the lab's
worker. Two ways that fails before any of the lab's code runs in the rank, leaving rank 0 with nothing but an
exit code:

- the main module has a file name that is not a file: a script read from stdin (`python - <<EOF`, `__file__`
  is "<stdin>") or some embedded interpreters. `check_main_module` refuses these before spawning, naming the fix;
- a script without `if __name__ == "__main__":` runs again in the rank, builds its own engine and fails there
  (multiprocessing refuses to spawn during bootstrapping). Only the rank's own traceback says so.

So each rank's stderr goes to a log file of its own (`start_logged`: file descriptor 2 is pointed at the log
while the process is started, and the child inherits it), and `log_tail` gives the last lines for the
`RankFailure`. A rank's later warnings go to that file too, not to the terminal.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

FIX = ('run it from a file (python script.py), with the code that builds the engine under '
       '`if __name__ == "__main__":`')


def check_main_module(kind: str) -> None:
    """Raise ValueError if spawned ranks cannot re-import the caller's main module."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:  # `python -m pkg`: re-imported by name
        return
    path = getattr(main, "__file__", None)
    if path is None:  # an interactive session or a Jupyter kernel: spawn does not re-import it
        return
    if not Path(path).is_file():
        raise ValueError(f"{kind} ranks are spawned processes that re-import the main module, and this one's "
                         f"file {path!r} cannot be read again (a script piped on stdin?): {FIX}")


def start_logged(processes: list, folder: str | None = None) -> list[Path]:
    """Start `processes`, each with its stderr in its own log file; returns the logs' paths."""
    folder = Path(folder or tempfile.mkdtemp(prefix="lab-ranks-"))
    logs, saved = [], os.dup(2)
    try:
        for p in processes:
            log = folder / f"{p.name}.stderr"
            with open(log, "wb") as f:
                sys.stderr.flush()
                os.dup2(f.fileno(), 2)
                try:
                    p.start()
                finally:
                    os.dup2(saved, 2)
            logs.append(log)
    finally:
        os.close(saved)
    return logs


def log_tail(log: Path | None, lines: int = 16) -> str:
    """The last `lines` non-empty lines of a rank's stderr log ("" if it has none)."""
    try:
        text = log.read_text(errors="replace") if log is not None else ""
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def remove_logs(logs: list[Path]) -> None:
    """Delete the logs of a group that closed without a failure (a failure's message names its log)."""
    for log in logs:
        log.unlink(missing_ok=True)
    if logs:
        try:
            logs[0].parent.rmdir()
        except OSError:
            pass
