"""Notebook 04, replay's break-even, as one package: `measure` (parameters, the cost model's tables, the
recompute timed on the engine, its figures) and `claims` (the claims table, which the notebook calls as
`claims_table`)."""

from lab.studies.replay_break_even.claims import claims_table  # noqa: F401
from lab.studies.replay_break_even.measure import *  # noqa: F401,F403
