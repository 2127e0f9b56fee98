"""Seed 002's arithmetic, recomputed from the inputs the article states (TTFT and cold start)."""

from __future__ import annotations

from lab.studies.arithmetic import recomputed  # noqa: F401  (each row is one `recomputed(...)`)


def rows() -> list[dict]:
    """One `recomputed` row per claim of seed 002 that arithmetic on its stated inputs decides."""
    return []
