"""Process state from Linux /proc: one parser of /proc/<pid>/stat and one reader of /proc/<pid>/cmdline for the
watchdog, the server's shutdown and tests.

The command name (field 2) is in parentheses and may hold spaces, so the fields after it are read from the last ")".
See proc(5).
"""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcStat(NamedTuple):
    state: str  # R running, S sleeping, T stopped, t traced, Z zombie, X dead, ...
    ppid: int


def proc_stat(pid: int | str) -> ProcStat | None:
    """State and parent of process `pid`, or None where it (or /proc) does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return ProcStat(fields[0], int(fields[1]))


def cmdline(pid: int | str) -> str | None:
    """The command line of process `pid`, its arguments joined by spaces ("" for a kernel thread), or None where it
    (or /proc) does not exist."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def all_pids() -> list[int]:
    """Every process id listed in /proc (empty where there is no /proc)."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit()] if os.path.isdir("/proc") else []
