"""`lab claims`: the claims ledger gathered from the notebooks' latest reference runs (`lab.ledger`)."""

from __future__ import annotations

import sys
from pathlib import Path


def _claims(args) -> int:
    from lab.ledger import missing, write_ledger
    from lab.ledger.report import summary_lines
    from lab.runs import results_root

    root = Path(args.results_dir) if args.results_dir else results_root()
    entries, paths = write_ledger(root, Path(args.out) if args.out else root)
    print("\n".join(summary_lines(entries)))
    for path in paths:
        print(f"wrote {path}")
    gone = missing(entries)
    for e in gone:
        print(f"evidence missing: {e.claim.id} ({e.claim.link.notebook}): {e.why}", file=sys.stderr)
    return 1 if gone and args.check else 0


def add_claims(sub) -> None:
    """`lab claims [--check]`"""
    cl = sub.add_parser("claims", help="gather every source-article claim and its verdict from the notebooks' latest "
                                       "reference runs into results/CLAIMS.md and CLAIMS.csv")
    cl.add_argument("--results-dir", default=None, help="where the runs are (default: results/)")
    cl.add_argument("--out", default=None, help="where CLAIMS.md and CLAIMS.csv go (default: the results dir)")
    cl.add_argument("--check", action="store_true",
                    help="exit 1 when a claim's evidence row is missing from its notebook's latest reference run")
    cl.set_defaults(func=_claims)
