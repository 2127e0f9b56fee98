"""Evaluation sets of the lab; see `sensitive` for the quantization-sensitive items."""
