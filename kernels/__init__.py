"""Triton kernels of the lab, imported as `lab.kernels` (never as a top-level `kernels`, which would
clash with the Hugging Face `kernels` package). The attention, KV-write and replay kernels arrive
with the Triton issue; the engine's `attention_backend="torch"` is the reference they are tested against."""
