"""A quick run's verdicts beside its notebook's reference run's: does the smaller run answer the same question?

`make run` runs every notebook at its `quick` preset, on fewer points than the committed `reference` runs. A
quick run is only worth its minutes if it reaches the reference's verdicts, or says where it does not (a claim
that is "holds" on 8K tokens of context may be "not distinguishable" on 2K). `compare_verdicts` reads both
runs' claims tables (`claims.csv`, the one shape of `lab.claims.table.claim_row`) and pairs their rows by claim;
`lab run` prints the result after each notebook and in its closing summary, so a reader of a quick run sees
which of its verdicts the reference run shares and which it does not, by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CLAIMS_TABLE = "claims.csv"


@dataclass
class Agreement:
    reference: Path  # the reference run compared against
    agree: int = 0
    differ: list[tuple[str, str, str]] = field(default_factory=list)  # (claim, this run's verdict, reference's)
    only_here: list[str] = field(default_factory=list)  # claims the reference run's table does not have
    only_reference: list[str] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return self.agree + len(self.differ)

    def summary(self) -> str:
        """One line, then a line per differing verdict."""
        text = (f"verdicts: {self.agree} of {self.compared} agree with reference run {self.reference.name}"
                + (f"; {len(self.only_here)} claims not in it" if self.only_here else "")
                + (f"; {len(self.only_reference)} of its claims not in this run" if self.only_reference else ""))
        return "\n".join([text] + [f"    differs: {claim!r}: here {here!r}, reference {ref!r}"
                                   for claim, here, ref in self.differ])


def latest_reference(notebook: str, root: Path) -> Path | None:
    """The newest reference run of `notebook` under `root` that finished (has a metrics.json without a failure)."""
    from lab.workflow.index import list_runs

    runs = [r for r in list_runs(root) if r["notebook"] == notebook and r["preset"] == "reference"
            and r["metrics"] and r["metrics"].get("status") != "failed"]
    return runs[-1]["dir"] if runs else None


def _verdicts(run_dir: Path) -> dict[str, str]:
    import pandas as pd

    table = pd.read_csv(run_dir / CLAIMS_TABLE, keep_default_na=False)
    return dict(zip(table["claim"].astype(str), table["verdict"].astype(str)))


def compare_verdicts(run_dir: Path, reference_dir: Path) -> Agreement | None:
    """This run's verdicts against the reference run's, claim by claim; None where either has no claims table."""
    if not (run_dir / CLAIMS_TABLE).exists() or not (reference_dir / CLAIMS_TABLE).exists():
        return None
    here, ref = _verdicts(run_dir), _verdicts(reference_dir)
    result = Agreement(reference_dir)
    for claim, verdict in here.items():
        if claim not in ref:
            result.only_here.append(claim)
        elif verdict == ref[claim]:
            result.agree += 1
        else:
            result.differ.append((claim, verdict, ref[claim]))
    result.only_reference = [c for c in ref if c not in here]
    return result


def against_reference(run_dir: Path, reference_root: Path) -> str:
    """What `lab run` prints after a non-reference run: its verdicts against the notebook's latest reference
    run under `reference_root` (the committed results), or why there is nothing to compare."""
    reference = latest_reference(run_dir.parent.name, reference_root)
    if reference is None:
        return "verdicts: no reference run to compare with"
    agreement = compare_verdicts(run_dir, reference)
    if not agreement:
        return "verdicts: this notebook writes no claims table"
    return agreement.summary() + "".join(f"\n    {note}: a verdict may differ for that reason alone"
                                         for note in setting_differences(run_dir, reference))


def setting_differences(run_dir: Path, reference_dir: Path) -> list[str]:
    """Where two runs' settings differ besides their sizes: the model, and the CPU (its name, and where both runs
    record it, `lab.machine.hardware.cpu_signature`: the name alone hides whether a Xeon has AMX)."""
    import json

    from lab.machine.hardware import describe_cpu

    here, ref = (json.loads((d / "params.json").read_text()) for d in (run_dir, reference_dir))
    notes = []
    models = [p["parameters"].get("MODEL") for p in (here, ref)]
    if models[1] is None and models[0] is not None:
        notes.append(f"the reference run records no MODEL (it predates the parameter; this run's is {models[0]})")
    elif models[0] != models[1]:
        notes.append(f"on another model than the reference run's ({models[0]}, not {models[1]})")
    signatures = [p.get("cpu_signature") for p in (here, ref)]
    if not all(signatures):  # a run older than the signature: compare the names alone
        signatures = [None, None]
    cpus = [describe_cpu(p.get("cpu", "?"), sig) for p, sig in zip((here, ref), signatures)]
    if cpus[0] != cpus[1]:
        notes.append(f"on another CPU than the reference run's ({cpus[0]}, not {cpus[1]})")
    return notes
