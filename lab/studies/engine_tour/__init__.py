"""Notebook 00, the engine tour, as one package: `measure` (one batch followed through tokenize, schedule,
allocate, prefill, decode and a prefix-cache hit, with the KV pool over time)."""
