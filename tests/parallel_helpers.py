"""Helpers shared by the tensor- and pipeline-parallel tests (not a test module)."""

import os


def tokens(outputs):
    return [o.token_ids for o in outputs]


def gone(pids) -> bool:
    """Every pid is reaped (no process, not even a zombie, is left)."""
    for pid in pids:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            pass
    return True
