"""Results kept case by case (issue 38 item 2): a benchmark stopped by the GPU suite's time limit keeps every case
it finished, in a .jsonl beside the JSON it never got to write."""

import json
import subprocess
import sys
import textwrap

from lab.bench.caselog import CaseLog, read_cases


def test_cases_are_on_disk_as_each_finishes_and_a_cut_last_line_is_dropped(tmp_path):
    path = tmp_path / "out" / "bench.jsonl"
    log = CaseLog(path)
    log.write("decode", {"batch": 1, "ms": 0.5, "bad": float("nan")})
    assert read_cases(path) == [{"kind": "decode", "batch": 1, "ms": 0.5, "bad": None}]  # strict JSON: NaN as null
    log.write("decode", {"batch": 2, "ms": 0.7})
    with open(path, "a") as f:
        f.write('{"kind": "decode", "bat')  # what a kill mid-write leaves
    assert [c["batch"] for c in read_cases(path)] == [1, 2]
    CaseLog(path)  # a rerun into the same folder starts the file afresh
    assert read_cases(path) == []
    CaseLog(None).write("decode", {"batch": 3})  # no path: nothing written, nothing raised


def test_a_killed_benchmark_keeps_the_cases_it_finished(tmp_path):
    path = tmp_path / "bench.jsonl"
    script = textwrap.dedent(f"""
        import os, signal
        from lab.bench.caselog import CaseLog
        log = CaseLog({str(path)!r})
        for i in range(3):
            log.write("case", {{"i": i}})
        os.kill(os.getpid(), signal.SIGKILL)  # as `timeout --kill-after` ends a step
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert done.returncode == -9
    assert [c["i"] for c in read_cases(path)] == [0, 1, 2]
    assert all(json.loads(line) for line in path.read_text().splitlines())
