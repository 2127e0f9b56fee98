"""Notebook 08, tensor and pipeline parallelism, as one package: `measure` (communication against a step,
measured and projected), `rank` (one tensor-parallel rank's step on one device) and `claims` (the claims table)."""
