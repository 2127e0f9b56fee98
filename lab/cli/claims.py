"""`lab claims`: the claims ledger gathered from the notebooks' latest reference runs (`lab.claims`)."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _claims(args) -> int:
    from lab.claims.ledger import write_ledger
    from lab.claims.checks import committed_rows, failures
    from lab.claims.report import summary_lines, write_counts
    from lab.workflow.run import results_root
    from lab.studies import evidence

    root = Path(args.results_dir) if args.results_dir else results_root()
    out = Path(args.out) if args.out else root
    committed = committed_rows(out / "CLAIMS.csv")  # the ledger as committed, before the rewrite
    rebuilds = evidence.rebuilds()
    entries, paths = write_ledger(root, out, rebuilds=rebuilds)
    failed = failures(entries, committed, rebuilds=rebuilds, root=root) if args.check else []
    if args.out is None:  # the repository's own ledger: docs/claims.md states its counts
        doc, changed = write_counts(entries, DOCS / "claims.md")
        paths.append(doc)
        if changed and args.check:
            failed.append(f"stale: {doc.name}'s counts were not the ledger's (rewritten: commit it)")
    print("\n".join(summary_lines(entries)))
    for path in paths:
        print(f"wrote {path}")
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


def add_claims(sub) -> None:
    """`lab claims [--check]`"""
    cl = sub.add_parser("claims", help="gather every source-article claim and its verdict from the notebooks' latest "
                                       "reference runs into results/CLAIMS.md and CLAIMS.csv")
    cl.add_argument("--results-dir", default=None, help="where the runs are (default: results/)")
    cl.add_argument("--out", default=None, help="where CLAIMS.md and CLAIMS.csv go (default: the results dir)")
    cl.add_argument("--check", action="store_true",
                    help="exit 1 when a claim's evidence row is missing, the committed CLAIMS.csv was stale, a "
                         "notebook's verdict disagrees with the rules, a 'not yet checked' row names no decider, "
                         "study code types a verdict, or a wrong verdict names no defined cause (or a cause "
                         "explains none) (see docs/claims.md)")
    cl.set_defaults(func=_claims)
