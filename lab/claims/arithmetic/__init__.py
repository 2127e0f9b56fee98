"""The source articles' own arithmetic, recomputed (issue 34 item 4): one module per seed, each a list of claims
table rows (`lab.claims.table.claim_row`, through `recomputed`) whose figure the lab computes from the article's stated
inputs with `lab.memory`, `lab.machine.roofline` and `lab.machine.hardware`, never types. Notebook 01 writes them into its
claims table (`lab.studies.memory_accounting.measure.claims_table`), where the ledger finds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.claims.table import Bound, Number, Range, claim_row, judged, shown


def recomputed(claim: str, says: str, rule: Number | Range | Bound, computed: float, unit: str, why: str = "") -> dict:
    """A `claim_row` for an article's number recomputed here, judged by `rule` (`lab.claims.table.judged`) and printed so
    that the ledger reads the same verdict back; by how much (and `why`, where the difference has a reason worth
    stating) in the note."""
    word, off = judged(rule, computed)
    return claim_row(claim, says, f"{shown(computed, rule)} {unit}", word, "; ".join(n for n in (off, why) if n))


@dataclass(frozen=True)
class Paging:
    """The request lengths seed 003's paging claims are recomputed on: notebook 01's log-normal fit (P50, P90,
    P99) capped at `seq_len`, passed in by its study so both use the same distribution."""
    p50: int
    p90: int
    p99: int
    seq_len: int


def rows(paging: Paging) -> list[dict]:
    """Every seed's recomputed rows, in seed order."""
    from lab.claims.arithmetic import deployment_article, replay_article, ttft_article

    return [*replay_article.rows(), *ttft_article.rows(), *deployment_article.rows(paging)]
