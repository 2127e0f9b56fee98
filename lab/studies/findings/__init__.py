"""Each study's finding: one sentence written by a person, with slots its run fills, and one key figure whose
title is that sentence and which draws the claim's line or band beside the measurement.

A study module here (one per notebook, named as in `lab.studies.evidence`) defines `FINDING`, a `Finding`: the
question, the sentence's template, a function from the run's files (`RunFiles`) to the template's values, a
function drawing the key figure from the same files, and the claims-table row whose verdict the sentence carries;
and `FIGURES`, every other figure its notebook saves, each drawn from the run's tables. The README's studies table,
each study doc's opening and `lab report` print `stated(...)`; each notebook saves `key_figure(...)` as its run's
`finding.png`; `lab docs` redraws every figure of a committed reference run from its files (`redraw`), which is how
the figure check reaches every committed figure (tests/test_figures_committed.py, tests/test_findings.py).

A sentence says one thing: what was measured, in what setting, with what its interval is (95% over prompts or
documents, or the range over independent runs), against the article's figure; a range between methods is printed
as a range ("1.4% to 57.9%"). The verdict is one word beside it: the claims ledger's for the row, so a GPU claim
measured on this CPU reads "not checkable here" even where the run's own table calls it wrong in this setting.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

MODULES = {
    "00_engine_tour": "engine_tour", "01_memory_accounting": "memory_accounting",
    "02_quantization_accuracy": "quant_accuracy", "03_kv_quantization": "kv_quantization",
    "04_replay_break_even": "replay_break_even", "05_speculative_acceptance": "spec_acceptance",
    "06_serving_ttft": "serving", "07_structured_output": "structured_output", "08_parallelism": "parallelism",
    "09_ttft_claims": "ttft_claims",
}
FIGURE = "finding"  # the key figure's file stem in every run
MAX_CHARS = 200  # a finding a reader takes in at once (issue 49)


class RunFiles:
    """A run directory's files as the finding functions read them: tables by stem, metrics, parameters."""

    def __init__(self, run_dir: Path):
        from lab.figures.style import use_style

        self.dir = Path(run_dir)
        use_style()  # drawn as the run drew it (`lab.workflow.run.start_run` sets the same style)

    def csv(self, stem: str) -> pd.DataFrame:
        return pd.read_csv(self.dir / f"{stem}.csv")

    @cached_property
    def metrics(self) -> dict:
        path = self.dir / "metrics.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @cached_property
    def parameters(self) -> dict:
        return json.loads((self.dir / "params.json").read_text()).get("parameters", {})

    def params(self, cls):
        """The study's parameter dataclass `cls` with the run's values (lists as the tuples its fields hold)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in self.parameters.items() if k in fields})


@dataclass(frozen=True)
class Finding:
    """`template` is filled with `values(run)`; `figure(run, title)` draws the key figure titled `title`;
    `claim`, a substring of the key claim in the run's claims.csv, gives the verdict word ("" for a study that
    decides no claim: its sentence stands without one). A study whose answer takes a different shape on another
    kind of model (02: weights already on a grid, or 16-bit) gives a template for each case by name, and `values`
    names the run's case under "case"."""
    question: str
    template: str | dict[str, str]
    values: Callable[[RunFiles], dict]
    figure: Callable[[RunFiles, str], object]
    claim: str = ""


@dataclass(frozen=True)
class Stated:
    sentence: str
    verdict: str  # "" when the study decides no claim
    undecided_by: str = ""  # what the ledger says keeps the verdict from the article's setting ("device")

    @property
    def cell(self) -> str:
        """The sentence and its verdict word, as a table cell or a doc's opening prints them."""
        if not self.verdict:
            return self.sentence
        why = f" (the {self.undecided_by} differs from the article's)" if self.undecided_by else ""
        return f"{self.sentence} Verdict: **{self.verdict}**{why}."


def finding_of(notebook: str) -> Finding:
    if notebook not in MODULES:
        raise KeyError(f"no finding for notebook {notebook!r}; known: {', '.join(MODULES)}")
    return importlib.import_module(f"{__name__}.{MODULES[notebook]}").FINDING


def sentence(notebook: str, run_dir: Path) -> str:
    """The finding's sentence filled from the run in `run_dir`; a sentence over `MAX_CHARS` raises, naming it."""
    finding = finding_of(notebook)
    values = finding.values(RunFiles(run_dir))
    template = finding.template[values.pop("case")] if isinstance(finding.template, dict) else finding.template
    text = template.format(**values)
    if len(text) > MAX_CHARS:
        raise ValueError(f"{notebook}: the finding is {len(text)} characters, over {MAX_CHARS}: {text!r}")
    return text


def verdict(notebook: str, run_dir: Path, ledger: pd.DataFrame | None = None) -> tuple[str, str]:
    """The key claim's verdict, and what the ledger says leaves it undecided for the article's setting ("device",
    "model scale"): the ledger's where its row links to this run, else the run's claims table's."""
    match = finding_of(notebook).claim
    if not match:
        return "", ""
    claims = pd.read_csv(Path(run_dir) / "claims.csv")
    rows = claims.index[claims["claim"].str.contains(match, regex=False)]
    if len(rows) != 1:
        raise ValueError(f"{notebook} run {Path(run_dir).name}: {len(rows)} claims rows match {match!r} (want 1)")
    if ledger is not None:
        run = f"{Path(run_dir).parent.name}/{Path(run_dir).name}"
        mine = ledger[(ledger["run"] == run) & (ledger["table"] == "claims.csv")
                      & (ledger["row"].astype(str) == str(rows[0] + 1))]  # the ledger counts rows from 1
        if len(mine):
            row = mine.iloc[0]
            return str(row["verdict"]), str(row.get("undecided by", "")).split(" (")[0]
    return str(claims.loc[rows[0], "verdict"]), ""


def stated(notebook: str, run_dir: Path, ledger: pd.DataFrame | None = None) -> Stated:
    return Stated(sentence(notebook, run_dir), *verdict(notebook, run_dir, ledger))


def key_figure(notebook: str, run_dir: Path):
    """The study's key figure drawn from the run's files, its title the finding's sentence."""
    return finding_of(notebook).figure(RunFiles(run_dir), sentence(notebook, run_dir))


def figures(notebook: str) -> dict[str, Callable[[RunFiles], object]]:
    """Every figure the notebook saves, by file stem, each a function drawing it from a run's files: the key
    figure and the study module's `FIGURES`."""
    module = importlib.import_module(f"{__name__}.{MODULES[notebook]}")
    key = {FIGURE: lambda run: module.FINDING.figure(run, sentence(notebook, run.dir))}
    return key | getattr(module, "FIGURES", {})


def redraw(notebook: str, run_dir: Path, log=print) -> list[Path]:
    """Redraw every figure of a finished run from its files (recording each figure check in its
    figure_checks.json): `lab docs` does it for the committed reference runs when a figure's drawing changes
    (nothing measured is touched). A figure the run kept no tables for is named and left as it is."""
    import matplotlib.pyplot as plt

    from lab.workflow.run import save_figure

    saved = []
    for stem, draw in figures(notebook).items():
        if not (Path(run_dir) / f"{stem}.png").exists() and stem != FIGURE:
            continue  # the run never drew it (a preset that skips the step)
        try:
            fig = draw(RunFiles(run_dir))
        except FileNotFoundError as e:
            log(f"{notebook} {stem}: not redrawn, the run kept no {Path(e.filename or str(e)).name}")
            continue
        saved.append(save_figure(Path(run_dir), stem, fig))
        plt.close(fig)
    return saved
