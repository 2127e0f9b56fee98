"""Notebook 07, structured output, as one package: `measure` (what a grammar mask costs a step and what it buys),
`task` (the extraction task with known answers) and `claims` (the claims table and the mask-cost projection)."""
