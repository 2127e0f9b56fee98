"""Notebook 02, weight quantization and accuracy, as one package: `measure` (the quantized models, their
perplexity, KL and sensitive-item pass rates, and the claims table), `ladder` (the control and the loss
decomposition), `stats` (paired comparisons with their intervals), `prompts` (held-out Spec-Bench prompts) and
`plots`."""
