"""How each notebook's claims table is rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`), for the
evidence-level mutation test: one module per notebook, each defining `REBUILD`; `REBUILDS` collects them by
notebook. A notebook missing here has no claims table computed from measured inputs."""

from __future__ import annotations

import importlib

from lab.claims.rebuild import Rebuild

# notebook -> the module under lab.studies.evidence that defines its REBUILD
MODULES = {"01_memory_accounting": "memory_accounting", "02_quantization_accuracy": "quant_accuracy",
           "03_kv_quantization": "kv_quantization", "04_replay_break_even": "replay_break_even",
           "05_speculative_acceptance": "spec_acceptance", "06_serving_ttft": "serving",
           "07_structured_output": "structured_output", "08_parallelism": "parallelism",
           "09_ttft_claims": "ttft_claims"}


def rebuilds() -> dict[str, Rebuild]:
    """Every notebook's `Rebuild`, by notebook (imported on first use: the studies pull in torch)."""
    return {nb: importlib.import_module(f"{__name__}.{mod}").REBUILD for nb, mod in MODULES.items()}
