"""`lab report`: one static HTML site of the studies' findings, for sharing (`results/report/index.html`).

Per study, from its latest reference run (and, with `quick=True`, its latest quick run beside it, marked as not a
reference result): the question, the answer with its numbers, intervals and verdicts (`lab.headlines`, the same
text the README and the study docs carry), the key plots, the claims the run decides, links to the executed
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

from lab.headlines import STUDIES, Headline, headline, verdict_counts

LEDGER_COLUMNS = ("id", "seed", "section", "claim", "article", "lab", "verdict", "evidence")

STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h2{border-top:1px solid #ccc;padding-top:1em}.prov{color:#555;font-size:.9em}.quick{background:#fff4e0;
padding:.5em 1em;border-left:4px solid #E69F00}.stale{color:#D55E00;font-weight:bold}img.plot{max-width:100%;
border:1px solid #ddd;margin:.5em 0}table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;
padding:.3em .5em;vertical-align:top}th{cursor:pointer;background:#f3f3f3}"""

SCRIPT = """function filterLedger(){const s=document.getElementById('seed').value,v=document.getElementById(
'verdict').value;let n=0;for(const r of document.querySelectorAll('#ledger tbody tr')){const ok=(!s||r.dataset.seed
===s)&&(!v||r.dataset.verdict===v);r.style.display=ok?'':'none';n+=ok}document.getElementById('shown').textContent=n}
function sortLedger(c){const b=document.querySelector('#ledger tbody'),rows=[...b.rows],d=b.dataset.dir==c?-1:1;
rows.sort((x,y)=>d*x.cells[c].textContent.localeCompare(y.cells[c].textContent,undefined,{numeric:true}));
b.dataset.dir=d==1?c:'';rows.forEach(r=>b.appendChild(r))}"""


def _e(text) -> str:
    return html.escape(str(text))


def _latest(results: Path, preset: str) -> dict[str, Path]:
    from lab.results_index import list_runs

    return {r["notebook"]: r["dir"] for r in list_runs(results) if r["preset"] == preset}


def _render_notebook(run_dir: Path, out: Path) -> Path | None:
    """The run's executed notebook as HTML under `out` (nbconvert), or None when the run kept none."""
    import nbformat
    from nbconvert import HTMLExporter

    source = next(iter(sorted(run_dir.glob("*.ipynb"))), None)
    if source is None:
        return None
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(source, as_version=4))
    target = out / "notebooks" / f"{run_dir.parent.name}__{run_dir.name}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(body)
    return target


def _drop_superseded_notebooks(out: Path, shown: list[Path]) -> None:
    """Remove the rendered notebooks of runs the site no longer shows (a newer run replaced them), so that a
    rebuilt site holds only what its page links to."""
    keep = {f"{run.parent.name}__{run.name}.html" for run in shown}
    for page in (out / "notebooks").glob("*.html"):
        if page.name not in keep:
            page.unlink()


def _provenance(run_dir: Path, h: Headline) -> str:
    params = json.loads((run_dir / "params.json").read_text())
    machine = f"{params.get('cpu', '?')} ({params.get('cpu_cores', '?')} cores)" + (
        f", {params['gpu']}" if params.get("gpu") else "")
    state = "dirty tree" if h.dirty else "clean tree"
    stale = ' <span class="stale">stale: the code changed since this run</span>' if h.stale else ""
    return (f'<p class="prov">{_e(h.preset)} run <code>{_e(h.run_id)}</code>, commit <code>{_e(h.commit[:10])}'
            f"</code> ({state}), {_e(h.created[:19])}, on {_e(machine)}{stale}</p>")


def _study(run_dir: Path, out: Path, quick: bool, stale: bool) -> str:
    try:
        h = headline(run_dir.parent.name, run_dir)
    except (ValueError, KeyError) as e:  # a run older than its study's headline: say so, build the rest
        return f'<p class="stale">No headline from run <code>{_e(run_dir.name)}</code>: {_e(e)}</p>'
    h.stale = stale
    rel = lambda p: _e(os.path.relpath(p, out))  # noqa: E731
    parts = [f'<div class="quick">A quick run (<code>make run</code>): fewer points than the reference, not a '
             f"reference result.</div>" if quick else "", _provenance(run_dir, h),
             "<ul>" + "".join(f"<li>{_e(a)}</li>" for a in h.answer) + "</ul>",
             f"<p>Claims this run decides: {_e(verdict_counts(h))}.</p>"]
    for png in sorted(run_dir.glob("*.png"), key=lambda p: (p.stem != h.plot, p.stem))[:4]:
        parts.append(f'<a href="{rel(png)}"><img class="plot" src="{rel(png)}" alt="{_e(png.stem)}"></a>')
    if (run_dir / "claims.csv").exists():
        claims = pd.read_csv(run_dir / "claims.csv")
        rows = "".join(f"<tr><td>{_e(r['claim'])}</td><td>{_e(r['measured here'])}</td><td>{_e(r['verdict'])}</td></tr>"
                       for _, r in claims.iterrows())
        parts.append(f"<details><summary>The {len(claims)} claims this run checks</summary><table><tr><th>claim</th>"
                     f"<th>measured here</th><th>verdict</th></tr>{rows}</table></details>")
    notebook = _render_notebook(run_dir, out)
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


def build(results: Path, out: Path | None = None, quick: bool = False, repo: Path | None = None) -> Path:
    """Write the site under `out` (default `results/report`) and return its index.html."""
    from lab.results_index import reference_states

    out = out or results / "report"
    out.mkdir(parents=True, exist_ok=True)
    repo = repo or Path(__file__).resolve().parents[1]
    states = reference_states(results, repo)
    reference, quick_runs = _latest(results, "reference"), _latest(results, "quick") if quick else {}
    _drop_superseded_notebooks(out, [*reference.values(), *quick_runs.values()])
    sections = []
    for nb, study in STUDIES.items():
        if nb not in reference and nb not in quick_runs:
            continue
        body = [f'<h2 id="{nb}">{_e(nb[:2])} · {_e(study.title)}</h2><p><b>{_e(study.question)}</b></p>']
        if nb in reference:
            stale = any(r.startswith("stale") for r in states.get(nb, (None, []))[1])
            body.append(_study(reference[nb], out, quick=False, stale=stale))
        if nb in quick_runs:
            body.append(_study(quick_runs[nb], out, quick=True, stale=False))
        sections.append("\n".join(body))
    toc = " · ".join(f'<a href="#{nb}">{nb[:2]} {_e(s.title)}</a>' for nb, s in STUDIES.items())
    page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Inference Lab: findings</title><style>"
            f"{STYLE}</style><script>{SCRIPT}</script></head><body><h1>Inference Lab: findings</h1><p>Each study's "
            f"answer from its latest reference run, measured on the machine named beside it. {toc} · "
            f'<a href="#ledger-section">claims ledger</a></p>{"".join(sections)}'
            f'<h2 id="ledger-section">Claims ledger</h2>{_ledger(results)}</body></html>')
    index = out / "index.html"
    index.write_text(page)
    return index
