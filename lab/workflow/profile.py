"""Where a run's time goes, written beside its results (issue 52): per cell and per function.

Every run `lab run` makes carries two tables, so a study's reference preset can be shortened from its own
measurement rather than by guessing:

- `profile_cells.csv`: each code cell's seconds and share of the run, from papermill's record of the executed
  notebook (or, for `lab run --in-process`, timed as each cell runs);
- `profile_functions.csv`: a statistical profile of the notebook's main thread. A sampler thread reads that
  thread's Python stack every `INTERVAL_S` (`sys._current_frames`, as py-spy or pyinstrument read stacks, but in
  the process and with nothing to install) and counts, for every function, the samples in which it is running
  (`incl`: itself or anything it called, C code such as a torch operator included) and the samples in which it is
  the innermost of the lab's own functions (`lab_self`: the time spent in it or in library code it called
  directly, which is what a change to the lab can remove). Shares are of all samples; at one sample per 0.1 s a
  function's share is good to about 1 / sqrt(samples).

The sampler costs one stack walk per interval; while a torch operator holds the thread (the GIL released) the
walk does not wait for it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path

INTERVAL_S = 0.1
CELLS_FILE, FUNCTIONS_FILE = "profile_cells.csv", "profile_functions.csv"
REPO = Path(__file__).resolve().parents[2]


def _where(code) -> tuple[str, str, int]:
    """(qualified name, file relative to the checkout or to site-packages, first line) of a code object."""
    path = code.co_filename
    for root in (str(REPO) + "/", "site-packages/", "/lib/python"):
        if root in path:
            path = path.split(root, 1)[1]
            break
    return getattr(code, "co_qualname", code.co_name), path, code.co_firstlineno


class StackSampler:
    """Counts the functions on one thread's stack every `interval` seconds, from a daemon thread."""

    def __init__(self, thread_id: int | None = None, interval: float = INTERVAL_S):
        self.thread_id = thread_id if thread_id is not None else threading.main_thread().ident
        self.interval = interval
        self.samples = 0
        self.incl: Counter = Counter()
        self.lab_self: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-profile-sampler", daemon=True)
        self.started = self.stopped = None

    def start(self) -> StackSampler:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> StackSampler:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.stopped = time.perf_counter()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            seen, innermost_lab = set(), None
            while frame is not None:
                where = _where(frame.f_code)
                if innermost_lab is None and where[1].startswith(("lab/", "notebooks/")):
                    innermost_lab = where
                seen.add(where)
                frame = frame.f_back
            self.samples += 1
            self.incl.update(seen)
            if innermost_lab is not None:
                self.lab_self[innermost_lab] += 1

    def table(self, top: int = 300):
        """The functions by inclusive samples (the `top` most), with their lab-self samples and shares."""
        import pandas as pd

        rows = [{"function": f, "file": p, "line": line, "incl_samples": n, "lab_self_samples": self.lab_self[(f, p, line)]}
                for (f, p, line), n in self.incl.most_common(top)]
        df = pd.DataFrame(rows, columns=["function", "file", "line", "incl_samples", "lab_self_samples"])
        total = max(1, self.samples)
        df["incl_share"] = df["incl_samples"] / total
        df["lab_self_share"] = df["lab_self_samples"] / total
        df["incl_seconds"] = df["incl_samples"] * self.interval
        return df

    def write(self, run_dir: Path) -> Path:
        path = Path(run_dir) / FUNCTIONS_FILE
        self.table().to_csv(path, index=False)
        return path


def cell_table(cells: list[tuple[int, str, float]]):
    """Rows (cell index, its first line, seconds) as the cells table, with each cell's share of their sum."""
    import pandas as pd

    df = pd.DataFrame(cells, columns=["cell", "first_line", "seconds"])
    df["share"] = df["seconds"] / max(df["seconds"].sum(), 1e-9)
    return df


def cells_from_notebook(ipynb: Path):
    """The cells table from papermill's record in an executed notebook (`metadata.papermill.duration`)."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    return cell_table([(i, (c.source.strip().splitlines() or [""])[0][:120],
                        float(c.metadata.get("papermill", {}).get("duration") or 0.0)) for i, c in enumerate(code)])


# The sampler of the run executing in this process: started by `lab.workflow.run.start_run` under `lab run`,
# stopped and written by `Run.finish`.
_current: StackSampler | None = None


def start_sampling() -> None:
    global _current
    if _current is None:
        _current = StackSampler().start()


def finish_sampling(run_dir: Path) -> Path | None:
    global _current
    if _current is None:
        return None
    sampler, _current = _current.stop(), None
    return sampler.write(run_dir)
