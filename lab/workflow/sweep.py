"""`lab sweep`: a grid of papermill runs of one study notebook, each point a Ray task, gathered in one table.

A sweep is the cartesian product of `-p NAME v1,v2,...` value lists (a name with one value is fixed) plus
the preset, which is just the papermill parameter `PRESET`. Every point is an ordinary `lab run`: its
own run directory under the results root, with params.json, metrics.json and the executed notebook. The
sweep itself lives in `results/sweeps/<notebook>/<sweep_id>/`:

    sweep.json    the command, the grid, the preset, and every point: params, status, run_dir, error, metrics
    points.csv    one row per point: the swept parameters, status, run_dir, error and every scalar metric
    <metric>.png  a chosen metric against the first swept parameter, one line per value of the others
    README.md     an index: the plot and a table linking each point's run directory

The sweep id is derived from the notebook, the grid and the preset alone, so rerunning the same command
finds the same directory: points already done are skipped, failed ones are run again. A failing point is
recorded with its error and never stops the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import re
import shlex
import sys
import time
from pathlib import Path

from .notebook import NOTEBOOKS_DIR, check_parameter_names, parse_value, resolve_notebook, run_notebook
from .index import flat_metrics
from .run import results_root

_BRACKETS = {"(": ")", "[": "]", "{": "}"}


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets and quotes: "(1,2),(3,4)" is two values, not four."""
    parts, current, closers, quote = [], [], [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _BRACKETS:
            closers.append(_BRACKETS[ch])
        elif closers and ch == closers[-1]:
            closers.pop()
        elif ch == "," and not closers:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_grid_values(text: str) -> list:
    """`v1,v2,...` as a list of values, each parsed like a `lab run -p` value (a literal, else a string)."""
    parts = split_top_level(text)
    if "" in parts:
        raise ValueError(f"an empty value in {text!r}")
    return [parse_value(p) for p in parts]


def _plain(value):
    """A value as JSON gives it back (a tuple becomes a list), so stored and new points compare equal."""
    return json.loads(json.dumps(value))


def _slug(value) -> str:
    """A value in a directory name: a list's items joined by '-' (commas separate the values)."""
    return "-".join(map(_slug, value)) if isinstance(value, list) else str(value)


@dataclasses.dataclass
class SweepSpec:
    """What a sweep runs: the notebook and, per parameter, its values in command order (PRESET included)."""

    notebook: Path
    grid: dict[str, list]
    preset: str | None = None

    @property
    def name(self) -> str:
        return self.notebook.stem

    @property
    def swept(self) -> list[str]:
        """The parameters with more than one value; the first is the plot's x axis."""
        return [n for n, values in self.grid.items() if len(values) > 1]

    def points(self) -> list[dict]:
        names = list(self.grid)
        return [_plain(dict(zip(names, combo))) for combo in itertools.product(*self.grid.values())]

    def sweep_id(self) -> str:
        """Readable (the sorted grid, shortened) plus a hash of the whole grid, so it is stable and unique."""
        grid = {n: _plain(self.grid[n]) for n in sorted(self.grid)}
        readable = "__".join(f"{n}={','.join(map(_slug, v))}" for n, v in grid.items())
        readable = re.sub(r"[^A-Za-z0-9.,=_+-]+", "", readable)[:80] or "defaults"
        digest = hashlib.sha256(json.dumps([self.name, grid], sort_keys=True).encode()).hexdigest()[:8]
        return f"{readable}__{digest}"

    def command(self) -> str:
        """A `lab sweep` command that runs this grid again (and so finds this sweep's directory)."""
        args = ["lab", "sweep", self.name]
        for n, values in self.grid.items():
            if n != "PRESET" or self.preset is None:
                args += ["-p", n, ",".join(map(repr, values))]
        return shlex.join(args + (["--preset", self.preset] if self.preset is not None else []))

    def notebook_ref(self) -> str:
        """What a task passes to run_notebook: a study notebook by name, so a cluster node finds its own copy."""
        return self.name if self.notebook.resolve().parent == NOTEBOOKS_DIR else str(self.notebook.resolve())


def build_spec(notebook: str, params: list[tuple[str, str]], preset: str | None = None) -> SweepSpec:
    """The grid from `-p NAME VALUES` pairs; every name is checked against the notebook before anything runs."""
    path = resolve_notebook(notebook)
    grid: dict[str, list] = {}
    for name, text in params:
        if name in grid:
            raise ValueError(f"parameter {name} is given twice; give its values once, comma-separated")
        grid[name] = parse_grid_values(text)
        if len({json.dumps(v) for v in _plain(grid[name])}) < len(grid[name]):  # two points would be one
            raise ValueError(f"parameter {name} has a value twice in {text!r}")
    if preset is not None:
        if "PRESET" in grid:
            raise ValueError("give the preset either as --preset or as -p PRESET, not both")
        grid["PRESET"] = [preset]
    check_parameter_names(path, grid)
    return SweepSpec(path, grid, preset)


@dataclasses.dataclass
class SweepOptions:
    root: Path | None = None  # the results root; default results_root()
    address: str | None = None  # a Ray cluster to join; None starts a local Ray
    local: bool = False  # run the points one after another in this process, without Ray
    cpus_per_point: float | None = None  # None: every CPU of a node, so points never share one
    metric: str | None = None  # the plotted metric; None picks one
    force: bool = False  # rerun the points already done too


def run_point(notebook: str, params: dict, root: str) -> dict:
    """One point: a `lab run` into `root`; the body of a Ray task, so it returns its outcome, never raises.

    The metrics travel back in the outcome: on a cluster the run directory is on the worker's disk."""
    start = time.perf_counter()
    node = _ray_node()
    try:
        run_dir = run_notebook(notebook, params, root=Path(root))
    except Exception as e:  # the point failed; the sweep goes on, and its run directory (if made) is linked
        made = getattr(e, "run_dir", None)
        return {"status": "failed", "run_dir": str(Path(made).relative_to(root)) if made else None, "metrics": {},
                "error": f"{type(e).__name__}: {e}"[-2000:], "seconds": time.perf_counter() - start, "node": node}
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    return {"status": "done", "run_dir": str(run_dir.relative_to(root)), "metrics": flat_metrics(metrics),
            "error": None, "seconds": time.perf_counter() - start, "node": node}


def _ray_node() -> str | None:
    """The Ray node this point runs on (its id), None outside a Ray worker."""
    if "ray" not in sys.modules:
        return None
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _run_in_process(spec: SweepSpec, todo: list[dict], root: Path):
    for params in todo:
        yield params, run_point(spec.notebook_ref(), params, str(root))


def _node_cpus(ray) -> float:
    return max(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"])


def _run_on_ray(spec: SweepSpec, todo: list[dict], root: Path, options: SweepOptions):
    """Each point a Ray task asking for `cpus_per_point` CPUs; outcomes come back in the order they finish."""
    import ray

    if options.address:
        ray.init(address=options.address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        most = _node_cpus(ray)
        cpus = options.cpus_per_point or most
        if not 0 < cpus <= most:  # more than a node has: Ray would wait forever for such a node
            raise ValueError(f"--cpus-per-point {cpus:g} is not in (0, {most:g}], the CPUs of the largest Ray node")
        print(f"Ray: {cpus:g} CPU(s) per point, nodes of up to {most:g} CPUs", flush=True)
        # No retries: a crashed worker is a failed point like any other (a rerun of the sweep retries it),
        # rather than a second run directory made behind the user's back.
        task = ray.remote(run_point).options(num_cpus=cpus, max_retries=0)
        pending = {task.remote(spec.notebook_ref(), params, str(root)): params for params in todo}
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            params = pending.pop(ref)
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayError as e:  # the worker died, or the task could not run at all
                outcome = {"status": "failed", "run_dir": None, "metrics": {}, "error": str(e)[-2000:]}
            yield params, outcome
    finally:
        ray.shutdown()  # stops a local Ray; only disconnects from a cluster


def _load_points(sweep_dir: Path) -> dict[str, dict]:
    path = sweep_dir / "sweep.json"
    if not path.exists():
        return {}
    return {_key(p["params"]): p for p in json.loads(path.read_text())["points"]}


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def _label(params: dict, names: list[str]) -> str:
    return ", ".join(f"{n}={params[n]!r}" for n in names) or "defaults"


@dataclasses.dataclass
class SweepResult:
    dir: Path
    points: list[dict]
    plot: Path | None

    @property
    def failed(self) -> list[dict]:
        return [p for p in self.points if p["status"] != "done"]


def run_sweep(spec: SweepSpec, options: SweepOptions | None = None) -> SweepResult:
    """Run the points not done yet, recording each outcome as it arrives; then the table, plot and index."""
    options = options or SweepOptions()
    root = Path(options.root or results_root()).resolve()  # absolute: Ray workers run in another directory
    sweep_dir = root / "sweeps" / spec.name / spec.sweep_id()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    known = {} if options.force else _load_points(sweep_dir)
    points = [known.get(_key(p)) or {"params": p, "status": "pending", "run_dir": None, "error": None,
                                     "metrics": {}} for p in spec.points()]
    todo = [p["params"] for p in points if p["status"] != "done"]
    print(f"sweep {sweep_dir}\n{len(points)} point(s): {len(points) - len(todo)} already done, "
          f"{len(todo)} to run", flush=True)
    by_key = {_key(p["params"]): p for p in points}
    if not todo:  # everything done already: no Ray to start
        outcomes = iter(())
    elif options.local:
        outcomes = _run_in_process(spec, todo, root)
    else:
        outcomes = _run_on_ray(spec, todo, root, options)
    for i, (params, outcome) in enumerate(outcomes, start=1):
        seconds = outcome.pop("seconds", None)
        by_key[_key(params)].update(outcome)
        took = f" in {seconds:.1f} s" if seconds is not None else ""
        what = outcome["run_dir"] if outcome["status"] == "done" else f"FAILED: {_last_line(outcome['error'])}"
        print(f"[{i}/{len(todo)}] {_label(params, spec.swept)}: {outcome['status']}{took}: {what}", flush=True)
        _write_record(spec, sweep_dir, points)  # after every point, so an interrupted sweep keeps its progress
    plot = write_report(spec, sweep_dir, points, options.metric)
    return SweepResult(sweep_dir, points, plot)


def _last_line(text) -> str:
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _write_record(spec: SweepSpec, sweep_dir: Path, points: list[dict]) -> Path:
    record = {"notebook": spec.name, "sweep_id": sweep_dir.name, "command": spec.command(), "grid": _plain(spec.grid),
              "swept": spec.swept, "preset": spec.preset, "points": points}
    path = sweep_dir / "sweep.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def points_table(spec: SweepSpec, points: list[dict]):
    """One row per point: swept parameters, status, run_dir (relative to the results root), error, metrics."""
    import pandas as pd

    rows = [{**{n: p["params"][n] for n in spec.swept}, "status": p["status"], "run_dir": p["run_dir"],
             "node": p.get("node"), "error": _last_line(p["error"]) or None, **p["metrics"]} for p in points]
    return pd.DataFrame(rows)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def choose_metric(points: list[dict], asked: str | None) -> str | None:
    """`asked`, else the first numeric metric every done point has, preferring any other to duration_s."""
    done = [p["metrics"] for p in points if p["status"] == "done"]
    if not done:
        return None
    common = [k for k in done[0] if all(_numeric(m.get(k)) for m in done)]
    if asked in common:
        return asked
    if asked is not None:  # after a long sweep, a plot of another metric beats none; the table has them all
        print(f"no numeric metric {asked!r} in every done point (they have: {', '.join(common)}); "
              "plotting the default one", file=sys.stderr)
    return next((k for k in common if k != "duration_s"), common[0] if common else None)


def plot_metric(spec: SweepSpec, points: list[dict], metric: str, path: Path) -> Path:
    """`metric` against the first swept parameter, one line per combination of the other swept ones.

    Non-numeric x values (strings, lists, booleans) are placed evenly in grid order and labelled."""
    from matplotlib.figure import Figure  # no pyplot: no backend to pick, safe inside a notebook kernel

    names = spec.swept or list(spec.grid)
    x, others = names[0], names[1:]
    values = _plain(spec.grid[x])
    categorical = not all(_numeric(v) for v in values)
    position = {_key({"v": v}): i for i, v in enumerate(values)}
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    done = [p for p in points if p["status"] == "done"]
    for combo in dict.fromkeys(_key({n: p["params"][n] for n in others}) for p in done):
        line = [p for p in done if _key({n: p["params"][n] for n in others}) == combo]
        xs = [position[_key({"v": p["params"][x]})] if categorical else p["params"][x] for p in line]
        pairs = sorted(zip(xs, (p["metrics"][metric] for p in line)))
        ax.plot([a for a, _ in pairs], [b for _, b in pairs], marker="o",
                label=_label(line[0]["params"], others) if others else None)
    if categorical:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
    elif len(values) <= 12:  # a tick per grid value, not matplotlib's round numbers between them
        ax.set_xticks(sorted(set(values)))
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(f"{spec.name}: {metric}" + (f" (preset {spec.preset})" if spec.preset else ""))
    if others:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def write_report(spec: SweepSpec, sweep_dir: Path, points: list[dict], metric: str | None = None) -> Path | None:
    """sweep.json, points.csv, the plot (when a point is done and has a numeric metric) and README.md."""
    _write_record(spec, sweep_dir, points)
    points_table(spec, points).to_csv(sweep_dir / "points.csv", index=False)
    chosen = choose_metric(points, metric)
    plot = plot_metric(spec, points, chosen, sweep_dir / f"{chosen}.png") if chosen and spec.grid else None
    _write_readme(spec, sweep_dir, points, chosen, plot)
    return plot


def _write_readme(spec: SweepSpec, sweep_dir: Path, points: list[dict], metric: str | None, plot: Path | None):
    root = sweep_dir.parents[2]
    fixed = {n: v[0] for n, v in spec.grid.items() if n not in spec.swept}
    done = sum(p["status"] == "done" for p in points)
    lines = [f"# Sweep of {spec.name}", "", f"`{spec.command()}`", "",
             f"Fixed: {_label(fixed, list(fixed)) if fixed else 'nothing'}. {len(points)} points: {done} done, "
             f"{len(points) - done} failed or not run. The table of every point's metrics is "
             "[points.csv](points.csv); the full record (errors included) is [sweep.json](sweep.json).", ""]
    if plot:
        lines += [f"![{metric}]({plot.name})", ""]
    header = [*spec.swept, "status", "run", *([metric] if metric else []), "error"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for p in points:
        run = (f"[{Path(p['run_dir']).name}]({os.path.relpath(root / p['run_dir'], sweep_dir)}/)"
               if p["run_dir"] else "")
        value = p["metrics"].get(metric, "") if metric else None
        cells = [*(repr(p["params"][n]) for n in spec.swept), p["status"], run,
                 *([f"{value:.4g}" if isinstance(value, float) else str(value)] if metric else []),
                 _last_line(p["error"])]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    (sweep_dir / "README.md").write_text("\n".join(lines) + "\n")
