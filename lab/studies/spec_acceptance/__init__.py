"""Notebook 05, speculative decoding's acceptance and speedup, as one package: `measure` (parameters, the
engine runs, the k sweep, the policy and Spec-Bench), `intervals` (run-level intervals beside each estimate),
`plots`, and `claims` (the claims table). The notebook calls them through this package's names."""

from lab.studies.spec_acceptance import plots  # noqa: F401
from lab.studies.spec_acceptance.claims import claims_table, roofline_costs  # noqa: F401
from lab.studies.spec_acceptance.intervals import drafter_comparison  # noqa: F401
from lab.studies.spec_acceptance.measure import *  # noqa: F401,F403
