"""Gathering the ledger: each claim's row found in its notebook's latest reference run, judged, and written out.

The notebooks' claims tables grew different shapes (a "claim" or an "article (...)" column; "the lab computes",
"measured here" or "evidence"; a "verdict" text and/or a "holds" flag); `columns` maps them onto one. A linked
row that the latest reference run no longer has is kept as "evidence missing", naming the notebook, so a
changed table cannot drop a claim from the ledger silently.

The notebooks compute their verdicts with the ledger's rules (`lab.claims.rules.verdict`), so for a claim with a
rule the ledger's verdict on the row's printed figure and the notebook's agree; where they do not, the entry
shows the rules' verdict, says what the notebook said, and `lab claims --check` fails (`Entry.disagrees`): the
notebook judged by another rule, or printed too few digits for its verdict to be read back.

A verdict then says where it holds (issue 40): the evidence's kind and setting (`lab.claims.setting`) go beside
the claim's, and `rules.scoped` keeps a verdict only where the claim's scope lets that evidence decide it; else
the row is "not checkable here" and the measured verdict is shown as the verdict in this setting. A physics
bound in the row (`Link.bound`) refutes a claim that asks for more than it allows, and otherwise says what it
allows. The notebook's note on its row (a caveat: "on this machine", "for every output that finished") travels
into the row's why; a verdict is never read from it (issue 48 item 4): a notebook that scoped its own row writes
the scoped verdict, and the ledger recomputes the measured one by the claim's rule.

Where the claim's words admit several readings (`record.Reading`), each is judged and the verdict stands only where
they agree; where the verdict rests on a number the article does not state (`record.Assumption`), the number is
swept over its plausible range through the same code (`lab.claims.assumptions`), and a verdict that flips inside
the range is not distinguishable (issue 48 item 3).
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from lab.claims import assumptions
from lab.claims.rebuild import Rebuild
from lab.claims.record import Claim
from lab.claims.rules import (ARGUMENT, BY_ARGUMENT, MEASURED, MISSING, NO_EVIDENCE, NOT_DISTINGUISHABLE, PHYSICS_BOUND,
                              ROUNDING, WRONG, Evidence, all_of, beyond, from_notebook, judge, parse_lab, scoped, side,
                              undecided_by, verdict)
from lab.claims.setting import describe, run_evidence
from lab.claims.table import columns
from lab.workflow.index import list_runs



@dataclass(frozen=True)
class Entry:
    """A claim with what its latest evidence says: the lab's figure, the verdict, and where it came from."""
    claim: Claim
    lab: str
    verdict: str
    why: str
    run_dir: Path | None = None
    table: str = ""
    row: int | None = None  # 1-based data row of the table
    notebook_verdict: str = ""
    evidence: str = NO_EVIDENCE
    lab_setting: str = ""
    in_setting: str = ""  # the measured verdict where the claim's scope does not let this evidence decide
    undecided_by: str = ""  # which dimension of the lab's setting kept the evidence from deciding the claim
    assumptions: str = ""  # each reading judged, each unstated number with where the verdict flips
    flips: tuple = ()  # the `assumptions.Flip` of each assumption (for `lab claims --check`)
    measured: str = ""  # the rules' verdict on the row's figure, before readings, assumptions and scope

    @property
    def disagrees(self) -> bool:
        """The rules give the row's printed figure another verdict than its notebook wrote: the notebook's verdict
        is neither the rules' on its figure nor that verdict as the scope leaves it (a notebook may scope its own
        row, as notebook 02 does on an already-4-bit model)."""
        if self.claim.rule is None or self.verdict == MISSING:
            return False
        return self.notebook_verdict not in {self.measured, self.verdict, self.in_setting} - {""}


def latest_reference_runs(root: Path) -> dict[str, Path]:
    """Each notebook's latest run at the reference preset under `root`."""
    return {r["notebook"]: r["dir"] for r in list_runs(root) if r["preset"] == "reference"}


def latest_runs(paths: list[Path]) -> dict[str, Path]:
    """Each notebook's latest finished run among `paths`, at any preset (a user's runs on their model, issue 51):
    each path a run directory (holding params.json) or a folder of them (`lab run --results-dir`). A path that
    holds no finished run is refused by name: a ledger built from nothing would look like a ledger of nothing."""
    found = []
    for path in map(Path, paths):
        if (path / "params.json").exists():
            runs = [r for r in list_runs(path.parent.parent) if r["dir"] == path]
        else:
            runs = list_runs(path)
        if not runs:
            raise FileNotFoundError(f"{path} holds no finished run (a run directory with params.json and "
                                    f"metrics.json, or a folder of them as `lab run --results-dir` writes)")
        found += runs
    latest = {}
    for r in sorted(found, key=lambda r: r["run_id"]):  # run ids sort in the order the runs started
        latest[r["notebook"]] = r["dir"]
    return latest


def find_rows(table: Path, match: str) -> list[tuple[int, dict, tuple]]:
    """The rows of `table` whose claim cell contains `match`, with their 1-based index and column names."""
    with table.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = columns(reader.fieldnames or [])
        return [(i, row, cols) for i, row in enumerate(reader, start=1) if match in row[cols[0]]]


def resolve(claim: Claim, runs: dict[str, Path], rebuilds: dict[str, Rebuild] | None = None,
            tables: dict | None = None) -> Entry:
    """`claim` against its notebook's latest reference run (unlinked claims pass through); `rebuilds` (each notebook's
    `Rebuild`) recompute a figure whose assumption is a notebook parameter."""
    if claim.link is None:
        return Entry(claim, "", claim.verdict, claim.why, evidence=ARGUMENT if claim.verdict == BY_ARGUMENT
                     else NO_EVIDENCE)
    link = claim.link
    run = runs.get(link.notebook)
    table = run / link.table if run else None
    if table is None or not table.exists():
        where = f"no run of {link.notebook} was read" if run is None else f"{link.table} is not in {run.name}"
        return Entry(claim, "", MISSING, f"{where} (notebook {link.notebook})", run, link.table)
    rows = find_rows(table, link.match)
    if len(rows) != 1:
        what = "no row" if not rows else f"{len(rows)} rows"
        return Entry(claim, "", MISSING, f"{what} of {link.notebook}'s {link.table} matches {link.match!r} "
                                         f"(notebook {link.notebook})", run, link.table)
    index, row, (_, lab_col, verdict_col, holds_col) = rows[0]
    said = from_notebook(row.get(verdict_col) if verdict_col else None, row.get(holds_col) if holds_col else None)
    lab = row[lab_col]
    # the notebook's note (its caveat, or the argument of a verdict by argument) travels with the row
    why = "; ".join(x for x in (row.get("note", ""), claim.why) if x)
    verdict = said
    if claim.rule is not None:
        number = link.figure(lab)
        if number is None:
            return Entry(claim, lab, MISSING, f"no number in {link.notebook}'s row {index} (notebook {link.notebook})",
                         run, link.table, index, said)
        verdict = judge(claim.rule, number)
    if claim.parts:
        verdict, parts = parts_verdict(claim, lab)
        why = "; ".join(x for x in (parts, why) if x)
    entry = _unstated(Entry(claim, lab, verdict, why, run, link.table, index, said, measured=verdict), rebuilds or {},
                      tables)
    if said in MEASURED and said not in (entry.verdict, entry.measured):  # shown, not overridden silently
        entry = dataclasses.replace(entry, why=f"the notebook says {said!r}; the rules give {entry.verdict!r} from its "
                                               f"figure" + (f": {entry.why}" if entry.why else ""))
    return _scoped(entry)


def parts_verdict(claim: Claim, lab: str) -> tuple[str, str]:
    """(the verdict, each part's figure and verdict in words) of a claim made of parts: `rules.all_of` the parts'
    verdicts, each by its own rule on the figure its pattern picks from the row; a part without a figure is
    missing, and so is the claim."""
    said = []
    for part in claim.parts:
        number = parse_lab(lab, part.lab_pattern)
        said.append((part.name, number, judge(part.rule, number) if number else MISSING))
    words = "; ".join(f"{name}: {n.text if n else '?'} ({v})" for name, n, v in said)
    if any(v == MISSING for _, _, v in said):
        return MISSING, f"a part's figure is not in the row: {words}"
    return all_of(*(v for _, _, v in said)), f"parts: {words}"


def _unstated(entry: Entry, rebuilds: dict[str, Rebuild], tables: dict | None = None) -> Entry:
    """`entry` with each reading of the claim judged and each assumption swept: the verdict stands where the readings
    agree and no assumption flips it inside its plausible range, else it is not distinguishable."""
    claim = entry.claim
    if claim.rule is None or not (claim.readings or claim.assumptions):
        return entry
    verdict, notes, found = entry.verdict, [], []
    if claim.readings:
        judged = []
        for r in claim.readings:
            number = parse_lab(entry.lab, r.lab_pattern)
            judged.append((r.name, number.text if number else "?", judge(claim.rule, number) if number else MISSING))
        notes.append("readings: " + "; ".join(f"{name}: {fig} ({v})" for name, fig, v in judged))
        verdicts = {v for _, _, v in judged}
        sides = {side(claim.rule, float(fig)) for _, fig, v in judged if v in (WRONG, ROUNDING)}
        # readings that disagree, or that miss the claim on both sides (the range between two ways of computing it
        # spans the claim, and a way in between would hold), decide nothing
        if (len(verdicts) > 1 or len(sides) > 1) and verdict in MEASURED:
            verdict = NOT_DISTINGUISHABLE
    point = claim.link.figure(entry.lab)
    row_verdict = verdict_of(claim, point.text) if point else ""
    for a in claim.assumptions:
        flip = _sweep(a, entry, point, row_verdict, rebuilds, tables)
        found.append(flip)
        notes.append(flip.text())
        if flip.inside and verdict in MEASURED:
            verdict = NOT_DISTINGUISHABLE
    return dataclasses.replace(entry, verdict=verdict, assumptions="; ".join(notes), flips=tuple(found))


def _sweep(a, entry: Entry, point, row_verdict: str, rebuilds: dict[str, Rebuild],
           tables: dict | None = None) -> assumptions.Flip:
    """Assumption `a` of the entry's claim swept to its flip points: read from the row where the notebook computed
    them (`flip_pattern`), else recomputed (the rule at each threshold on the row's figure, a function of the value,
    or the notebook's claims table through its `Rebuild`)."""
    claim = entry.claim
    if a.flip_pattern:
        at = parse_lab(entry.lab, a.flip_pattern)
        if at is None:
            return assumptions.Flip(a, error=f"no flip point in the row ({a.flip_pattern!r})")
        return assumptions.Flip(a, row_verdict, (float(at.text),), (a.low, a.high))
    if point is None:
        return assumptions.Flip(a, error="no figure in the row to sweep")
    try:
        if a.rule is not None:
            figure = lambda _, v=float(point.text): v  # noqa: E731 - the row's figure, whatever the threshold
        else:
            figure = a.figure or assumptions.through_rebuild(claim, a.param, rebuilds[claim.link.notebook],
                                                             entry.run_dir, tables)
    except (KeyError, ValueError, OSError) as exc:
        return assumptions.Flip(a, error=f"no way to recompute the figure ({type(exc).__name__}: {exc})")
    return assumptions.flips(claim, a, row_verdict, figure)


def verdict_of(claim: Claim, text: str) -> str:
    """The rules' verdict on one printed figure of the claim's row, without its interval."""
    return verdict(claim.rule, float(text))


def _scoped(entry: Entry) -> Entry:
    """`entry` with its evidence and setting, and its verdict kept only where the claim's scope lets this evidence
    decide it (`rules.scoped`, for the claim's class of model), after a physics bound in the row (`Link.bound`) has
    had its say."""
    claim, link = entry.claim, entry.claim.link
    evidence = run_evidence(entry.run_dir, link.evidence)
    setting = describe(entry.run_dir, evidence, link.setting)
    verdict, why = entry.verdict, entry.why
    in_setting, kept = "", ""
    if claim.scope:  # a row not yet scoped keeps its verdict (`lab claims --check` fails on it)
        verdict, in_setting = scoped(claim.scope, evidence, entry.verdict, claim.model)
        kept = undecided_by(claim.scope, evidence, claim.model) if in_setting else ""
    bound = parse_lab(entry.lab, link.bound) if link.bound and claim.rule is not None else None
    if bound is not None and in_setting:
        if beyond(claim.rule, bound.text):
            verdict, evidence, kept = WRONG, Evidence(PHYSICS_BOUND), ""
            why = "; ".join(x for x in (f"more than the physics bound ({bound.text}) allows", why) if x)
        else:
            why = "; ".join(x for x in (f"the physics bound allows {bound.text}; measured in this setting: "
                                        f"{in_setting}", why) if x)
    return dataclasses.replace(entry, verdict=verdict, why=why, evidence=evidence.kind, lab_setting=setting,
                               in_setting=in_setting, undecided_by=kept)


def gather(claims: list[Claim], root: Path | None, rebuilds: dict[str, Rebuild] | None = None,
           runs: dict[str, Path] | None = None) -> list[Entry]:
    """Each claim resolved against `runs` ({notebook: run directory}; default: the latest reference runs under
    `root`)."""
    runs = latest_reference_runs(root) if runs is None else runs
    tables: dict = {}  # the rebuilt claims tables, shared by the claims that sweep one run's parameter
    return [resolve(c, runs, rebuilds, tables) for c in claims]
