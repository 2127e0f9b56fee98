"""`results/CLAIMS.md` and `results/CLAIMS.csv`: the gathered ledger, per seed, with a count per verdict.

The counts keep the three kinds of verdict apart (`lab.ledger.rules`): measured (from a number, by a rule),
wrong by argument (no number decides it; the argument is in the row), and undecided (not checkable here, not yet
checked), so a reader sees how many verdicts a measurement can overturn. Evidence links are relative to the
output directory, so the Markdown reads on GitHub from results/.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

from lab.ledger.gather import Entry
from lab.ledger.record import SEEDS
from lab.ledger.rules import ARGUED, MEASURED, MISSING, UNDECIDED, VERDICTS

ORDER = (*VERDICTS, MISSING)
CSV_COLUMNS = ("id", "seed", "section", "claim", "article", "lab", "verdict", "why", "decider", "notebook", "run",
               "table", "row", "notebook verdict")
HEADER = """# The claims ledger

Every numeric or testable claim of the three source articles (`seeds/`), with the lab's figure and a verdict by
the rules in `lab/ledger/rules.py` (see `docs/claims.md`). Written by `lab claims` from each notebook's latest
reference run; nothing here is typed by hand. "evidence missing" means a claim's row is absent from its
notebook's latest run: `lab claims --check` fails then.

Measured verdicts come from the lab's number by the rules; "wrong by argument" ones from an argument written in
the row, with no number to overturn them; the counts keep them apart. A claim not yet checked names what would
decide it.
"""


def counts(entries: list[Entry]) -> dict[str, Counter]:
    """Verdict counts per seed."""
    out = {seed: Counter() for seed in SEEDS}
    for e in entries:
        out[e.claim.seed][e.verdict] += 1
    return out


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _evidence(e: Entry, out_dir: Path) -> str:
    if e.claim.link is None:
        return ""
    nb = e.claim.link.notebook
    if e.run_dir is None:
        return f"{nb} (no reference run)"
    target = e.run_dir / e.table
    rel = Path(os.path.relpath(target if target.exists() else e.run_dir, out_dir)).as_posix()
    row = f" row {e.row}" if e.row else ""
    return f"{nb}: [{e.run_dir.name}/{e.table}]({rel}){row}"


def summary_lines(entries: list[Entry]) -> list[str]:
    """The verdict counts per seed: the measured verdicts' total and each measured verdict, those wrong by
    argument apart from them, then the undecided (and any evidence missing)."""
    table = counts(entries)
    measured = [v for v in MEASURED if any(table[s][v] for s in table)]
    rest = [v for v in (*UNDECIDED, MISSING) if any(table[s][v] for s in table)]
    head = ["seed", "claims", "measured", *measured, *ARGUED, *rest]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for seed, count in table.items():
        cells = [seed, sum(count.values()), sum(count[v] for v in MEASURED), *(count[v] for v in measured),
                 *(count[v] for v in (*ARGUED, *rest))]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def write_markdown(entries: list[Entry], out_dir: Path) -> Path:
    lines = [HEADER, "## Verdicts per seed", "", *summary_lines(entries)]
    for seed, name in SEEDS.items():
        lines += ["", f"## Seed {seed} (`seeds/{name}`)", "",
                  "| id | section | claim | article | lab | verdict | why | evidence |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in (e for e in entries if e.claim.seed == seed):
            c = e.claim
            verdict = f"**{e.verdict}**" if e.verdict == MISSING else e.verdict
            why = "; ".join(x for x in (e.why, c.decider and f"decided by: {c.decider}") if x)
            lines.append("| " + " | ".join(_cell(x) for x in (c.id, c.section, c.claim, c.article, e.lab, verdict,
                                                                 why, _evidence(e, out_dir))) + " |")
    path = out_dir / "CLAIMS.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_csv(entries: list[Entry], out_dir: Path) -> Path:
    path = out_dir / "CLAIMS.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for e in entries:
            c = e.claim
            run = Path(os.path.relpath(e.run_dir, out_dir)).as_posix() if e.run_dir else ""
            w.writerow((c.id, c.seed, c.section, c.claim, c.article, e.lab, e.verdict, e.why, c.decider,
                        c.link.notebook if c.link else "", run, e.table, e.row or "", e.notebook_verdict))
    return path
