"""The claims ledger (issue 23, item 1): every numeric or testable claim of the three source articles, in one place.

Each claim (`record.Claim`: seed, section, the claim in a sentence, the article's number) is either linked to
the row of a notebook's claims table that checks it (`record.Link`) or says why no notebook does ("not
checkable here", "not yet checked"). `gather` finds each linked row in the notebook's latest reference run and
judges it by the rules written once in `rules`, the one verdict system the notebooks use too (tolerances,
rounding, ranges, bounds, intervals); `report` writes `results/CLAIMS.md` and `results/CLAIMS.csv`; `checks`
says what `lab claims --check` fails on (with `literals`, the scan for verdicts typed in study code). The
registry is one module per article (`replay_article`, `ttft_article`, `deployment_article`), each with the article's mistakes
(`record.Cause`) that explain its wrong verdicts, by which the report groups them. `lab claims` runs it;
docs/claims.md explains it.
"""

from __future__ import annotations

from pathlib import Path

from lab.claims import deployment_article, deployment_article_serving, replay_article, ttft_article
from lab.claims.gather import Entry, gather
from lab.claims.rebuild import Rebuild
from lab.claims.record import Cause, Claim, cause_table
from lab.claims.report import HEADER, write_csv, write_markdown, yours_header
from lab.claims.rules import MISSING

# The registry: one module per article (its claims, and the mistakes behind its wrong verdicts, `CAUSES`); checking
# a fourth article is one more module here (docs/claims.md, "Checking a fourth article").
ARTICLES = (replay_article, ttft_article, deployment_article, deployment_article_serving)
CLAIMS: list[Claim] = [c for article in ARTICLES for c in article.CLAIMS]
# Per seed, the article's mistakes by key: what a wrong claim's `cause` names (an article's later sections, in a
# module of their own, share its causes).
CAUSES: dict[str, dict[str, Cause]] = {article.CLAIMS[0].seed: cause_table(article.CAUSES) for article in ARTICLES
                                       if hasattr(article, "CAUSES")}


def write_ledger(root: Path | None, out_dir: Path, claims: list[Claim] = CLAIMS,
                 causes: dict[str, dict[str, Cause]] = CAUSES,
                 rebuilds: dict[str, Rebuild] | None = None,
                 runs: dict[str, Path] | None = None) -> tuple[list[Entry], list[Path]]:
    """Gather `claims` from the reference runs under `root` (or from `runs`, {notebook: run directory}: a user's
    runs on their own model) and write CLAIMS.md (with the wrong verdicts grouped by `causes`) and CLAIMS.csv into
    `out_dir`; `rebuilds` (each notebook's `Rebuild`, from `lab.studies.evidence`) recompute the figures whose
    assumptions are notebook parameters."""
    entries = gather(claims, Path(root) if root else None, rebuilds, runs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = HEADER if runs is None else yours_header(runs, out_dir)
    return entries, [write_markdown(entries, out_dir, causes, header), write_csv(entries, out_dir)]


def missing(entries: list[Entry]) -> list[Entry]:
    """The claims whose evidence row is absent from their notebook's latest reference run."""
    return [e for e in entries if e.verdict == MISSING]
