"""The class of model a claim is about, and of the model a measurement ran on (issue 48 item 1).

A figure that depends on the model (an acceptance rate, a quantization or KV error, how a cost grows with context)
measured on one model says something about another only if the two are of one class: a scale band and an
architecture. A claim about "any model" admits every class; a claim about the article's 70B admits only a
10B-100B dense model, so the embedded SmolLM2-135M ("under 1B dense") decides it only in its own setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ANY = "any"
SCALE_BANDS = ((1e9, "under 1B"), (1e10, "1B-10B"), (1e11, "10B-100B"), (math.inf, "100B and over"))
ARCHITECTURES = ("dense", "MoE")


def scale_band(params: float) -> str:
    """The scale band of a model of `params` parameters ("under 1B", "1B-10B", "10B-100B", "100B and over")."""
    return next(name for top, name in SCALE_BANDS if params < top)


@dataclass(frozen=True)
class ModelClass:
    """A class of models: a scale band (`SCALE_BANDS`) and an architecture (`ARCHITECTURES`), each or both `ANY`
    where the claim is about any model. A claim's class admits a measured model's when each part is `ANY` or
    equal."""
    scale: str = ANY
    arch: str = ANY

    def __post_init__(self):
        if self.scale not in (ANY, *(name for _, name in SCALE_BANDS)):
            raise ValueError(f"scale {self.scale!r} is not one of {[n for _, n in SCALE_BANDS]} or {ANY!r}")
        if self.arch not in (ANY, *ARCHITECTURES):
            raise ValueError(f"architecture {self.arch!r} is not one of {ARCHITECTURES} or {ANY!r}")

    def mismatch(self, measured: ModelClass | None) -> str:
        """Which part of `measured` (a measured model's class; None when unknown) keeps it from standing for this
        class: "" where it does, else e.g. "model scale (measured: under 1B; the claim: 10B-100B)"."""
        if measured is None:
            return "model (the measured model's size is not known)"
        out = [f"{what} (measured: {m}; the claim: {c})" for what, c, m in
               (("model scale", self.scale, measured.scale), ("architecture", self.arch, measured.arch))
               if c != ANY and c != m]
        return "; ".join(out)

    def __str__(self) -> str:
        return "any model" if self.scale == ANY and self.arch == ANY else \
            " ".join(x for x in (self.scale if self.scale != ANY else "", self.arch if self.arch != ANY else "") if x)
