"""A parallel rank that cannot start says why (issue 38 item 7): a main module that spawned ranks cannot
re-import is refused before spawning, and a rank that dies before it is ready shows the end of its own
traceback in the `RankFailure` (both were "rank 1 died (exit code 1)" and nothing else)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = """from lab.engine import LLM
llm = LLM("random:tiny", tensor_parallel_size=2, dtype="float32", max_model_len=64)
print("built", flush=True)
"""
ROOT = Path(__file__).resolve().parents[1]


def _python(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, **kwargs)


def test_a_script_on_stdin_is_refused_before_any_rank_is_spawned():
    done = _python("-", input=SCRIPT)
    assert done.returncode == 1 and "built" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: tensor-parallel ranks are spawned processes that re-import the main "
                           "module, and this one's file '<stdin>' cannot be read again"), last
    assert 'if __name__ == "__main__":' in last


def test_a_rank_that_dies_before_it_is_ready_reports_its_traceback(tmp_path):
    unguarded = tmp_path / "unguarded.py"  # builds the engine at import: the rank re-runs it and cannot spawn
    unguarded.write_text(SCRIPT)
    done = _python(str(unguarded))
    assert done.returncode == 1 and "built" not in done.stdout
    failure = done.stderr[done.stderr.index("RankFailure: "):]
    assert failure.startswith("RankFailure: tensor-parallel rank 1 died (exit code 1); the end of its stderr")
    assert "if __name__ == '__main__':" in failure  # multiprocessing's own explanation, from the rank


def test_a_guarded_script_runs_and_leaves_no_rank_log(tmp_path):
    guarded = tmp_path / "guarded.py"
    guarded.write_text('if __name__ == "__main__":\n' + "".join(f"    {line}\n" for line in SCRIPT.splitlines())
                       + "    logs = llm.extensions['tensor_parallel'].group.logs\n"
                       + "    llm.close()\n    print('logs left', sum(p.exists() for p in logs), len(logs))\n")
    done = _python(str(guarded))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "built" in done.stdout and "logs left 0 1" in done.stdout
