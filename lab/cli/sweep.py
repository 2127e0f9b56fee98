"""`lab sweep`: a grid of papermill runs of one study notebook, as Ray tasks (`lab.workflow.sweep`)."""

from __future__ import annotations

from lab.workflow.run import PRESETS


def _sweep(args) -> int:
    from lab.workflow.sweep import SweepOptions, build_spec, run_sweep

    spec = build_spec(args.notebook, args.param, args.preset)  # a bad name is refused before anything runs
    options = SweepOptions(root=args.results_dir, address=args.address, local=args.local,
                           cpus_per_point=args.cpus_per_point, metric=args.metric, force=args.force)
    result = run_sweep(spec, options)
    done = len(result.points) - len(result.failed)
    print(f"{len(result.points)} point(s): {done} done, {len(result.failed)} failed")
    print(f"table: {result.dir / 'points.csv'}")
    if result.plot:
        print(f"plot: {result.plot}")
    print(f"index: {result.dir / 'README.md'}")
    return 1 if result.failed else 0


def add_sweep(sub) -> None:
    """`lab sweep NOTEBOOK -p NAME v1,v2,... [--preset P]`"""
    sw = sub.add_parser("sweep", help="run a study notebook over a grid of parameter values (each point a Ray task) "
                                      "into one run directory per point and a sweep directory with a combined table")
    sw.add_argument("notebook", help="e.g. 00_engine_tour")
    sw.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUES"),
                    help="a parameter's values, comma-separated (each a Python literal, else a string; commas inside "
                         "brackets or quotes do not split: '(1,2),(3,4)' is two values); one value fixes it; "
                         "repeatable: the grid is every combination")
    sw.add_argument("--preset", default=None, choices=PRESETS, help="the notebook's PRESET parameter for every point: quick, reference "
                                                   "or smoke; a -p value beats the preset's")
    sw.add_argument("--address", default=None, help="a Ray cluster to run on (e.g. ray://head:10001 or auto); "
                                                    "default: a local Ray started for this sweep")
    sw.add_argument("--local", action="store_true", help="run the points one after another in this process, no Ray")
    sw.add_argument("--cpus-per-point", type=float, default=None,
                    help="CPUs each point asks Ray for; default: all CPUs of a node (the whole machine for a local "
                         "Ray), so points run one at a time per node and concurrent runs do not distort each "
                         "other's timings; lower it to run points side by side when timings do not matter")
    sw.add_argument("--metric", default=None, help="the metric to plot against the first swept parameter; default: "
                                                   "the first numeric metric every done point has (not duration_s)")
    sw.add_argument("--force", action="store_true", help="rerun every point, even those a previous run finished")
    sw.add_argument("--results-dir", default=None, help="the results root (default: results/); the sweep goes "
                                                        "to <root>/sweeps/<notebook>/<sweep id>/")
    sw.set_defaults(func=_sweep)
