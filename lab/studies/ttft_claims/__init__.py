"""Notebook 09, the TTFT article's claims, as one package: `measure` (first-token compute, INT8 memory, prefix hit
rates, cold starts), `serving` (the engine's INT8 allocation and readiness) and `table` (the claims table)."""
