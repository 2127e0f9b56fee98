"""Each study's headline, read from a run's own files: the one source of what the README's studies table, each
study doc's opening and the HTML report (`lab report`) say about a study.

A `Headline` holds the study's question, its finding (`lab.studies.findings`: one sentence written by a person,
filled from the run, and the key claim's verdict word, the claims ledger's where it links the row), the count of
the run's verdicts, its key figure (`finding.png`, whose title is the sentence) and the run's provenance (id,
commit, clean or dirty). Nothing here is typed from a run by hand: `headline(notebook, run_dir)` reads it, so a
README or doc row that quotes a stale run fails the test that regenerates it (`lab docs --check`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lab.studies.findings import FIGURE, MODULES, Stated, finding_of, stated

# notebook -> the study's title (its doc's heading and the report's section)
TITLES = {
    "00_engine_tour": "Engine tour", "01_memory_accounting": "Memory accounting and the roofline",
    "02_quantization_accuracy": "Weight quantization accuracy", "03_kv_quantization": "KV cache quantization",
    "04_replay_break_even": "Replay break-even", "05_speculative_acceptance": "Speculative decoding",
    "06_serving_ttft": "Serving under load", "07_structured_output": "Structured output",
    "08_parallelism": "Parallelism", "09_ttft_claims": "First-token claims",
}
assert TITLES.keys() == MODULES.keys()
STUDIES = tuple(TITLES)  # in notebook order
VERDICT_ORDER = ("holds", "wrong", "wrong by rounding", "wrong by argument", "not distinguishable",
                 "not checkable here")


def question(notebook: str) -> str:
    return finding_of(notebook).question


@dataclass
class Headline:
    notebook: str
    question: str
    finding: Stated
    verdicts: dict[str, int]
    plot: str
    run_id: str
    commit: str
    dirty: bool
    preset: str
    created: str
    stale: bool = False  # the notebook or a study module it imports changed since the run's commit

    @property
    def title(self) -> str:
        return TITLES[self.notebook]

    @property
    def provenance(self) -> str:
        state = "; dirty tree" if self.dirty else ""
        state += "; stale: the code changed since (`lab runs --stale`)" if self.stale else ""
        return f"{self.preset} run {self.run_id}, commit {self.commit[:7]}, {self.created[:10]}{state}"


def _ledger(results: Path) -> pd.DataFrame | None:
    path = results / "CLAIMS.csv"
    return pd.read_csv(path, dtype=str).fillna("") if path.exists() else None


def headline(notebook: str, run_dir: Path) -> Headline:
    """`notebook`'s headline from the run in `run_dir`: a key claim missing from its claims table raises, naming
    it, as does a finding its run's files cannot fill."""
    run_dir = Path(run_dir)
    params = json.loads((run_dir / "params.json").read_text())
    claims = pd.read_csv(run_dir / "claims.csv") if (run_dir / "claims.csv").exists() else None
    verdicts = dict(Counter(claims["verdict"])) if claims is not None else {}
    preset = params.get("parameters", {}).get("PRESET", "reference")
    return Headline(notebook, question(notebook), stated(notebook, run_dir, _ledger(run_dir.parents[1])), verdicts,
                    FIGURE, run_dir.name, params.get("git_commit", ""), bool(params.get("git_dirty")), preset,
                    params.get("created", ""))


def verdict_counts(h: Headline) -> str:
    return ", ".join(f"{h.verdicts[v]} {v}" for v in VERDICT_ORDER if h.verdicts.get(v)) or "no claims table"
