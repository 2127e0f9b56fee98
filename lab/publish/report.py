"""`lab report`: one static HTML site of the studies' findings, for sharing (`results/report/index.html`).

The page opens with the ten findings, each one sentence with its verdict word beside its key figure (whose title
is the sentence); `summary.html` is the same on one printable page (a print stylesheet, A4) to attach to a message.
Then per study, from its latest reference run (and, with `quick=True`, its latest quick run beside it, marked as not
a reference result): the question, the finding (`lab.publish.headlines`, the same sentence the README and the study docs
carry), the key figure and up to three more, the claims the run decides, links to the executed
notebook rendered to HTML (nbconvert) and to the run's files, and the run's provenance (commit, clean or dirty,
stale or current, machine, date). Then the claims ledger (`results/CLAIMS.csv`) as one table a reader can sort
by any column and filter by seed and verdict, with a few lines of inline script and no server: open the file.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pandas as pd

from lab.machine.hardware import describe_cpu
from lab.publish.headlines import STUDIES, TITLES, Headline, headline, question, verdict_counts

LEDGER_COLUMNS = ("id", "seed", "section", "claim", "article", "lab", "verdict", "evidence")

STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h2{border-top:1px solid #ccc;padding-top:1em}.prov{color:#555;font-size:.9em}.quick{background:#fff4e0;
padding:.5em 1em;border-left:4px solid #E69F00}.stale{color:#D55E00;font-weight:bold}img.plot{max-width:100%;
border:1px solid #ddd;margin:.5em 0}table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;
padding:.3em .5em;vertical-align:top}th{cursor:pointer;background:#f3f3f3}.findings{display:grid;
grid-template-columns:repeat(2,1fr);gap:1em}.finding{border:1px solid #ddd;padding:.5em}.finding img{width:100%}
.verdict{font-weight:bold}"""

# the one-page summary: ten sentences and their figures as thumbnails, on A4 when printed
SUMMARY_STYLE = """body{font-family:system-ui,sans-serif;font-size:10pt;max-width:60em;margin:1em auto;color:#222}
h1{font-size:14pt;margin:0 0 .2em}p.prov{color:#555;font-size:8pt;margin:0 0 .6em}table{border-collapse:collapse}
td{border-top:1px solid #ccc;padding:.25em .4em;vertical-align:top}td img{height:2.1cm}
@page{size:A4;margin:1cm}@media print{body{font-size:8.5pt;margin:0}td img{height:1.9cm}a{color:inherit;
text-decoration:none}}"""

SCRIPT = """function filterLedger(){const s=document.getElementById('seed').value,v=document.getElementById(
'verdict').value;let n=0;for(const r of document.querySelectorAll('#ledger tbody tr')){const ok=(!s||r.dataset.seed
===s)&&(!v||r.dataset.verdict===v);r.style.display=ok?'':'none';n+=ok}document.getElementById('shown').textContent=n}
function sortLedger(c){const b=document.querySelector('#ledger tbody'),rows=[...b.rows],d=b.dataset.dir==c?-1:1;
rows.sort((x,y)=>d*x.cells[c].textContent.localeCompare(y.cells[c].textContent,undefined,{numeric:true}));
b.dataset.dir=d==1?c:'';rows.forEach(r=>b.appendChild(r))}"""


def _e(text) -> str:
    return html.escape(str(text))


def _latest(results: Path, preset: str) -> dict[str, Path]:
    from lab.workflow.index import list_runs

    return {r["notebook"]: r["dir"] for r in list_runs(results) if r["preset"] == preset}


def _notebook_page(run_dir: Path, out: Path) -> Path | None:
    """Where the run's executed notebook is rendered under `out`, or None when the run kept none."""
    if not any(run_dir.glob("*.ipynb")):
        return None
    return out / "notebooks" / f"{run_dir.parent.name}__{run_dir.name}.html"


def _render_notebook(run_dir: Path, out: Path) -> None:
    """The run's executed notebook as HTML at `_notebook_page` (nbconvert)."""
    import nbformat
    from nbconvert import HTMLExporter

    target = _notebook_page(run_dir, out)
    if target is None:
        return
    source = next(iter(sorted(run_dir.glob("*.ipynb"))))
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(source, as_version=4))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(body)


def _drop_superseded_notebooks(out: Path, shown: list[Path]) -> None:
    """Remove the rendered notebooks of runs the site no longer shows (a newer run replaced them), so that a
    rebuilt site holds only what its page links to."""
    keep = {f"{run.parent.name}__{run.name}.html" for run in shown}
    for page in (out / "notebooks").glob("*.html"):
        if page.name not in keep:
            page.unlink()


def _provenance(run_dir: Path, h: Headline) -> str:
    params = json.loads((run_dir / "params.json").read_text())
    cpu = describe_cpu(params.get("cpu", "?"), params.get("cpu_signature"))  # older runs: the name alone
    machine = f"{cpu}, {params.get('cpu_cores', '?')} cores" + (f", {params['gpu']}" if params.get("gpu") else "")
    state = "dirty tree" if h.dirty else "clean tree"
    stale = ' <span class="stale">stale: the code changed since this run</span>' if h.stale else ""
    return (f'<p class="prov">{_e(h.preset)} run <code>{_e(h.run_id)}</code>, commit <code>{_e(h.commit[:10])}'
            f"</code> ({state}), {_e(h.created[:19])}, on {_e(machine)}{stale}</p>")


def _read(run_dir: Path) -> Headline | Exception:
    """The run's headline, or why it has none (a run older than its study's headline): the page says so and builds
    the rest."""
    try:
        return headline(run_dir.parent.name, run_dir)
    except (ValueError, KeyError, FileNotFoundError) as e:
        return e


def _study(run_dir: Path, h: Headline | Exception, out: Path, quick: bool) -> str:
    if isinstance(h, Exception):
        return f'<p class="stale">No headline from run <code>{_e(run_dir.name)}</code>: {_e(h)}</p>'
    rel = lambda p: _e(os.path.relpath(p, out))  # noqa: E731
    parts = [f'<div class="quick">A quick run (<code>make run</code>): fewer points than the reference, not a '
             f"reference result.</div>" if quick else "", _provenance(run_dir, h),
             f"<p>{_finding(h)}</p>", f"<p>Claims this run decides: {_e(verdict_counts(h))}.</p>"]
    for png in sorted(run_dir.glob("*.png"), key=lambda p: (p.stem != h.plot, p.stem))[:4]:
        parts.append(f'<a href="{rel(png)}"><img class="plot" src="{rel(png)}" alt="{_e(png.stem)}"></a>')
    if (run_dir / "claims.csv").exists():
        claims = pd.read_csv(run_dir / "claims.csv")
        rows = "".join(f"<tr><td>{_e(r['claim'])}</td><td>{_e(r['measured here'])}</td><td>{_e(r['verdict'])}</td></tr>"
                       for _, r in claims.iterrows())
        parts.append(f"<details><summary>The {len(claims)} claims this run checks</summary><table><tr><th>claim</th>"
                     f"<th>measured here</th><th>verdict</th></tr>{rows}</table></details>")
    notebook = _notebook_page(run_dir, out)
    links = [f'<a href="{rel(notebook)}">the executed notebook</a>'] if notebook else []
    links.append(f'<a href="{rel(run_dir)}/">the run\'s files</a>')
    parts.append("<p>" + " · ".join(links) + "</p>")
    return "\n".join(p for p in parts if p)


def _ledger(results: Path) -> str:
    path = results / "CLAIMS.csv"
    if not path.exists():
        return "<p>No claims ledger: run <code>lab claims</code>.</p>"
    df = pd.read_csv(path, dtype=str).fillna("")
    cols = [c for c in LEDGER_COLUMNS if c in df.columns]
    options = lambda col: "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in sorted(set(df[col])))  # noqa: E731
    head = "".join(f'<th onclick="sortLedger({i})">{_e(c)}</th>' for i, c in enumerate(cols))
    body = "".join(f'<tr data-seed="{_e(r["seed"])}" data-verdict="{_e(r["verdict"])}">'
                   + "".join(f"<td>{_e(r[c])}</td>" for c in cols) + "</tr>" for _, r in df.iterrows())
    return (f'<p>Seed <select id="seed" onchange="filterLedger()"><option value="">all</option>{options("seed")}'
            f'</select> Verdict <select id="verdict" onchange="filterLedger()"><option value="">all</option>'
            f'{options("verdict")}</select> <span id="shown">{len(df)}</span> of {len(df)} claims shown; click a '
            f'header to sort.</p><table id="ledger"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def _beside(yours: Path) -> str:
    """The committed ledger and a user's (`lab claims --runs`, its BESIDE.csv) side by side: the rows their runs
    decide that the committed runs cannot, and the verdicts that differ, first."""
    from lab.claims.report import DECIDED_HERE, DIFFERS, NOT_RUN, SAME

    path = yours / "BESIDE.csv"
    if not path.exists():
        raise FileNotFoundError(f"no {path}: build it with `lab claims --runs YOUR_RUNS --out {yours}`")
    df = pd.read_csv(path, dtype=str).fillna("")
    order = {s: i for i, s in enumerate((DECIDED_HERE, DIFFERS, SAME, NOT_RUN))}
    df = df.sort_values("stands", key=lambda s: s.map(order), kind="stable")
    cols = ["id", "claim", "stands", "verdict (committed)", "lab setting (committed)", "verdict (yours)",
            "lab (yours)", "lab setting (yours)"]
    counts = ", ".join(f"{(df['stands'] == s).sum()} {s}" for s in order)
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(f'<tr class="{_e(r["stands"]).replace(" ", "-")}">' + "".join(f"<td>{_e(r[c])}</td>" for c in cols)
                   + "</tr>" for _, r in df.iterrows())
    return (f'<h2 id="beside-section">Your runs beside the committed ledger</h2><p>From <code>{_e(yours)}</code> '
            f"(<code>lab claims --runs</code>): {_e(counts)}.</p><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _finding(h: Headline) -> str:
    verdict = f' <span class="verdict">{_e(h.finding.verdict)}</span>' if h.finding.verdict else ""
    return f"{_e(h.finding.sentence)}{verdict}"


def _headlines(reference: dict[str, Path]) -> dict[str, Headline]:
    """Each study's headline from its reference run, where it has one (the study's section says why not)."""
    read = {nb: _read(reference[nb]) for nb in STUDIES if nb in reference}
    return {nb: h for nb, h in read.items() if isinstance(h, Headline)}


def _findings(heads: dict[str, Headline], results: Path, out: Path) -> str:
    """The page's opening: each study's finding and verdict beside its key figure."""
    cells = []
    for nb, h in heads.items():
        png = results / nb / h.run_id / f"{h.plot}.png"
        img = (f'<a href="#{nb}"><img src="{_e(os.path.relpath(png, out))}" alt="{_e(h.finding.sentence)}"></a>'
               if png.exists() else "")
        stale = ' <span class="stale">stale: the code changed since this run</span>' if h.stale else ""
        cells.append(f'<div class="finding"><b>{_e(nb[:2])} {_e(h.title)}.</b> {_finding(h)}{stale}{img}</div>')
    return f'<div class="findings" id="findings">{"".join(cells)}</div>'


def summary(results: Path, out: Path | None = None) -> str:
    """The one-page summary (summary.html): the findings of the latest reference runs, printable on A4."""
    out = out or results / "report"
    heads = _headlines(_latest(results, "reference"))
    rows = []
    for nb, h in heads.items():
        png = results / nb / h.run_id / f"{h.plot}.png"
        img = f'<img src="{_e(os.path.relpath(png, out))}" alt="">' if png.exists() else ""
        rows.append(f"<tr><td><b>{_e(nb[:2])}</b></td><td><b>{_e(h.question)}</b> {_finding(h)}</td><td>{img}</td></tr>")
    commits = sorted({h.commit[:7] for h in heads.values()})
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>Inference Lab: ten findings</title><style>'
            f"{SUMMARY_STYLE}</style></head><body><h1>Inference Lab: what the folklore of LLM inference does when "
            f"measured</h1><p class=\"prov\">SmolLM2-135M on a 2-core CPU unless a finding says otherwise; each from "
            f"its study's latest reference run (commits {_e(', '.join(commits))}); the full report: index.html."
            f"</p><table>{''.join(rows)}</table></body></html>")


def page(results: Path, out: Path | None = None, quick: bool = False, repo: Path | None = None,
         beside: Path | None = None) -> str:
    """The site's index.html as `build` writes it (nothing is written here: the test that keeps the committed
    report current compares it with the file)."""
    from lab.workflow.index import reference_states

    out = out or results / "report"
    repo = repo or Path(__file__).resolve().parents[2]
    states = reference_states(results, repo)
    reference, quick_runs = _latest(results, "reference"), _latest(results, "quick") if quick else {}
    sections, heads = [], {}
    for nb in STUDIES:
        if nb not in reference and nb not in quick_runs:
            continue
        body = [f'<h2 id="{nb}">{_e(nb[:2])} · {_e(TITLES[nb])}</h2><p><b>{_e(question(nb))}</b></p>']
        if nb in reference:
            h = _read(reference[nb])  # read once: its section and the page's opening show it
            if isinstance(h, Headline):
                h.stale = any(r.startswith("stale") for r in states.get(nb, (None, []))[1])
                heads[nb] = h
            body.append(_study(reference[nb], h, out, quick=False))
        if nb in quick_runs:
            body.append(_study(quick_runs[nb], _read(quick_runs[nb]), out, quick=True))
        sections.append("\n".join(body))
    toc = " · ".join(f'<a href="#{nb}">{nb[:2]} {_e(TITLES[nb])}</a>' for nb in STUDIES)
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Inference Lab: findings</title><style>"
            f"{STYLE}</style><script>{SCRIPT}</script></head><body><h1>Inference Lab: findings</h1><p>Each study's "
            f"finding from its latest reference run, measured on the machine named beside it (one page to print: "
            f'<a href="summary.html">summary.html</a>). {toc} · <a href="#ledger-section">claims ledger</a></p>'
            f'{_findings(heads, results, out)}{"".join(sections)}'
            f'<h2 id="ledger-section">Claims ledger</h2>{_ledger(results)}{_beside(beside) if beside else ""}'
            f'</body></html>')


def build(results: Path, out: Path | None = None, quick: bool = False, repo: Path | None = None,
          beside: Path | None = None) -> Path:
    """Write the site under `out` (default `results/report`) and return its index.html; `beside`: a user's ledger
    folder (`lab claims --runs ... --out DIR`) shown beside the committed ledger."""
    out = out or results / "report"
    out.mkdir(parents=True, exist_ok=True)
    reference, quick_runs = _latest(results, "reference"), _latest(results, "quick") if quick else {}
    _drop_superseded_notebooks(out, [*reference.values(), *quick_runs.values()])
    for run_dir in [*reference.values(), *quick_runs.values()]:
        _render_notebook(run_dir, out)
    index = out / "index.html"
    index.write_text(page(results, out, quick, repo, beside))
    (out / "summary.html").write_text(summary(results, out))
    return index
