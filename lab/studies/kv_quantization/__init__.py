"""Notebook 03, KV-cache quantization, as one package: `params` (presets and format names), `measure` (error
growth with context, end to end, concurrency), `plots`, and `claims` (intervals and the claims table). The
notebook calls the first three through this package's names and `claims` by its own."""

from lab.studies.kv_quantization import claims  # noqa: F401
from lab.studies.kv_quantization.measure import *  # noqa: F401,F403
from lab.studies.kv_quantization.params import *  # noqa: F401,F403
from lab.studies.kv_quantization.plots import *  # noqa: F401,F403
