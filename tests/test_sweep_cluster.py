"""`lab sweep` beyond one process (issue 38 item 8): points run on every node of a real two-node Ray cluster,
concurrent points never leave a half-written index or metrics file for another to read, and a failed point
links the run directory it made."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lab.machine.procs import all_pids, cmdline, proc_stat
from lab.workflow import sweep
from lab.workflow.atomic import write_atomic
from lab.workflow.index import write_index
from lab.workflow.notebook import resolve_notebook, run_environment
from lab.workflow.sweep import build_spec

NOTEBOOK = "00_engine_tour"
RAY = Path(sys.executable).with_name("ray")
# Each live node's label (its `lab_node_<name>` resource) by node id, as JSON.
NODES = """import json, os, ray
ray.init(address=os.environ["ADDRESS"], logging_level="WARNING")
print(json.dumps({n["NodeID"]: next(r.removeprefix("lab_node_") for r in n["Resources"] if r.startswith("lab_node_"))
                  for n in ray.nodes() if n["Alive"]}))
"""


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    write_atomic(path, '{"a": 1}')
    real = Path.write_text

    def dies_midway(self, text, *args, **kwargs):
        real(self, text[:3])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", dies_midway)
    with pytest.raises(OSError):
        write_atomic(path, '{"a": 2}')
    assert json.loads(path.read_text()) == {"a": 1}


def test_index_writers_take_turns(tmp_path):
    """A second writer waits for the first (both would list the runs, then one would overwrite the other's)."""
    import fcntl

    write_index(tmp_path)
    done = threading.Event()
    with open(tmp_path / ".index.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        writer = threading.Thread(target=lambda: (write_index(tmp_path), done.set()))
        writer.start()
        assert not done.wait(0.5)  # held back while another writer holds the lock
    writer.join(10)
    assert done.is_set() and (tmp_path / "README.md").exists()


def test_a_failed_point_links_the_run_directory_it_made(tmp_path, monkeypatch):
    def fails_inside_its_run(notebook, params, root):
        with run_environment(resolve_notebook(notebook), params, root):
            raise ValueError("NUM_REQUESTS=0 is outside [1, 64]")

    monkeypatch.setattr(sweep, "run_notebook", fails_inside_its_run)
    result = sweep.run_sweep(build_spec(NOTEBOOK, [("NUM_REQUESTS", "0")], "smoke"),
                             sweep.SweepOptions(root=tmp_path, local=True))
    [point] = result.points
    assert point["status"] == "failed" and point["run_dir"].startswith(f"{NOTEBOOK}/")
    assert json.loads((tmp_path / point["run_dir"] / "metrics.json").read_text())["status"] == "failed"
    assert f"({os.path.relpath(tmp_path / point['run_dir'], result.dir)}/)" in (result.dir / "README.md").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(temp: Path) -> None:
    """Stop this cluster's processes only (those started with its temp dir, and their children): `ray stop`
    would also stop a local Ray another test worker is running."""
    import signal

    table = {}
    for pid in all_pids():
        stat, cmd = proc_stat(pid), cmdline(pid)
        if stat is not None and cmd is not None:
            table[pid] = (stat.ppid, cmd)
    ours = {pid for pid, (_, cmd) in table.items() if str(temp) in cmd}
    while grown := {pid for pid, (ppid, _) in table.items() if ppid in ours} - ours:
        ours |= grown
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3  # until they are gone (or zombies), 3 s at most
        while time.monotonic() < deadline and any((st := proc_stat(p)) and st.state != "Z" for p in ours):
            time.sleep(0.1)


@pytest.fixture(scope="module")
def two_node_cluster():
    """`ray start --head` and a second node joining it, one CPU each, on this machine; each node is labelled by
    a custom resource (`lab_node_<name>`: this Ray's `ray start` has no --labels). Ray 2.60 turns token
    authentication on for a cluster started this way: the nodes and this process share a fresh token."""
    import secrets

    import shutil
    import tempfile

    # A short path of its own: Ray's sockets live under it and a Unix socket path may not pass 107 bytes, which
    # pytest's tmp_path under xdist (/tmp/pytest-of-root/pytest-N/popen-gw0/...) does.
    port, temp = _free_port(), Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    address = f"127.0.0.1:{port}"
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", f"--temp-dir={temp}"]
    nodes = [["--head", f"--port={port}", "--include-dashboard=false", '--resources={"lab_node_head": 1}'],
             [f"--address={address}", '--resources={"lab_node_second": 1}']]
    try:
        for args in nodes:
            done = subprocess.run([str(RAY), "start", *common, *args], capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
        yield address
    finally:
        _stop(temp)
        shutil.rmtree(temp, ignore_errors=True)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.slow
def test_points_run_on_both_nodes_and_the_index_survives_four_at_once(two_node_cluster, tmp_path, user16):
    """The driver runs in processes of their own, as a user's would: Ray keeps the first auth token it loads
    for the life of a process, so a driver in this test worker, after another test's local Ray, would present
    that one and be refused."""
    nodes = subprocess.run([sys.executable, "-c", NODES], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "ADDRESS": two_node_cluster})
    assert nodes.returncode == 0, nodes.stderr[-2000:]
    labels = json.loads(nodes.stdout.strip().splitlines()[-1])
    assert sorted(labels.values()) == ["head", "second"]
    # a small random checkpoint: the sweep across nodes is the question, not the model (tests/test_sweep.py's small)
    args = ["sweep", NOTEBOOK, "-p", "NUM_REQUESTS", "1,2,3,4", "-p", "MAX_TOKENS", "4", "-p", "MODEL", str(user16),
            "--preset", "smoke", "--results-dir", str(tmp_path), "--address", two_node_cluster,
            "--cpus-per-point", "0.5"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [sweep_dir] = (tmp_path / "sweeps" / NOTEBOOK).iterdir()
    table = pd.read_csv(sweep_dir / "points.csv")
    assert list(table["status"]) == ["done"] * 4 and list(table["requests"]) == [1, 2, 3, 4]
    assert {labels[n] for n in table["node"]} == {"head", "second"}  # both nodes ran points
    # four points wrote metrics and rewrote the index at once: every file parses and the index lists all four
    for run_dir in table["run_dir"]:
        json.loads((tmp_path / run_dir / "metrics.json").read_text())
    index = (tmp_path / "README.md").read_text()
    assert index.count(f"| {NOTEBOOK} |") == 1 and "| 4 |" in index  # one row, four runs counted
    assert not list(tmp_path.rglob(".*.tmp")), "a temporary file was left behind"
    print(f"two-node sweep of 4 points: {time.perf_counter() - start:.0f} s")
