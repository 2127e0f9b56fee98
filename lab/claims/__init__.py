"""The claims: what the three source articles state, and the one set of rules that judges each against the lab.

- `table`: the one shape of a notebook's claims table (`claim_row`) and the verdicts a study may write;
  `across_runs`: how a table prints and judges a figure measured across several runs.
- `rules`: the verdict system (tolerances, rounding, ranges, bounds, intervals) the notebooks and the ledger share.
- the articles' registries, one module each (`replay_article`, `ttft_article`, `deployment_article`,
  `deployment_article_serving`): every numeric or testable claim, quoted, with where it is checked (`record`).
- `ledger`: gathers each claim from its notebook's latest reference run (`gather`), rebuilds the figures whose
  assumptions are parameters (`rebuild`, `assumptions`), and writes `results/CLAIMS.md` (`report`); `checks` is
  what `lab claims --check` fails on.
- `arithmetic`: the articles' own arithmetic recomputed from their stated inputs.

Checking a fourth article is one registry module here and one line in `ledger.ARTICLES` (docs/claims.md).
"""
