"""The evidence-level mutation test (issue 48 item 2): a measured figure must be able to move with its evidence.

The verdict-level mutation test (`tests/test_ledger_checks.py`) moves the lab's *output* number across the claim's
band and checks that the verdict follows; it cannot see a figure that is fixed by how it is computed (a ratio whose
numerator is set to its denominator is 1.00x whatever was measured; a share fixed by where the lab inserted a
timestamp is 50% whatever the cache did; a drop measured from a baseline that passes nothing is zero). This module
goes one step back: for each notebook with claims, a `Rebuild` loads the inputs its claims table is computed from
(the run's own CSVs and measured scalars) and calls the study's own `claims_table` on them, so perturbing an input
and rebuilding recomputes every figure through the same code. A figure that no perturbation of any measured input
moves is computed by construction: `by_construction` names it, and `lab claims --check` fails on it unless the
claim is the article's own arithmetic (whose figure its stated inputs fix, by design) or is made an argument.

The perturbations (`HOWS`) are chosen to move every kind of figure a table prints: a scale by 2, 1000 and a million
either way (absolute figures; a count of points where one side wins by a wide margin, or by over 1000x), a tilt across rows (ratios between
rows, slopes over a sweep), seeded noise (anything that reads single values) and a shift (a column at zero, a floor,
which no scale can move). What an input holds that is a setting
rather than a measurement (the prefix lengths of a sweep, a prompt's token count) is named in `Rebuild.settings`,
so the choice to hold it fixed is in sight; a figure that moves only with a setting is still by construction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.claims.table import columns

# Loaded inputs: the claims table's arguments by name (DataFrames, measured scalars, the run's parameters).
Inputs = dict[str, Any]


@dataclass(frozen=True)
class Rebuild:
    """How notebook `notebook`'s claims table is recomputed from one of its runs: `load(run_dir)` gives the inputs
    by name, `table(inputs)` calls the study's own claims-table function on them and returns the table as the
    notebook saved it (`name`, default claims.csv). `settings` names, per input, the numeric columns (or, for a
    scalar input, the input itself) that are settings of the run, not measurements, and stay unperturbed; `fixed`
    names inputs that are not evidence at all (the run's parameters, a tokenizer)."""
    notebook: str
    load: Callable[[Path], Inputs]
    table: Callable[[Inputs], pd.DataFrame]
    settings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    fixed: tuple[str, ...] = ()
    name: str = "claims.csv"


def run_parameters(run_dir: Path, params_class: type):
    """A run's notebook parameters (params.json's "parameters") as `params_class`, keeping only its fields (the
    preset's and the runner's keys are not the study's); a GPU run's DEVICE becomes "auto", since no claim reads it
    and a CPU refuses a CUDA device."""
    given = json.loads((Path(run_dir) / "params.json").read_text())["parameters"]
    kept = {k: v for k, v in given.items() if k in {f.name for f in dataclasses.fields(params_class)}}
    if kept.get("DEVICE", "auto") not in ("auto", "cpu"):
        kept["DEVICE"] = "auto"
    return params_class(**kept)


@dataclass(frozen=True)
class Perturbation:
    """One change to one measured input: `what` names it ("measured.csv:recompute_ms x2")."""
    what: str
    apply: Callable[[Inputs], Inputs]


def _scaled(values: np.ndarray, how: str, seed: int) -> np.ndarray:
    n = len(values)
    if how == "x2":
        return values * 2.0
    if how == "x0.5":
        return values * 0.5
    if how == "x1000":  # far enough to cross a wide margin (a count of points where one side wins by 50x)
        return values * 1000.0
    if how == "x0.001":
        return values * 0.001
    if how == "x1e6":  # a count of points where one side wins by over 1000x (04: recompute 1,271x a host read)
        return values * 1e6
    if how == "x1e-6":
        return values * 1e-6
    if how == "tilt":  # the last row doubled, the first unchanged: moves ratios between rows and slopes
        return values * (1.0 + np.linspace(0.0, 1.0, n)) if n > 1 else values * 2.0
    if how == "noise":
        return values * np.exp(0.4 * np.random.default_rng(seed).standard_normal(n))
    if how == "shift":  # moves a column at zero, which no scale can
        scale = np.nanmax(np.abs(values)) if n and np.isfinite(values).any() else 0.0
        return values + (0.25 * scale if scale > 0 else 1.0)
    raise ValueError(how)


HOWS = ("x2", "x0.5", "tilt", "noise", "shift", "x1000", "x0.001", "x1e6", "x1e-6")


def _numeric_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]


def perturbations(rebuild: Rebuild, inputs: Inputs) -> Iterator[Perturbation]:
    """Every perturbation of every measured input: each numeric column of each DataFrame, each float scalar, and
    each numeric field of a dataclass input, by each of `HOWS`; what `rebuild` names as settings or fixed is left."""
    for name, value in inputs.items():
        if name in rebuild.fixed:
            continue
        held = set(rebuild.settings.get(name, ()))
        if isinstance(value, pd.DataFrame):
            for col in _numeric_columns(value):
                if col in held:
                    continue
                for how in HOWS:
                    yield Perturbation(f"{name}:{col} {how}", _frame_change(name, col, how))
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
                and name not in held:
            for how in HOWS:
                yield Perturbation(f"{name} {how}", _scalar_change(name, how))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                v = getattr(value, f.name)
                if isinstance(v, float) and f.name not in held:
                    for how in HOWS:
                        yield Perturbation(f"{name}.{f.name} {how}", _field_change(name, f.name, how))


def _seed(*parts: str) -> int:
    return sum(ord(ch) * (i + 1) for i, ch in enumerate("/".join(parts))) % (2 ** 31)


def _frame_change(name: str, col: str, how: str) -> Callable[[Inputs], Inputs]:
    def apply(inputs: Inputs) -> Inputs:
        df = inputs[name].copy()
        values = df[col].to_numpy(dtype=float)
        df[col] = _scaled(values, how, _seed(name, col))
        return {**inputs, name: df}
    return apply


def _scalar_change(name: str, how: str) -> Callable[[Inputs], Inputs]:
    def apply(inputs: Inputs) -> Inputs:
        return {**inputs, name: float(_scaled(np.array([float(inputs[name])]), how, _seed(name))[0])}
    return apply


def _field_change(name: str, fname: str, how: str) -> Callable[[Inputs], Inputs]:
    def apply(inputs: Inputs) -> Inputs:
        obj = inputs[name]
        new = float(_scaled(np.array([float(getattr(obj, fname))]), how, _seed(name, fname))[0])
        return {**inputs, name: dataclasses.replace(obj, **{fname: new})}
    return apply


def row_figure(table: pd.DataFrame, match: str, figure: Callable[[dict], Any],
               claims: list[str] | None = None) -> Any:
    """The figure of the one row of `table` whose claim cell contains `match` (None when not exactly one row).
    `claims`, the table's claim cells as strings, saves reading them again when many rows of one table are read."""
    if claims is None:
        claims = _claim_cells(table)
    hits = [i for i, cell in enumerate(claims) if match in cell]
    if len(hits) != 1:
        return None
    return figure(table.iloc[hits[0]].to_dict())


def _claim_cells(table: pd.DataFrame) -> list[str]:
    return table[columns(list(table.columns))[0]].astype(str).tolist()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@dataclass(frozen=True)
class Movement:
    """What the perturbations did to one row's figure: `base` unperturbed, `moved_by` the perturbations that moved
    it (empty: computed by construction), `failed` those under which the claims table could not be rebuilt."""
    match: str
    base: Any
    moved_by: tuple[str, ...]
    failed: tuple[str, ...] = ()

    @property
    def by_construction(self) -> bool:
        return not self.moved_by


def movements(rebuild: Rebuild, run_dir: Path, rows: dict[str, Callable[[dict], Any]],
              stop_at: int = 1) -> dict[str, Movement]:
    """For each figure (a key -> how to read it from its row's cells; the key is the row's `match`, optionally
    followed by a NUL and a name, so one row can have several figures followed), the perturbations that move it;
    once a figure has moved under `stop_at` perturbations it is no longer followed (a figure that moves once is not
    fixed by construction)."""
    tables = _perturbed_tables(rebuild, rebuild.load(Path(run_dir)))
    match = {k: k.split("\0")[0] for k in rows}
    base_table, base_claims = tables.base
    base = {m: row_figure(base_table, match[m], f, base_claims) for m, f in rows.items()}
    moved: dict[str, list[str]] = {m: [] for m in rows}
    failed: list[str] = []
    for what, table, claims, error in tables:
        open_rows = [m for m in rows if len(moved[m]) < stop_at]
        if not open_rows:
            break
        if error is not None:  # a perturbation the study's code refuses moves nothing
            failed.append(f"{what}: {error}")
            continue
        for m in open_rows:
            if not _same(row_figure(table, match[m], rows[m], claims), base[m]):
                moved[m].append(what)
    return {m: Movement(m, base[m], tuple(moved[m]), tuple(failed)) for m in rows}


class _PerturbedTables:
    """One run's claims table rebuilt under each of its perturbations, in `perturbations` order, computed as far as
    a reader has asked and kept: every figure followed on the same evidence reads the same rebuilt tables."""

    def __init__(self, rebuild: Rebuild, inputs: Inputs):
        self.rebuild, self.inputs = rebuild, inputs
        base = rebuild.table(inputs)
        self.base = (base, _claim_cells(base))
        self.done: list[tuple[str, pd.DataFrame | None, list[str] | None, str | None]] = []
        self._todo = perturbations(rebuild, inputs)

    def __iter__(self):
        i = 0
        while True:
            if i == len(self.done):
                p = next(self._todo, None)
                if p is None:
                    return
                try:
                    table = self.rebuild.table(p.apply(self.inputs))
                    self.done.append((p.what, table, _claim_cells(table), None))
                except Exception as exc:  # noqa: BLE001 - recorded; `movements` reports it as failed
                    self.done.append((p.what, None, None, f"{type(exc).__name__}: {exc}"))
            yield self.done[i]
            i += 1


# Rebuilt tables by (rebuild, the content of its inputs), for this process: `lab claims --check` and the tests
# follow the same evidence many times over (a copied run directory is the same evidence), and a claims table under
# one perturbation is the same table whichever figure is read from it. Keyed by content, never by path, so an
# edited copy of a run is rebuilt afresh; not by the study's code, which does not change within a process (a test
# that patches a study's claims code must rebuild through a `Rebuild` of its own, as tests/test_ledger_skeptic.py's do).
_TABLES: dict[tuple, _PerturbedTables] = {}


def _perturbed_tables(rebuild: Rebuild, inputs: Inputs) -> _PerturbedTables:
    key = _fingerprint(inputs)
    if key is None:  # an input whose content cannot be read off: rebuilt every time
        return _PerturbedTables(rebuild, inputs)
    # by the rebuild's identity (it holds a dict, so it has no hash); the entry keeps it alive, so its id is not reused
    if (id(rebuild), key) not in _TABLES:
        _TABLES[(id(rebuild), key)] = _PerturbedTables(rebuild, inputs)
    return _TABLES[(id(rebuild), key)]


def _fingerprint(value: Any) -> str | None:
    """A digest of `value`'s content (frames by their cells, index and dtypes; dataclasses, mappings and sequences
    by their parts), or None where some part is of a kind it does not know."""
    h = hashlib.sha1()

    def feed(v: Any) -> bool:
        if isinstance(v, pd.DataFrame):
            h.update(repr((list(v.columns), [str(t) for t in v.dtypes], v.shape)).encode())
            h.update(pd.util.hash_pandas_object(v, index=True).to_numpy().tobytes())
        elif isinstance(v, pd.Series):
            h.update(repr((v.name, str(v.dtype), len(v))).encode())
            h.update(pd.util.hash_pandas_object(v, index=True).to_numpy().tobytes())
        elif isinstance(v, np.ndarray):
            if v.dtype.hasobject:  # its bytes are the objects' addresses, not their content
                return False
            h.update(repr((v.dtype.str, v.shape)).encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif v is None or isinstance(v, (str, bytes, bool, int, float, np.integer, np.floating, Path)):
            h.update(f"{type(v).__name__}:{v!r};".encode())
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            h.update(f"{type(v).__module__}.{type(v).__qualname__}(".encode())
            return all(feed(f.name) and feed(getattr(v, f.name)) for f in dataclasses.fields(v))
        elif isinstance(v, dict):
            h.update(b"{")
            return all(feed(k) and feed(x) for k, x in sorted(v.items(), key=lambda kv: repr(kv[0])))
        elif isinstance(v, (list, tuple)):
            h.update(f"{type(v).__name__}[{len(v)}]".encode())
            return all(feed(x) for x in v)
        else:
            return False
        return True
    return h.hexdigest() if feed(value) else None
