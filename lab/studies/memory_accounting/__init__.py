"""Notebook 01, memory accounting and the roofline, as one package: `measure` (the calculator's tables checked
against the engine's allocations and measured steps, and the articles' arithmetic in its claims table) and
`int4_decode` (the deployment article's INT4 decode speedup, measured on the engine)."""
