"""Where a verdict flips (issue 48 item 3): every number a verdict rests on that the article does not state, swept
over the range a reader could defend, through the same code that computed the lab's figure.

A claim's `record.Assumption` names the number, the value the lab used, its source and a plausible range. `flips`
recomputes the lab's figure at values across (and beyond) that range, judges each by the claim's rule, and finds by
bisection every value where the verdict changes. A flip inside the plausible range means the verdict is the
assumption's, not the evidence's: the ledger then says "not distinguishable" and states the range. A flip outside
it is shown too, so a reader who would assume otherwise sees how far they would have to go.

The figure is recomputed either by a function of the assumed value (`Assumption.figure`, which calls what the
notebook's row calls) or through the notebook's own claims table (`Assumption.param`): its `Rebuild` loads the
evidence run's inputs, the parameter is set to each value, the table is rebuilt and the row's figure read back.
At the value the lab used, the recomputation must reproduce the verdict the row has, or the flip point describes
some other figure: `Flip.error` says so and `lab claims --check` fails.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.claims.rebuild import Rebuild, row_figure
from lab.claims.record import Assumption, Claim
from lab.claims.rules import verdict
from lab.claims.table import measured_cell

GRID = 41       # values across the searched span
BISECTIONS = 40
WIDEN = 4.0     # the search goes this far beyond the plausible range (a factor on a log scale, spans on a linear one)


@dataclass(frozen=True)
class Flip:
    """An assumption swept: the verdict at the value used (`at_value`), every value where it changes over the searched
    span (`points`, ascending), and `error` where the figure could not be recomputed or does not reproduce the row."""
    assumption: Assumption
    at_value: str = ""
    points: tuple[float, ...] = ()
    span: tuple[float, float] = (math.nan, math.nan)
    error: str = ""

    @property
    def inside(self) -> tuple[float, ...]:
        a = self.assumption
        return tuple(x for x in self.points if a.low <= x <= a.high)

    def text(self) -> str:
        a = self.assumption
        head = f"{a.name} = {_g(a.value)} {a.unit} ({a.source}); plausible {_g(a.low)}-{_g(a.high)} {a.unit} " \
               f"({a.plausible})"
        if self.error:
            return f"{head}: {self.error}"
        if not self.points:
            return f"{head}: the verdict does not flip between {_g(self.span[0])} and {_g(self.span[1])} {a.unit}"
        where = ", ".join(f"{_g(x)} {a.unit}" for x in self.points)
        return f"{head}: flips at {where}" + (", inside the plausible range" if self.inside else
                                              ", outside the plausible range")


def _g(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _span(a: Assumption) -> np.ndarray:
    if a.log:
        return np.geomspace(a.low / WIDEN, a.high * WIDEN, GRID)
    width = a.high - a.low
    return np.linspace(a.low - (WIDEN - 1) / 2 * width, a.high + (WIDEN - 1) / 2 * width, GRID)


def through_rebuild(claim: Claim, param: str, rebuild: Rebuild, run_dir: Path,
                    tables: dict | None = None) -> Callable[[float], float]:
    """The claim's figure as a function of the notebook parameter `param`: the run's inputs loaded once, the
    parameter set on the one input that carries it (the notebook's parameters), the claims table rebuilt and the
    claim's row read back by its link's pattern. `tables` keeps the inputs and each rebuilt table for the other
    claims of the same run that sweep the same parameter (half the rebuilds of `lab claims` were repeats)."""
    tables = {} if tables is None else tables
    run = (rebuild.notebook, str(run_dir))
    if run not in tables:
        tables[run] = rebuild.load(Path(run_dir))
    inputs = tables[run]
    holder = next((k for k, v in inputs.items() if dataclasses.is_dataclass(v) and hasattr(v, param)), None)
    if holder is None:
        raise ValueError(f"no input of {rebuild.notebook}'s claims table carries the parameter {param!r}")
    kind = type(getattr(inputs[holder], param))

    def figure(x: float) -> float:
        value = int(round(x)) if kind is int else kind(x)
        key = (*run, holder, param, value)
        if key not in tables:
            tables[key] = rebuild.table({**inputs, holder: dataclasses.replace(inputs[holder], **{param: value})})
        table = tables[key]
        number = row_figure(table, claim.link.match, lambda row: claim.link.figure(measured_cell(row)))
        if number is None:
            raise ValueError(f"the rebuilt table has no figure for {claim.link.match!r} at {param}={value}")
        return float(number.text)
    return figure



def flips(claim: Claim, a: Assumption, row_verdict: str, figure: Callable[[float], float]) -> Flip:
    """`a` swept by `figure` and judged by `claim.rule`; `row_verdict` is the rules' verdict on the row's own
    figure (without its interval), which the recomputation at the value used must give."""
    if a.rule is not None:  # the threshold moves, the figure stays the row's
        judge = lambda x: verdict(a.rule(float(x)), figure(x))  # noqa: E731
    else:
        judge = lambda x: verdict(claim.rule, figure(x))  # noqa: E731
    try:
        at_value = judge(a.value)
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be recomputed has no flip point
        return Flip(a, error=f"the figure could not be recomputed ({type(exc).__name__}: {exc})")
    if at_value != row_verdict:
        return Flip(a, at_value, error=f"recomputed at the value used it gives {at_value!r}, the row {row_verdict!r}")
    seen = []
    for x in _span(a):
        try:
            seen.append((float(x), judge(x)))
        except Exception as exc:  # noqa: BLE001 - beyond the plausible range a study may refuse a value (a median
            # above its P90): the search stops there; inside the range the figure must be computable
            if a.low <= x <= a.high:
                return Flip(a, at_value, error=f"the figure could not be recomputed at {_g(x)} {a.unit} "
                                                f"({type(exc).__name__}: {exc})")
    points = []
    for (x0, v0), (x1, v1) in zip(seen, seen[1:]):
        if v0 == v1:
            continue
        lo, hi = x0, x1
        for _ in range(BISECTIONS):
            mid = math.sqrt(lo * hi) if a.log else (lo + hi) / 2
            lo, hi = (mid, hi) if judge(mid) == v0 else (lo, mid)
        points.append(float(hi))
    return Flip(a, at_value, tuple(points), (seen[0][0], seen[-1][0]))
