"""Every run says where its time went (issue 52: `lab.workflow.profile`): per cell, and per function from a
sampler of the notebook's main thread."""
import threading
import time

import pandas as pd

from lab.workflow.profile import CELLS_FILE, FUNCTIONS_FILE, StackSampler


def _busy_in_the_lab_ish_function(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


def _sleeping_function(seconds):
    time.sleep(seconds)


def test_the_sampler_counts_where_the_thread_is():
    sampler = StackSampler(threading.get_ident(), interval=0.01).start()
    _busy_in_the_lab_ish_function(0.6)
    _sleeping_function(0.3)
    sampler.stop()
    table = sampler.table().set_index("function")
    busy = table.loc["_busy_in_the_lab_ish_function", "incl_samples"]
    asleep = table.loc["_sleeping_function", "incl_samples"]
    # about 2:1, however loaded the machine: both are counted by the same clock
    assert sampler.samples >= 20 and busy > asleep > 0, table.head()
    assert 1.0 < busy / asleep < 4.0
    this = table.loc["test_the_sampler_counts_where_the_thread_is"]
    assert this["incl_samples"] == sampler.samples and this["incl_share"] == 1.0


def test_an_in_process_run_writes_its_cells_and_functions(tmp_path):
    from lab.cli import main

    assert main(["run", "04_replay_break_even", "--in-process", "--preset", "smoke", "--model", "random:tiny",
                 "--results-dir", str(tmp_path)]) == 0
    (run,) = (tmp_path / "04_replay_break_even").glob("2*")
    cells = pd.read_csv(run / CELLS_FILE)
    assert len(cells) > 5 and (cells["seconds"] >= 0).all() and abs(cells["share"].sum() - 1) < 1e-6
    assert cells["first_line"].str.contains("study").any()
    functions = pd.read_csv(run / FUNCTIONS_FILE)
    assert functions["incl_samples"].is_monotonic_decreasing
    # the study's own code is where the samples are, by file
    assert functions["file"].str.startswith("lab/").any() and (functions["lab_self_share"] <= 1).all()
