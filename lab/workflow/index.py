"""`results/README.md`: an index of study runs, regenerated after every run and by `lab results`."""

from __future__ import annotations

import json
from pathlib import Path

from .atomic import write_atomic

HEADER = """# Results

Measured results, written by `make run` (`lab run all`) and `lab run NOTEBOOK`. Each run directory
holds `params.json` (parameters and provenance: git commit, package versions, machine, start time),
`metrics.json` (key numbers and duration), CSV tables, PNG plots and the executed notebook. Nothing
here is typed by hand, and this index is regenerated after every run. Each notebook has a row per preset
it ran at: `reference` runs are the committed results the docs quote; `quick` runs (what `make run` makes)
answer the same questions on fewer points and are marked so nobody mistakes one for the other. "Matches the
code?" says whether the run's tree was dirty, or the code its notebook runs (the notebook and the study modules it
imports) behaves otherwise since its commit (stale; read from the code's syntax, so a move, a rename or a reworded
docstring keeps a run current): `lab runs --stale` names the files.

Each notebook's folder keeps its latest run per preset at the top; the runs they superseded move into its
`earlier/` folder (`lab runs --archive`), kept for comparison and never read by the index, the ledger, the docs or
the report. Beside the notebooks: `bench_engine*.json`/`.jsonl`/`.png`, the engine benchmark (`lab bench engine`: the reference run
and `make run`'s quick one), `bench_quant*.json` (`lab bench quant`), and `bench_compiled/`, `bench_profile*/`,
the benchmark runs with per-step profiles that docs/benchmarks.md quotes; `report/` is the HTML report
(`lab report`), `CLAIMS.md`/`.csv` the claims ledger (`lab claims`).
"""
PRESET_ORDER = ("reference", "quick", "smoke")


def run_preset(params: dict) -> str:
    """The preset a run used; runs from before presets existed were reference runs unless SMOKE was on."""
    values = params.get("parameters", {})
    return values.get("PRESET") or ("smoke" if values.get("SMOKE") else "reference")


# `lab run` puts this file in a run's directory before the notebook starts and removes it once the run has
# written everything (`lab.workflow.notebook.run_environment`): a run still executing, killed, or whose directory
# could not be written to the end, keeps it, and is not a result.
INCOMPLETE = "INCOMPLETE"


def list_runs(root: Path, include_failed: bool = False) -> list[dict]:
    """Every finished run under `root`, oldest first, with its notebook, id, metrics and plots. A run still
    executing, or one that never finished (killed, its directory unwritable), has no metrics.json yet or still
    holds `INCOMPLETE`, and is never listed; a failed one records `"status": "failed"` in metrics.json
    (`lab.workflow.notebook`) and is listed only with `include_failed` (the index shows its error). None of them
    is a result, so none can become a notebook's latest run for the ledger, the docs or the report, nor be moved
    by `archive`."""
    runs = []
    for params in sorted(root.glob("*/*/params.json")):
        run_dir = params.parent
        metrics_path = run_dir / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else None
        failed = metrics is not None and metrics.get("status") == "failed"
        if metrics is None or (failed and not include_failed) or ((run_dir / INCOMPLETE).exists() and not failed):
            continue
        runs.append({
            "notebook": run_dir.parent.name,
            "run_id": run_dir.name,
            "dir": run_dir,
            "params": (record := json.loads(params.read_text())),
            "preset": run_preset(record),
            "metrics": metrics,
            "plots": sorted(p.name for p in run_dir.glob("*.png")),
        })
    return sorted(runs, key=lambda r: (r["notebook"], r["run_id"]))


def superseded(root: Path) -> list[dict]:
    """Every run that is neither its notebook's latest reference run nor its latest run at another preset."""
    runs = list_runs(root)
    keep = {(r["notebook"], r["preset"]): r["run_id"] for r in runs}  # sorted by run id: the last one wins
    return [r for r in runs if keep[(r["notebook"], r["preset"])] != r["run_id"]]


def archive(root: Path) -> list[Path]:
    """Move the superseded runs under `<notebook>/earlier/`, which the index, the ledger and the report do not
    read (they read `<notebook>/<run>/`); the docs' "earlier runs" lists name them there."""
    moved = []
    for r in superseded(root):
        target = r["dir"].parent / "earlier" / r["dir"].name
        target.parent.mkdir(exist_ok=True)
        r["dir"].rename(target)
        moved.append(target)
    return moved


def last_line(text) -> str:
    """The last non-blank line of `text`, stripped: a traceback's exception, an error's last word."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    # One table cell: a failed run's traceback shows its last line (the exception), markdown pipes escaped.
    return last_line(value).replace("|", "\\|")


def flat_metrics(metrics: dict, prefix: str = "") -> dict:
    """The scalar metrics, a nested dict's as `outer.inner`; lists are left out (they are not a cell)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(flat_metrics(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            out[f"{prefix}{key}"] = value
    return out


def _metric_lines(metrics: dict) -> list[str]:
    """`key: value` per scalar metric; a dict of scalars (e.g. a study's claims) as `key.sub: value`."""
    return [f"{k}: {_fmt(v)}" for k, v in flat_metrics(metrics).items()]


def write_index(root: Path) -> Path:
    """Rewrite `root`/README.md from the runs on disk. Concurrent runs (a sweep's points) take turns under a
    lock on `root`/.index.lock, so each index lists every run finished before it, and the file is replaced
    atomically, so no reader sees half of one."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".index.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _write_index(root)


def _write_index(root: Path) -> Path:
    latest = {}
    runs = list_runs(root, include_failed=True)  # a failed run's row shows its error
    for r in runs:
        latest[(r["notebook"], r["preset"])] = r  # sorted by run id, so the last one wins
    order = {p: i for i, p in enumerate(PRESET_ORDER)}
    from .staleness import run_state

    repo = Path(__file__).resolve().parents[2]
    lines = [HEADER, "| notebook | preset | latest run | matches the code? | runs | key metrics | plots |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (name, preset), r in sorted(latest.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 9))):
        count = sum(1 for x in runs if x["notebook"] == name and x["preset"] == preset)
        metrics = "<br>".join(_metric_lines(r["metrics"]))
        rel = f"{name}/{r['run_id']}"
        plots = " ".join(f'<a href="{rel}/{p}"><img src="{rel}/{p}" width="160"></a>' for p in r["plots"])
        label = preset if preset == "reference" else f"**{preset}** (not a reference result)"
        # a stale or dirty run is shown, not hidden: the reader sees it here and in `lab runs --stale`
        state = "; ".join(f"**{why.split(':')[0]}**" for why in run_state(r, repo)) or "yes"
        lines.append(f"| {name} | {label} | [{r['run_id']}]({rel}/) | {state} | {count} | {metrics} | {plots} |")
    path = root / "README.md"
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def reference_states(root: Path, repo: Path) -> dict[str, tuple[Path, list[str]]]:
    """Each notebook's latest reference run under `root` with `run_state`'s reasons."""
    from .staleness import run_state

    latest = {r["notebook"]: r for r in list_runs(root) if r["preset"] == "reference"}
    return {nb: (r["dir"], run_state(r, repo)) for nb, r in sorted(latest.items())}
