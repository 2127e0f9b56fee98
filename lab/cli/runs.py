"""`lab run` and `lab results`: the study notebooks executed into results/, and the index of their runs."""

from __future__ import annotations

import functools
import sys
import time
import traceback
from pathlib import Path

from lab.workflow.run import PRESETS


def _last_durations(root, preset: str) -> dict[str, float]:
    """Each notebook's duration in its latest finished run at `preset` under `root` (the ETA of its next run)."""
    from lab.workflow.index import list_runs
    from lab.workflow.run import results_root

    root = Path(root) if root else results_root()
    return {r["notebook"]: r["metrics"]["duration_s"] for r in list_runs(root)
            if "duration_s" in r["metrics"] and r["preset"] == preset}


def describe_failure(e: BaseException) -> str:
    """Where a notebook failed and the error's last line, for `lab run all`'s summary: papermill names the cell
    by its execution count and index, `lab run --in-process` (`CellFailed`) by its line in the .py twin."""
    from lab.workflow.index import last_line
    from lab.workflow.script import CellFailed

    if hasattr(e, "cell_index") and hasattr(e, "ename"):  # papermill.PapermillExecutionError
        return f"cell {e.cell_index} (In [{e.exec_count}]): {e.ename}: {last_line(e.evalue)}"
    if isinstance(e, CellFailed):
        where = str(e).split(" raised ", 1)[0].removeprefix("the ")
        cause = e.__cause__ or e
        return f"{where}: {type(cause).__name__}: {last_line(cause)}"
    return f"{type(e).__name__}: {last_line(e)}"  # before any cell: a dead kernel, a missing file


def _run(args) -> int:
    from tqdm.auto import tqdm

    from lab.workflow import notebook as papermill_runner, script as script_runner
    from lab.workflow.compare import against_reference
    from lab.workflow.notebook import parse_value, study_notebooks
    from lab.workflow.run import refusal, results_root

    params = {name: parse_value(value) for name, value in args.param}
    if args.preset:
        params["PRESET"] = args.preset
    if args.model:  # the one switch (issue 51): every notebook's MODEL, and every model each one loads follows it
        params["MODEL"] = args.model
    if isinstance(params.get("MODEL"), str) and Path(params["MODEL"]).exists():  # a notebook runs in notebooks/
        params["MODEL"] = str(Path(params["MODEL"]).absolute())
    names = [p.stem for p in study_notebooks()] if args.notebook == "all" else [args.notebook]
    run = (functools.partial(script_runner.run_script, params=params, root=args.results_dir) if args.in_process
           else functools.partial(papermill_runner.run_notebook, params=params, root=args.results_dir,
                                  log_output=args.log_output))
    preset = params.get("PRESET", "quick")
    before = _last_durations(args.results_dir, preset)
    print(f"preset: {preset}", flush=True)
    failed, refused, took, verdicts = {}, {}, {}, {}
    # Progress in seconds of the notebooks' last runs at this preset (60 s for one never run), so its ETA is
    # what the previous runs took, updated as each notebook finishes.
    bar = tqdm(total=round(sum(before.get(n, 60.0) for n in names)), unit="s", desc="notebooks",
               disable=len(names) == 1, file=sys.stderr)
    for i, name in enumerate(names, start=1):
        eta = f" (its last run took {before[name] / 60:.1f} min)" if name in before else ""
        bar.write(f"[{i}/{len(names)}] running {name}{eta} ...", file=sys.stdout)
        start = time.perf_counter()
        try:
            run_dir = run(name)
            bar.write(str(run_dir), file=sys.stdout)
            if preset != "reference":  # does the smaller run reach the committed run's verdicts?
                verdicts[name] = against_reference(run_dir, results_root())
                bar.write(f"{name} {verdicts[name]}", file=sys.stdout)
        except ValueError:
            raise
        except Exception as e:  # a failing cell: report it, keep running the other notebooks
            if (why := refusal(e)) is not None:  # the model is not one this study can use: said, not a failure
                refused[name] = why
                bar.write(f"{name} refused its model: {why}", file=sys.stdout)
            else:
                if args.in_process:  # papermill's message holds the cell's traceback; an in-process error does not
                    bar.write("".join(traceback.format_exception(e)).rstrip(), file=sys.stderr)
                text = str(e)  # papermill's ends with the cell's error; a long one keeps its head (what failed) too
                shown = text if len(text) <= 800 else f"{text[:250]} [...] {text[-500:]}"
                bar.write(f"{name} FAILED: {type(e).__name__}: {shown}", file=sys.stderr)
                failed[name] = describe_failure(e)
        took[name] = time.perf_counter() - start
        state = "refused" if name in refused else "failed" if name in failed else "done"
        bar.write(f"{name} {state} in {took[name] / 60:.1f} min", file=sys.stdout)
        bar.update(round(before.get(name, 60.0)))
    bar.close()
    if len(names) > 1:
        outcome = lambda n: "refused" if n in refused else "failed" if n in failed else verdicts.get(n, "")  # noqa: E731
        print("\n".join(f"  {n:28s} {t / 60:6.1f} min  {outcome(n)}" for n, t in took.items())
              + f"\n  {'total':28s} {sum(took.values()) / 60:6.1f} min")
    if refused:  # what the model could not be used for, and why: the other notebooks ran
        print(f"refused: {len(refused)} of {len(names)} notebooks could not run on MODEL={params.get('MODEL')!r}")
        print("\n".join(f"  {n}: {why}" for n, why in refused.items()))
    if failed:  # every failure named at the end, where a reader of a long log looks
        print(f"failed: {len(failed)} of {len(names)} notebooks", file=sys.stderr)
        print("\n".join(f"  {n}: {why}" for n, why in failed.items()), file=sys.stderr)
    return 1 if failed else 0


def _results(args) -> int:
    from lab.workflow.index import list_runs, write_index
    from lab.workflow.run import results_root

    root = Path(args.results_dir) if args.results_dir else results_root()
    for r in list_runs(root):
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r["metrics"].items() if not isinstance(v, (list, dict)))
        print(f"{r['notebook']:28s} {r['preset']:9s} {r['run_id']:26s} {metrics}")
    print(f"index: {write_index(root)}")
    return 0


def _runs(args) -> int:
    """`lab runs --stale`: every notebook's latest reference run that does not match the code, and why."""
    from lab.workflow.index import reference_states
    from lab.workflow.run import results_root

    root = Path(args.results_dir) if args.results_dir else results_root()
    if args.archive:
        from lab.workflow.index import archive, write_index

        for path in archive(root):
            print(f"moved {path.parent.parent.name}/{path.name} under earlier/")
        write_index(root)
    repo = Path(__file__).resolve().parents[2]
    states = reference_states(root, repo)
    shown = {nb: s for nb, s in states.items() if s[1]} if args.stale else states
    for nb, (run_dir, reasons) in shown.items():
        print(f"{nb:28s} {run_dir.name:32s} {'; '.join(reasons) or 'matches the code'}")
    if args.stale and not shown:
        print("every latest reference run matches the code")
    return 0


def add_runs(sub) -> None:
    """`lab runs [--stale]`"""
    runs = sub.add_parser("runs", help="each notebook's latest reference run and whether it matches the code")
    runs.add_argument("--stale", action="store_true", help="list only the runs that are dirty or stale")
    runs.add_argument("--archive", action="store_true",
                      help="first move every superseded run (not a notebook's latest at its preset) under earlier/")
    runs.add_argument("--results-dir", default=None)
    runs.set_defaults(func=_runs)


def add_run(sub) -> None:
    """`lab run NOTEBOOK|all`"""
    run = sub.add_parser("run", help="execute a study notebook (or 'all') through papermill into results/")
    run.add_argument("notebook", help="e.g. 00_engine_tour, or 'all' for every study notebook")
    run.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="set a parameter (a Python literal, else a string); repeatable")
    run.add_argument("--preset", choices=PRESETS, default=None,
                     help="quick (the notebooks' default: minutes), reference (the committed runs) or smoke (the "
                          "tests'); a -p value beats the preset's")
    run.add_argument("--model", default=None, metavar="PATH_OR_NAME",
                     help="run the study (or every study) on this model: a checkpoint directory, a .gguf path, "
                          "smollm2-135m or random:<preset>; the same as -p MODEL, and a notebook that cannot use "
                          "it refuses up front with its reason while the others go on (docs/your_model.md)")
    run.add_argument("--results-dir", default=None, help="where run directories go (default: results/)")
    run.add_argument("--log-output", action="store_true", help="stream the notebook's output to this terminal")
    run.add_argument("--in-process", action="store_true",
                     help="run the notebook's .py twin in this process, without papermill or a Jupyter kernel (the "
                          "GPU machine has neither)")
    run.set_defaults(func=_run)


def add_results(sub) -> None:
    """`lab results`"""
    res = sub.add_parser("results", help="list study runs with their key metrics and refresh results/README.md")
    res.add_argument("--results-dir", default=None)
    res.set_defaults(func=_results)


def _docs(args) -> int:
    """`lab docs [--check]`: the README's studies table and each study doc's opening, from the reference runs."""
    from lab.claims.gather import latest_reference_runs
    from lab.workflow.run import results_root
    from lab.studies.findings import redraw
    from lab.publish.study_docs import sync

    if not args.check:  # each reference run's figures, from its files, before the openings that show them
        for nb, run_dir in sorted(latest_reference_runs(results_root()).items()):
            print(f"{nb}: redrew {len(redraw(nb, run_dir))} figures of {run_dir.name}")
    stale = sync(check=args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {path}")
    if args.check and stale:
        print("run `lab docs` to regenerate them from the latest reference runs")
        return 1
    return 0


def add_docs(sub) -> None:
    """`lab docs [--check]`"""
    docs = sub.add_parser("docs", help="redraw each latest reference run's figures (its key figure, finding.png, "
                                       "among them) from its files and "
                                       "regenerate the README's studies table and each study doc's opening from "
                                       "those runs (--check: fail if the text differs)")
    docs.add_argument("--check", action="store_true")
    docs.set_defaults(func=_docs)


def _report(args) -> int:
    """`lab report [--quick]`: the static HTML site of the findings."""
    from lab.publish.report import build
    from lab.workflow.run import results_root

    root = Path(args.results_dir) if args.results_dir else results_root()
    if args.beside and not args.out:  # the committed report stays the committed ledger's alone
        raise ValueError("--beside needs --out: the report with your ledger beside goes outside results/report")
    index = build(root, Path(args.out) if args.out else None, quick=args.quick,
                  beside=Path(args.beside) if args.beside else None)
    print(f"report: {index} (open it in a browser; no server needed)")
    return 0


def add_report(sub) -> None:
    """`lab report [--quick] [--out DIR]`"""
    rep = sub.add_parser("report", help="build the static HTML site of the findings (results/report/index.html)")
    rep.add_argument("--quick", action="store_true", help="show each notebook's latest quick run beside its reference")
    rep.add_argument("--out", default=None, help="where the site goes (default: results/report)")
    rep.add_argument("--beside", default=None, metavar="DIR",
                     help="also show the ledger of your runs (`lab claims --runs ... --out DIR`) beside the "
                          "committed one (needs --out)")
    rep.add_argument("--results-dir", default=None)
    rep.set_defaults(func=_report)
