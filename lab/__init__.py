"""Inference Lab: a reference inference engine, kernels and studies for checking inference folklore."""

import os

import torch

__version__ = "0.1.0"

# Without CUDA, the Triton kernels (lab.kernels) run in Triton's interpreter. The variable is read when
# Triton defines its own helpers, at its first import, which loading a model may trigger long before
# lab.kernels is imported: so it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
