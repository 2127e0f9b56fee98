"""The README's studies table and each study doc's opening (question, answer, key plot), generated from the
latest reference runs' headlines (`lab.headlines`), so that no number there can disagree with the run it names.

The generated text sits between `BEGIN` and `END` markers; everything outside them is written by hand (method,
caveats, what would change the answer). `lab docs` rewrites the blocks; `lab docs --check` (and the test suite)
fails when a block differs from what the runs give, naming the file. The source articles are named by title and
language (`ARTICLES`), never by file name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lab.headlines import STUDIES, Headline, headline, verdict_counts

BEGIN, END = "<!-- generated from the reference runs by `lab docs`: begin -->", "<!-- generated: end -->"
ROOT = Path(__file__).resolve().parents[1]

# The three source articles, by title (their first line, or their opening phrase where they have none) and language.
ARTICLES = {
    "000": "「重算反而省算力：长上下文下KV Cache与局部重计算的博弈」 (Recompute can save compute: KV cache against "
           "local recomputation at long context; Chinese)",
    "002": "「大模型推理首字延遲優化」 (Optimizing the first-token latency of LLM inference, on Kubernetes; Chinese, "
           "traditional characters)",
    "003": "「大模型推理部署优化：显存、KV Cache、量化与调度实战」 (LLM inference deployment: memory, KV cache, "
           "quantization and scheduling in practice; Chinese)",
}


def doc_path(notebook: str, root: Path = ROOT) -> Path:
    return root / "docs" / "studies" / f"{notebook}.md"


def _plot(h: Headline, results: Path, base: Path) -> str:
    png = results / h.notebook / h.run_id / f"{h.plot}.png"
    return os.path.relpath(png, base) if png.exists() else ""


def _bullets(h: Headline) -> list[str]:
    return [f"- {a}." if not a.endswith(".") else f"- {a}" for a in h.answer]


def doc_block(h: Headline, results: Path, doc: Path, quick: Headline | None = None) -> str:
    """A study doc's opening: the question, the answer as the reference run gives it, its verdicts, the key plot;
    and, where a quick run is newer than the reference (code that changed what the study measures, not yet rerun
    at the reference size), that run's answer beside it, marked as not a reference result."""
    lines = [f"**Question.** {h.question}", "", "**Answer** (from the " + h.provenance + "):", "", *_bullets(h),
             "", f"Claims this run decides: {verdict_counts(h)}."]
    plot = _plot(h, results, doc.parent)
    if plot:
        lines += ["", f"![{h.plot}]({plot})"]
    if quick is not None:
        lines += ["", f"**Newer, at the quick preset** (fewer points; not a reference result; from the "
                      f"{quick.provenance}):", "", *_bullets(quick)]
        plot = _plot(quick, results, doc.parent)
        if plot:
            lines += ["", f"![{quick.plot} (quick run)]({plot})"]
    return "\n".join(lines)


def readme_block(heads: list[Headline], results: Path, readme: Path, quick: dict | None = None) -> str:
    rows = ["| notebook | the question | the answer, from its reference run | claims decided | doc |",
            "| --- | --- | --- | --- | --- |"]
    for h in heads:
        doc = os.path.relpath(doc_path(h.notebook, readme.parent), readme.parent)
        answer = "; ".join(h.answer).replace("|", "\\|") + f" (run {h.run_id})"
        if h.notebook in (quick or {}):
            answer += f"; a newer quick run ({quick[h.notebook].name}) is in the doc"
        rows.append(f"| `{h.notebook}` | {h.question} | {answer} | {verdict_counts(h)} | [{h.notebook[:2]}]({doc}) |")
    return "\n".join(rows)


def _newer_quick_runs(results: Path, reference: dict[str, Path]) -> dict[str, Path]:
    """Each notebook's latest quick run where it is newer than the latest reference run."""
    from lab.results_index import list_runs

    quick = {r["notebook"]: r["dir"] for r in list_runs(results) if r["preset"] == "quick"}
    return {nb: d for nb, d in quick.items() if nb in reference and d.name > reference[nb].name}


def _replace(text: str, block: str, where: Path, after_title: bool) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    wrapped = f"{BEGIN}\n{block}\n{END}"
    if pattern.search(text):
        return pattern.sub(lambda _: wrapped, text, count=1)
    if not after_title:
        raise ValueError(f"{where}: no generated block ({BEGIN} ... {END}) to fill")
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{wrapped}\n{rest}"


def sync(root: Path = ROOT, results: Path | None = None, check: bool = False) -> list[Path]:
    """Rewrite (or, with `check`, compare) the README's studies table and every study doc's opening from the
    latest reference runs under `results`; returns the files that differed."""
    from lab.ledger.gather import latest_reference_runs
    from lab.results_index import reference_states

    results = results or root / "results"
    runs, states = latest_reference_runs(results), reference_states(results, ROOT)
    heads = [headline(nb, runs[nb]) for nb in STUDIES if nb in runs]
    for h in heads:
        h.stale = any(r.startswith("stale") for r in states.get(h.notebook, (None, []))[1])
    quick = _newer_quick_runs(results, runs)
    targets = {root / "README.md": (readme_block(heads, results, root / "README.md", quick), False)}
    for h in heads:
        doc = doc_path(h.notebook, root)
        q = quick.get(h.notebook)
        qh = None
        if q is not None:
            from lab.results_index import list_runs
            from lab.run_staleness import run_state

            qh = headline(h.notebook, q)
            entry = next(r for r in list_runs(results) if r["dir"] == q)
            qh.stale = any(r.startswith("stale") for r in run_state(entry, ROOT))
        targets[doc] = (doc_block(h, results, doc, qh), True)
    stale = []
    for path, (block, after_title) in targets.items():
        old = path.read_text() if path.exists() else f"# {STUDIES[path.stem].title}\n"
        new = _replace(old, block, path, after_title)
        if new != old:
            stale.append(path)
            if not check:
                path.write_text(new)
    return stale
