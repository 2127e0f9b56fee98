"""The setting of the lab's evidence for a claim (issue 40): where its figure was measured, projected or computed,
read from the evidence run's recorded parameters, so CLAIMS.md shows it beside the setting the claim is about.

A run records its device (`gpu` is null on this CPU) and its model parameter; the embedded model's weights are a
Q4_1 GGUF dequantized (`lab.models.loader.EMBEDDED_MODELS`), so a measurement on it is not a measurement on 16-bit
weights. A run may state it itself (`weights16` in metrics.json, from notebook 02's detection of an
already-quantized baseline), which then wins over the name.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.claims.model_class import ModelClass, scale_band
from lab.claims.rules import ON_CPU, ON_GPU, Evidence

# the run's measured model: notebook 01's MODEL may be a shape it only accounts, its ENGINE_MODEL ran (04's
# LOSSLESS_MODEL: its runs before issue 51)
MODEL_PARAMS = ("ENGINE_MODEL", "MODEL", "LOSSLESS_MODEL")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def weights16(model: str | None) -> bool | None:
    """Whether `model`'s weights are 16-bit (or wider): False for an embedded GGUF-derived model, True for a random
    one built from a config (continuous weights), None when the name does not say (a path to a checkpoint)."""
    from lab.models.loader import EMBEDDED_MODELS

    if not model:
        return None
    if model in EMBEDDED_MODELS:
        return False
    return True if model.startswith("random:") else None


def model_class(model: str | None) -> ModelClass | None:
    """The class of `model` (its scale band and architecture): an embedded model's, a `random:<preset>` model's or
    a local checkpoint's, from its shape (`lab.memory.ModelShape`); None where its shape cannot be read."""
    from lab.memory import ModelShape, param_counts

    if not model:
        return None
    try:
        shape = ModelShape.load(model)
    except (OSError, ValueError, KeyError):
        return None
    counts = param_counts(shape)
    return ModelClass(scale_band(counts["total"]), "MoE" if shape.is_moe else "dense")


def _model(params: dict) -> str | None:
    return next((params[k] for k in MODEL_PARAMS if isinstance(params.get(k), str) and params[k]), None)


def run_evidence(run_dir: Path | None, kind: str) -> Evidence:
    """The evidence a linked row gives: `kind` as the link states it, made "measured on a GPU" when the run had
    one, with the run's model's weights for a measurement."""
    if run_dir is None or kind not in (ON_CPU, ON_GPU):
        return Evidence(kind)
    meta = _json(run_dir / "params.json")
    stated = _json(run_dir / "metrics.json").get("weights16")
    w16 = stated if isinstance(stated, bool) else weights16(_model(meta.get("parameters", {})))

    model = _model(meta.get("parameters", {}))
    return Evidence(ON_GPU if meta.get("gpu") else ON_CPU, w16, model_class(model))


def describe(run_dir: Path | None, evidence: Evidence, extra: str = "") -> str:
    """The lab's setting in words: the device and model of a measurement, or what a projection, bound or arithmetic
    rests on (the link's `extra` says which GPU or formula)."""
    if evidence.kind in (ON_CPU, ON_GPU) and run_dir is not None:
        meta = _json(run_dir / "params.json")
        device = meta.get("gpu") or f"{meta.get('cpu', 'a CPU')}, {meta.get('cpu_cores', '?')} cores, no GPU"
        model = _model(meta.get("parameters", {}))
        weights = {False: "weights already 4-bit", True: "16-bit weights", None: ""}[evidence.weights16]
        facts = ", ".join(x for x in (str(evidence.model) if evidence.model else "", weights) if x)
        text = f"{evidence.kind}: {device}" + (f"; {model}" + (f" ({facts})" if facts else "") if model else "")
    else:  # a projection, bound or arithmetic: the link's `extra` says which GPU or formula
        text = evidence.kind
    return f"{text}; {extra}" if extra else text
