"""`lab claims`: the claims ledger gathered from the notebooks' latest reference runs (`lab.claims`)."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _yours(args) -> int:
    """`lab claims --runs DIR...`: the ledger of a user's runs (on their model, their device) beside the committed
    one: the same claims, rules and scopes, each notebook's latest run among DIR (any preset)."""
    from lab.claims.gather import latest_runs
    from lab.claims.ledger import write_ledger
    from lab.claims.report import beside, beside_lines, summary_lines
    from lab.workflow.run import results_root
    from lab.studies import evidence

    if args.check:
        raise ValueError("--check compares the committed ledger with its reference runs; it does not apply to --runs")
    runs = latest_runs(args.runs)
    first = Path(args.runs[0])
    out = Path(args.out) if args.out else (first.parent.parent if (first / "params.json").exists() else first)
    committed = Path(args.results_dir) if args.results_dir else results_root()
    if out.resolve() == committed.resolve():
        raise ValueError(f"--out {out} is the committed ledger's folder: write your runs' ledger elsewhere")
    print("runs read:\n" + "\n".join(f"  {nb:28s} {d}" for nb, d in sorted(runs.items())))
    entries, paths = write_ledger(None, out, rebuilds=evidence.rebuilds(), runs=runs)
    table = beside(committed / "CLAIMS.csv", out / "CLAIMS.csv")
    table.to_csv(out / "BESIDE.csv", index=False)
    print("\n".join(summary_lines(entries)))
    print("\n".join(beside_lines(table)))
    for path in [*paths, out / "BESIDE.csv"]:
        print(f"wrote {path}")
    print(f"the report shows them side by side: lab report --beside {out}")
    return 0


def _claims(args) -> int:
    if args.runs:
        return _yours(args)
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
    cl.add_argument("--results-dir", default=None, help="where the runs are (default: results/); with --runs, "
                                                        "where the committed ledger is")
    cl.add_argument("--out", default=None, help="where CLAIMS.md and CLAIMS.csv go (default: the results dir; with "
                                                "--runs, the folder of the runs)")
    cl.add_argument("--runs", nargs="+", default=None, metavar="DIR",
                    help="build the ledger from these runs instead (run directories, or folders of them such as "
                         "`lab run all --model M --results-dir DIR` writes; each notebook's latest, any preset): "
                         "rows the committed ledger leaves 'not checkable here' are decided where your model and "
                         "device fit the claim's setting; BESIDE.csv sets each row beside the committed one "
                         "(docs/your_model.md)")
    cl.add_argument("--check", action="store_true",
                    help="exit 1 when a claim's evidence row is missing, the committed CLAIMS.csv was stale, a "
                         "notebook's verdict disagrees with the rules, a 'not yet checked' row names no decider, "
                         "study code types a verdict, or a wrong verdict names no defined cause (or a cause "
                         "explains none) (see docs/claims.md)")
    cl.set_defaults(func=_claims)
