"""`results/CLAIMS.md` and `results/CLAIMS.csv`: the gathered ledger, per seed, with a count per verdict.

The counts keep the three kinds of verdict apart (`lab.claims.rules`): measured (from a number, by a rule),
wrong by argument (no number decides it; the argument is in the row), and undecided (not checkable here, not yet
checked), so a reader sees how many verdicts a measurement can overturn. The wrong verdicts are grouped again by
the article's underlying mistake each names (`record.Cause`), so a reader also sees how many distinct errors an
article makes, not only how many of its rows they touch. Evidence links are relative to the output directory, so
the Markdown reads on GitHub from results/.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

from lab.claims.gather import Entry
from lab.claims.record import SEEDS, Cause
from lab.claims.rules import ARGUED, EVIDENCE, MEASURED, MISSING, SCOPES, UNDECIDED, VERDICTS, WRONG, WRONGS

ORDER = (*VERDICTS, MISSING)
CSV_COLUMNS = ("id", "seed", "section", "claim", "article", "lab", "verdict", "why", "cause", "decider", "notebook",
               "run", "table", "row", "notebook verdict", "scope", "claim setting", "evidence", "lab setting",
               "in this setting", "model class", "undecided by", "assumptions")
MISTAKES = "distinct mistakes"
HEADER = """# The claims ledger

Every numeric or testable claim of the three source articles (`seeds/`), with the lab's figure and a verdict by
the rules in `lab/claims/rules.py` (see `docs/claims.md`). Written by `lab claims` from each notebook's latest
reference run; nothing here is typed by hand. "evidence missing" means a claim's row is absent from its
notebook's latest run: `lab claims --check` fails then.

Measured verdicts come from the lab's number by the rules; "wrong by argument" ones from an argument written in
the row, with no number to overturn them; the counts keep them apart. A claim not yet checked names what would
decide it.
"""

CAUSES_INTRO = """## Wrong verdicts by root cause

One mistake of an article often makes several of its claims wrong: a KV cache sized with one head instead of eight
is wrong in every figure built on it. Each wrong verdict (wrong, wrong by rounding, wrong by argument) names the
article's underlying mistake, written once per seed in its registry (`lab/claims/seed*.py`); here are the mistakes,
the section where each first appears and the rows it explains, most rows first. The count of distinct mistakes is
how many errors an article makes; the count of wrong verdicts, how many of its claims they reach.
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


def by_cause(entries: list[Entry]) -> dict[str, dict[str, list[Entry]]]:
    """Per seed, its wrong verdicts grouped by the cause each names ("" for none), in ledger order."""
    out: dict[str, dict[str, list[Entry]]] = {seed: {} for seed in SEEDS}
    for e in entries:
        if e.verdict in WRONGS:
            out[e.claim.seed].setdefault(e.claim.cause, []).append(e)
    return out


def summary_lines(entries: list[Entry]) -> list[str]:
    """The verdict counts per seed: the measured verdicts' total and each measured verdict, those wrong by
    argument apart from them, the distinct mistakes behind the wrong ones, then the undecided (and any evidence
    missing)."""
    table, groups = counts(entries), by_cause(entries)
    measured = [v for v in MEASURED if any(table[s][v] for s in table)]
    rest = [v for v in (*UNDECIDED, MISSING) if any(table[s][v] for s in table)]
    head = ["seed", "claims", "measured", *measured, *ARGUED, MISTAKES, *rest]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for seed, count in table.items():
        cells = [seed, sum(count.values()), sum(count[v] for v in MEASURED), *(count[v] for v in measured),
                 *(count[v] for v in ARGUED), sum(1 for key in groups[seed] if key), *(count[v] for v in rest)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


EVIDENCE_INTRO = """## Verdicts by evidence kind

A verdict says where it holds. Each claim has a scope (`lab/claims/rules.py`, `SCOPES`) that says which evidence
can decide it: a speed claim about GPUs needs a GPU measurement or a projection to one (a physics bound can only
refute it), an accuracy claim about quantizing a 16-bit model needs a 16-bit model. Where the lab's evidence
cannot decide a claim, its verdict is "not checkable here" and the measurement's verdict is kept as the verdict
*in this setting* (the last column of the tables below). Here are the verdicts by what they rest on:
"""


def evidence_lines(entries: list[Entry]) -> list[str]:
    """The verdicts counted by the kind of evidence each rests on, and how many undecided rows have a verdict in
    the lab's setting; then the scopes' meanings."""
    table = {kind: Counter() for kind in EVIDENCE}
    for e in entries:
        table[e.evidence][e.verdict] += 1
    shown = [v for v in ORDER if any(c[v] for c in table.values())]
    head = ["evidence", "claims", *shown, "verdict in this setting only"]
    lines = [EVIDENCE_INTRO, "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for kind, count in table.items():
        if not sum(count.values()):
            continue
        apart = sum(1 for e in entries if e.evidence == kind and e.in_setting)
        lines.append("| " + " | ".join(str(c) for c in (kind, sum(count.values()), *(count[v] for v in shown),
                                                         apart)) + " |")
    lines += ["", "| scope | what the claim is about | decided by |", "| --- | --- | --- |"]
    for s in SCOPES.values():
        by = ", ".join(s.decides) + (" (16-bit weights only)" if s.needs16 else "")
        by += " (a measurement only on a model of the claim's class)" if s.needs_class else ""
        by += f"; refuted only by {', '.join(s.refutes)}" if s.refutes else ""
        lines.append(f"| {s.name} | {_cell(s.meaning)} | {_cell(by)} |")
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _headline(groups: dict[str, list[Entry]]) -> str:
    """One seed's bold "N wrong verdicts, M distinct mistakes", then its wrong verdicts by kind."""
    kinds = Counter(e.verdict for group in groups.values() for e in group)
    split = ", ".join(f"{kinds[v]} {v}" for v in WRONGS if kinds[v])
    head = (f"**{_plural(sum(kinds.values()), 'wrong verdict')}, "
            f"{_plural(sum(1 for key in groups if key), 'distinct mistake')}**")
    return f"{head} ({split})" if split else head


def cause_lines(entries: list[Entry], causes: dict[str, dict[str, Cause]]) -> list[str]:
    """Per seed, its wrong verdicts by the mistake each names: the headline (`_headline`), then one table row per
    cause (its key, first section, statement and the rows it explains). A wrong row naming no cause, or one its
    seed does not define, is listed as such (`lab claims --check` fails on it), not dropped."""
    lines = [CAUSES_INTRO]
    for i, (seed, groups) in enumerate(by_cause(entries).items()):
        defined = causes.get(seed, {})
        order = {key: n for n, key in enumerate(defined)}
        lines += [""] * (i > 0) + [f"### Seed {seed}", "", _headline(groups), "",
                                   "| cause | first in | the article's mistake | verdicts | rows |", "|" + " --- |" * 5]
        # the mistakes that explain most rows first, ties in the order the registry writes them; none named last
        for key in sorted(groups, key=lambda k: (not k, -len(groups[k]), order.get(k, len(order)))):
            cause = defined.get(key)
            said = (cause.section, cause.statement) if cause else ("", "not a cause the seed defines" if key else
                                                                   "no cause named")
            rows = ", ".join(e.claim.id + ("" if e.verdict == WRONG else f" ({e.verdict})") for e in groups[key])
            lines.append("| " + " | ".join(_cell(x) for x in (key or "-", *said, len(groups[key]), rows)) + " |")
    return lines


def yours_header(runs: dict[str, Path], out_dir: Path) -> str:
    """CLAIMS.md's opening for a ledger of a user's runs (`lab claims --runs`): which runs it read."""
    listed = "\n".join(f"- {nb}: `{Path(os.path.relpath(d, out_dir)).as_posix()}`" for nb, d in sorted(runs.items()))
    return f"""# The claims ledger of your runs

The same claims, rules and scopes as the committed ledger (`results/CLAIMS.md`, `docs/claims.md`), judged on these
runs, each notebook's latest among those given to `lab claims --runs` (any preset). A row is decided where the
run's model and device fit the claim's setting (a 16-bit checkpoint decides the weight-accuracy rows, a GPU run the
GPU-speed rows); "evidence missing" names a notebook that is not among them. BESIDE.csv sets each row beside the
committed ledger's; `lab report --beside` shows the two side by side.

{listed}
"""


def write_markdown(entries: list[Entry], out_dir: Path, causes: dict[str, dict[str, Cause]],
                   header: str = HEADER) -> Path:
    lines = [header, "## Verdicts per seed", "", *summary_lines(entries), "", *evidence_lines(entries), "",
             *cause_lines(entries, causes)]
    for seed, name in SEEDS.items():
        lines += ["", f"## Seed {seed} (`seeds/{name}`)", "",
                  "| id | section | claim | article | claim's setting | lab | lab's setting | verdict | in this setting "
                  "(kept from deciding by) | assumptions and readings (where the verdict flips) | why | evidence |",
                  "|" + " --- |" * 12]
        for e in (e for e in entries if e.claim.seed == seed):
            c = e.claim
            verdict = f"**{e.verdict}**" if e.verdict == MISSING else e.verdict
            why = "; ".join(x for x in (e.why, c.decider and f"decided by: {c.decider}") if x)
            about = "; ".join(x for x in (c.about, c.model and f"model class: {c.model}") if x)
            about = f"{about} ({c.scope})" if c.scope else about
            in_setting = f"{e.in_setting} ({e.undecided_by})" if e.in_setting and e.undecided_by else e.in_setting
            lines.append("| " + " | ".join(_cell(x) for x in (c.id, c.section, c.claim, c.article, about, e.lab,
                                                                 e.lab_setting, verdict, in_setting, e.assumptions,
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
            w.writerow((c.id, c.seed, c.section, c.claim, c.article, e.lab, e.verdict, e.why, c.cause, c.decider,
                        c.link.notebook if c.link else "", run, e.table, e.row or "", e.notebook_verdict, c.scope,
                        c.about, e.evidence, e.lab_setting, e.in_setting, str(c.model or ""), e.undecided_by,
                        e.assumptions))
    return path


# How a row of a user's ledger stands beside the committed one's (`beside`), in the order they are listed.
DECIDED_HERE = "decided by your runs"  # the committed ledger leaves it undecided; yours measures it in its setting
DIFFERS, SAME, NOT_RUN = "verdict differs", "same verdict", "not in your runs"  # no run, or no such row


def beside(committed_csv: Path, yours_csv: Path):
    """Each claim's row in the committed ledger beside its row in a user's (`lab claims --runs`): both verdicts,
    both figures and settings, and how they stand (`DECIDED_HERE`, `DIFFERS`, `SAME`, `NOT_RUN`)."""
    import pandas as pd

    if not committed_csv.exists():
        raise FileNotFoundError(f"no committed ledger at {committed_csv}: run `lab claims` there first")
    keep = ["id", "seed", "claim", "scope", "lab", "verdict", "lab setting", "in this setting", "undecided by"]
    ours, yours = (pd.read_csv(p, dtype=str).fillna("")[keep].set_index("id") for p in (committed_csv, yours_csv))
    t = ours.join(yours.drop(columns=["seed", "claim", "scope"]), lsuffix=" (committed)", rsuffix=" (yours)")

    def stands(r) -> str:
        mine, theirs = r["verdict (yours)"], r["verdict (committed)"]
        if mine == MISSING:
            return NOT_RUN
        if theirs in UNDECIDED and mine in MEASURED:
            return DECIDED_HERE
        return SAME if mine == theirs else DIFFERS

    t.insert(3, "stands", t.apply(stands, axis=1))
    return t.reset_index()


def beside_lines(table) -> list[str]:
    """What a user's ledger changes, in a few lines: the rows it decides that the committed one cannot, the verdicts
    that differ, the rows not in them."""
    lines = []
    for what, label in ((DECIDED_HERE, "decided by your runs, not checkable in the committed ledger's setting"),
                        (DIFFERS, "a verdict other than the committed ledger's"),
                        (NOT_RUN, "not in your runs (no run of the notebook, or a preset without the row)")):
        rows = table[table["stands"] == what]
        ids = ", ".join(f"{r['id']} ({r['verdict (committed)']} -> {r['verdict (yours)']})" for _, r in rows.iterrows())
        lines.append(f"{len(rows):4d} rows {label}" + (f": {ids}" if ids and what != NOT_RUN else ""))
    return lines


COUNTS_BEGIN = "<!-- counts from the ledger, written by `lab claims`: begin -->"
COUNTS_END = "<!-- counts: end -->"


def counts_block(entries: list[Entry]) -> str:
    """The ledger's counts as docs/claims.md states them: per seed by verdict (measured, by argument apart, the
    distinct mistakes, the undecided), then by the kind of evidence each verdict rests on."""
    table = evidence_lines(entries)[1:]  # without the section's introduction
    return "\n".join(["Per seed, by verdict:", "", *summary_lines(entries), "", "By the kind of evidence:", "",
                       *table[:table.index("")]])


def write_counts(entries: list[Entry], doc: Path) -> tuple[Path, bool]:
    """Rewrite `doc`'s generated counts block; (the path, whether it changed)."""
    import re

    text = doc.read_text()
    pattern = re.compile(re.escape(COUNTS_BEGIN) + r".*?" + re.escape(COUNTS_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{doc}: no counts block ({COUNTS_BEGIN} ... {COUNTS_END}) to fill")
    new = pattern.sub(lambda _: f"{COUNTS_BEGIN}\n{counts_block(entries)}\n{COUNTS_END}", text)
    if new != text:
        doc.write_text(new)
    return doc, new != text
