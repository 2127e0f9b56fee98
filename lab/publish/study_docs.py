"""The README's studies table and each study doc's opening (question, finding, key figure), generated from the
latest reference runs' headlines (`lab.publish.headlines`), so that no number there can disagree with the run it names.
Reference runs only: the quick runs `make run` leaves in results/ change neither, so `make test` passes after it.

The generated text sits between `BEGIN` and `END` markers; everything outside them is written by hand (method,
caveats, what would change the answer). `lab docs` rewrites the blocks; `lab docs --check` (and the test suite)
fails when a block differs from what the runs give, naming the file. The source articles are named by title and
language (`ARTICLES`), never by file name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lab.publish.headlines import STUDIES, TITLES, Headline, headline, verdict_counts

BEGIN, END = "<!-- generated from the reference runs by `lab docs`: begin -->", "<!-- generated: end -->"
ROOT = Path(__file__).resolve().parents[2]

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


def doc_block(h: Headline, results: Path, doc: Path) -> str:
    """A study doc's opening: the question, the finding in one sentence with its verdict word, the run it comes
    from, the count of the run's verdicts and the key figure. Reference runs only: a quick run (`make run`) never
    changes a doc."""
    lines = [f"**Question.** {h.question}", "", f"**Finding.** {h.finding.cell}", "",
             f"From the {h.provenance}. Claims this run decides: {verdict_counts(h)}."]
    plot = _plot(h, results, doc.parent)
    if plot:
        lines += ["", f"![{h.finding.sentence}]({plot})"]
    return "\n".join(lines)


def readme_block(heads: list[Headline], results: Path, readme: Path) -> str:
    rows = ["| study | the question | the finding, from its reference run | claims decided |", "| --- | --- | --- | --- |"]
    for h in heads:
        doc = os.path.relpath(doc_path(h.notebook, readme.parent), readme.parent)
        rows.append(f"| [{h.notebook[:2]} {h.title}]({doc}) | {h.question} | {h.finding.cell.replace('|', chr(92) + '|')} "
                    f"| {verdict_counts(h)} |")
    return "\n".join(rows)


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
    from lab.claims.gather import latest_reference_runs
    from lab.workflow.index import reference_states

    results = results or root / "results"
    runs, states = latest_reference_runs(results), reference_states(results, ROOT)
    heads = [headline(nb, runs[nb]) for nb in STUDIES if nb in runs]
    for h in heads:
        h.stale = any(r.startswith("stale") for r in states.get(h.notebook, (None, []))[1])
    targets = {root / "README.md": (readme_block(heads, results, root / "README.md"), False)}
    for h in heads:
        targets[doc_path(h.notebook, root)] = (doc_block(h, results, doc_path(h.notebook, root)), True)
    stale = []
    for path, (block, after_title) in targets.items():
        old = path.read_text() if path.exists() else f"# {TITLES[path.stem]}\n"
        new = _replace(old, block, path, after_title)
        if new != old:
            stale.append(path)
            if not check:
                path.write_text(new)
    return stale
