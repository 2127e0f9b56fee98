"""Notebook 06, serving under load, as one package: `measure` (a real server and load generator per engine
configuration: TTFT, TPOT, goodput), `claims` (the claims table on run-level spreads) and `plots` (the
concurrency ramp)."""
