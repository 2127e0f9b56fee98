"""Inference Lab: a reference inference engine, kernels and studies for checking inference folklore."""

__version__ = "0.1.0"
