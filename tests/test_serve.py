"""The OpenAI-compatible server (lab.serve) on the real model, and the load generator (lab.bench.serve):
streamed and whole answers equal `LLM.generate`'s greedy tokens; /metrics parses as Prometheus text; a client
that disconnects frees its blocks; bad requests get a 4xx naming the problem while valid ones complete; the
load generator stops by itself within its bounds; the log-normal fit hits its percentiles."""

import asyncio
import json
import math
import random
import time

import httpx
import pytest

from lab.bench.serve import LengthDist, LoadConfig, percentiles, run_load, run_load_sync
from lab.engine import LLM, SamplingParams
from lab.serve import ServerThread

PROMPT = "Explain what a KV cache is in two sentences."


@pytest.fixture(scope="module")
def server(smollm):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_seqs=8)
    with ServerThread(llm) as srv:
        yield srv


@pytest.fixture(scope="module")
def want(smollm):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512)
    chat = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    return {"text": llm.generate([PROMPT], params)[0], "chat": llm.generate([chat], params)[0]}


def _stream(url, path, body):
    chunks = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def test_completion_whole_and_streamed_equal_generate(server, want):
    body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert r["choices"][0]["token_ids"] == want["text"].token_ids
    assert r["choices"][0]["text"] == want["text"].text and r["choices"][0]["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": len(want["text"].prompt_token_ids), "completion_tokens": 12,
                          "total_tokens": len(want["text"].prompt_token_ids) + 12}
    chunks = _stream(server.url, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    tokens = [t for c in chunks if c["choices"] for t in c["choices"][0]["token_ids"]]
    assert tokens == want["text"].token_ids
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want["text"].text
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_chat_completion_whole_and_streamed_equal_generate(server, want):
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12,
            "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["content"] == want["chat"].text
    chunks = _stream(server.url, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == want["chat"].text


def test_metrics_parse_as_prometheus_text(server):
    from prometheus_client.parser import text_string_to_metric_families

    httpx.post(server.url + "/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 3},
               timeout=60)
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("lab_time_to_first_token_seconds", "lab_time_per_output_token_seconds",
                 "lab_e2e_request_latency_seconds", "lab_num_requests_waiting", "lab_kv_blocks_used",
                 "lab_prefix_cache_hit_rate", "lab_num_preemptions"):
        assert name in fams, name
    count = next(s.value for s in fams["lab_time_to_first_token_seconds"].samples if s.name.endswith("_count"))
    assert count >= 1
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def _idle(server, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = server.engine.llm.stats()
        if s["running"] == 0 and s["waiting"] == 0 and s["kv_blocks_used"] == 0:
            return True
        time.sleep(0.05)
    return False


def test_a_disconnecting_client_frees_its_blocks(server):
    aborted = server.engine.metrics.aborted._value.get()
    body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        assert server.engine.llm.stats()["kv_blocks_used"] > 0
    # the connection is closed after one chunk: the request must be aborted and its blocks returned
    assert _idle(server)
    assert server.engine.metrics.aborted._value.get() == aborted + 1


def test_a_client_leaving_n_samples_aborts_every_one(server):
    body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True,
            "n": 3, "temperature": 1.0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
    assert _idle(server) and server.engine.llm.stats()["fanout_held"] == 0


def test_bad_requests_get_4xx_while_valid_ones_complete(server, want):
    url = server.url + "/v1/completions"
    good = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    bad = [({"content": b"{not json"}, 400, "not valid JSON: Expecting property name enclosed in double quotes at character 1"),
           ({"json": {**good, "model": "gpt-4"}}, 404, "model 'gpt-4' does not exist"),
           ({"json": {**good, "max_tokens": 600}}, 400, "exceeds max_model_len 512"),
           ({"json": {**good, "n": 0}}, 400, "n: Input should be greater than or equal to 1"),
           ({"json": {**good, "presence_penalty": 3}}, 400, "presence_penalty: Input should be less than or equal to 2"),
           ({"json": {**good, "logprobs": 6}}, 400, "logprobs: Input should be less than or equal to 5"),
           ({"json": {**good, "stop": [""]}}, 400, "stop must be a non-empty string"),
           ({"json": {**good, "temperature": -1}}, 400, "temperature: Input should be greater than or equal to 0"),
           ({"json": {"model": "smollm2-135m"}}, 400, "prompt: Field required"),
           ({"json": {**good, "prompt": [10**9]}}, 400, "outside the vocabulary")]

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            valid = [c.post(url, json=good) for _ in range(2)]
            invalid = [c.post(url, headers={"content-type": "application/json"}, **kw) for kw, _, _ in bad]
            return await asyncio.gather(*valid, *invalid)

    responses = asyncio.run(main())
    for r in responses[:2]:
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want["text"].token_ids
    for r, (_, status, words) in zip(responses[2:], bad):
        assert r.status_code == status, (r.status_code, r.text)
        assert words in r.json()["error"]["message"], r.text
    assert _idle(server)


def test_a_request_failing_inside_a_step_fails_alone_as_a_server_error(server, want, monkeypatch):
    """Beside three good requests (one streamed), one whose row fails the step gets a 500 typed server_error;
    the others get their tokens. An underflowing temperature is greedy; an infinite one is refused."""
    import lab.engine.sampler as sampler_module

    real = sampler_module.choose

    def sample(logits, params, generators):
        if any(p.seed == 666 for p in params):
            raise RuntimeError("poisoned row")
        return real(logits, params, generators)

    monkeypatch.setattr(sampler_module, "choose", sample)
    url = server.url + "/v1/completions"
    good = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(c.post(url, json=good), c.post(url, json={**good, "temperature": 1e-40}),
                                        c.post(url, json={**good, "temperature": 0.7, "seed": 666}),
                                        c.post(url, headers={"content-type": "application/json"},
                                               content=json.dumps(good).replace('"temperature": 0', '"temperature": 1e999')))

    ok, tiny, poisoned, inf = asyncio.run(main())
    assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"] == want["text"].token_ids
    assert tiny.status_code == 200 and tiny.json()["choices"][0]["token_ids"] == want["text"].token_ids
    assert poisoned.status_code == 500 and poisoned.json()["error"]["type"] == "server_error"
    assert "poisoned row" in poisoned.json()["error"]["message"]
    assert inf.status_code == 400 and "temperature" in inf.json()["error"]["message"]
    assert _idle(server)


def test_logprobs_in_openais_shapes_equal_the_engines(server, smollm):
    model, tok = smollm
    msgs = [{"role": "user", "content": PROMPT}]
    ref = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512).chat(
        msgs, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2))[0]
    body = {"model": "smollm2-135m", "messages": msgs, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2}
    whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    streamed = [t for c in _stream(server.url, "/v1/chat/completions", body) if c.get("choices")
                for t in (c["choices"][0]["logprobs"] or {"content": []})["content"]]
    for content in (whole["content"], streamed):
        assert [c["token"] for c in content] == [tok.decode([t]) for t in ref.token_ids]
        for c, t, e in zip(content, ref.token_ids, ref.logprobs):
            assert abs(c["logprob"] - e[t].logprob) < 1e-4 and len(c["top_logprobs"]) == 2
            assert c["bytes"] == list(c["token"].encode())
    legacy = httpx.post(server.url + "/v1/completions", json={"model": "smollm2-135m", "prompt": PROMPT,
                        "max_tokens": 4, "temperature": 0, "logprobs": 1}, timeout=60).json()["choices"][0]
    assert len(legacy["logprobs"]["tokens"]) == 4 and all(len(t) == 1 for t in legacy["logprobs"]["top_logprobs"])
    bad = httpx.post(server.url + "/v1/chat/completions", json={**body, "logprobs": False}, timeout=60)
    assert bad.status_code == 400 and "top_logprobs needs logprobs" in bad.json()["error"]["message"]
    assert _idle(server)


def test_n_samples_over_http_equal_the_engines_whole_and_streamed(server, smollm):
    model, tok = smollm
    msgs = [{"role": "user", "content": PROMPT}]
    want = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512).chat(
        msgs, SamplingParams(max_tokens=8, temperature=1.0, seed=5, n=3, ignore_eos=True))[0].outputs
    body = {"model": "smollm2-135m", "messages": msgs, "max_tokens": 8, "temperature": 1.0, "seed": 5, "n": 3,
            "ignore_eos": True, "return_token_ids": True}
    whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in whole["choices"]] == [w.token_ids for w in want]
    assert whole["usage"]["completion_tokens"] == 24
    chunks = _stream(server.url, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    streamed = {i: [] for i in range(3)}
    for c in chunks:
        for ch in c["choices"]:
            streamed[ch["index"]] += ch["token_ids"]
    assert [streamed[i] for i in range(3)] == [w.token_ids for w in want]
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    assert _idle(server)


def test_load_generator_runs_and_reports(server):
    cfg = LoadConfig(url=server.url, num_requests=6, max_concurrency=3, input_len=LengthDist(16, 32, 48),
                     output_len=LengthDist(4, 6, 8), max_model_len=512, scrape_interval_s=0.05)
    report = run_load_sync(cfg)
    s = report.summary()
    assert s["ok"] == 6 and s["failed"] == 0 and s["cancelled"] == 0
    assert all(r.output_tokens == r.output_tokens_requested for r in report.requests)
    assert s["ttft_p50"] <= s["ttft_p99"] <= s["e2e_p99"] and s["output_throughput"] > 0
    assert 0 <= s["slo_attainment"] <= 1 and report.scrapes and "lab_kv_blocks_used" in report.scrapes[0]


def test_load_generator_stops_within_its_time_bound(server):
    cfg = LoadConfig(url=server.url, num_requests=20, max_concurrency=4, input_len=LengthDist(8, 8, 8, fixed=True),
                     output_len=LengthDist(300, 300, 300, fixed=True), max_model_len=512, duration_s=1.5,
                     scrape_interval_s=None)
    t = time.perf_counter()
    report = asyncio.run(run_load(cfg))
    assert time.perf_counter() - t < 10
    s = report.summary()
    assert s["cancelled"] > 0 and s["ok"] + s["cancelled"] + s["failed"] == 20
    assert _idle(server)  # the cancelled requests were aborted on the server


def test_lognormal_fit_hits_its_percentiles():
    d = LengthDist(100, 300, 900)
    draws, redrawn = d.sample(random.Random(0), 40000, 10**6)
    p = percentiles(draws, (50, 90, 99))
    mu, sigma = d.fit()
    assert p["p50"] == pytest.approx(100, rel=0.05) and mu == pytest.approx(math.log(100))
    assert p["p90"] == pytest.approx(300, rel=0.1) and p["p99"] == pytest.approx(900, rel=0.15)
    assert redrawn == 0
    assert LengthDist(64, 64, 64, fixed=True).sample(random.Random(0), 3, 100) == ([64, 64, 64], 0)
    with pytest.raises(ValueError, match="need 1 <= P50 <= P90 <= P99"):
        LengthDist(100, 50, 900)
    with pytest.raises(ValueError, match="length P99 900 exceeds the limit 512"):
        d.sample(random.Random(0), 1, 512)


def test_cli_bench_serve(server, tmp_path, capsys):
    from lab.cli import main

    out = tmp_path / "report.json"
    assert main(["bench", "serve", "--url", server.url, "--num-requests", "3", "--input-len", "16",
                 "--output-len", "4", "--max-model-len", "512", "--json", str(out), "--plot",
                 str(tmp_path / "dashboard.png")]) == 0
    assert (tmp_path / "dashboard.png").stat().st_size > 0
    assert "ttft_p99" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["summary"]["ok"] == 3 and len(report["requests"]) == 3


def test_knee_and_batch_rule_on_synthetic_sweeps():
    import pandas as pd

    from lab.studies.serving.measure import ServingParams, batch_rule, find_knee

    ramp = pd.DataFrame({"concurrency": [1, 2, 4, 8, 16], "output_throughput": [10, 19, 35, 37, 38],
                         "tpot_p99": [0.05, 0.06, 0.08, 0.15, 0.3]})
    assert find_knee(ramp, 0.10) == 4  # 4 -> 8 gains 6% while TPOT P99 rises: 4 is the knee
    ramp["output_throughput"] = [10, 19, 35, 60, 100]
    assert find_knee(ramp, 0.10) == 16  # never flattens: the last level
    sweep = pd.DataFrame({"max_num_seqs": [1, 2, 4, 8], "ttft_p50": [1.0, 1.1, 1.25, 1.6],
                          "output_throughput": [10, 18, 21, 22]})
    t, chosen = batch_rule(sweep)
    assert chosen == 4 and t["rule_stops_here"].tolist() == [False, False, False, True]
    with pytest.raises(ValueError, match=r"INPUT_LEN=\(64, 32, 512\)|P50 <= P90"):
        ServingParams(INPUT_LEN=(64, 32, 512))
    with pytest.raises(ValueError, match="CONCURRENCY"):
        ServingParams(CONCURRENCY=(0,))


def test_a_stopped_server_releases_its_engine(smollm):
    """FastAPI caches endpoint functions process-wide; routes that closed over the engine kept every engine and
    its KV pool alive (a study that starts a server per experiment ran out of memory)."""
    import gc
    import weakref

    model, tok = smollm

    def serve_once():
        llm = LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=256)
        with ServerThread(llm) as srv:
            assert httpx.post(srv.url + "/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi",
                                                                 "max_tokens": 2}, timeout=60).status_code == 200
        return weakref.ref(llm)

    ref = serve_once()
    gc.collect()
    assert ref() is None


def test_lab_serve_command_serves_a_new_user(smollm):
    """`lab serve` as a user starts it: its own process, the default model, a port, here with n-gram speculation;
    a chat request, then a repetitive prompt whose greedy tokens must equal plain `LLM.generate`'s."""
    import os
    import subprocess
    import sys

    from prometheus_client.parser import text_string_to_metric_families

    from lab.serve.server import free_port

    model, tok = smollm
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Repeat exactly: one two three four "
                                                  "five six seven eight."}], add_generation_prompt=True,
                                                tokenize=False), add_special_tokens=False)
    want = LLM(model, tokenizer=tok, num_kv_blocks=32, max_model_len=256).generate(
        [prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].token_ids

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "serve", "--port", str(port), "--max-model-len", "256",
                             "--num-kv-blocks", "32", "--warmup", "--speculative", "ngram", "--dtype", "float32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ | {"OMP_NUM_THREADS": "1"})
    try:
        url, end = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < end, proc.stdout.read().decode()[-2000:]
            time.sleep(0.2)
        r = httpx.post(url + "/v1/chat/completions", json={"model": "smollm2-135m", "max_tokens": 4,
                                                            "messages": [{"role": "user", "content": "Hi"}]},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": 12,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want
        metrics = {s.name: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                   for s in f.samples}
        assert metrics["lab_spec_rounds_total"] > 0 and metrics["lab_spec_accepted_total"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_ready_only_after_the_warm_up_while_health_answers_throughout(smollm):
    """A readiness probe on /ready keeps traffic away until the warm-up request has run; /health (liveness) answers
    200 from the start, so a slow warm-up does not get the process restarted."""
    import threading

    from lab.serve.async_engine import warm_up

    model, tok = smollm
    gate = threading.Event()

    def slow_warm_up(llm):
        assert gate.wait(60)
        warm_up(llm)

    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=256), warmup=slow_warm_up) as srv:
        health, ready = httpx.get(srv.url + "/health"), httpx.get(srv.url + "/ready")
        assert health.status_code == 200 and health.json()["ready"] is False
        assert ready.status_code == 503 and ready.json()["status"] == "warming up"
        gate.set()
        end = time.monotonic() + 60
        while (ready := httpx.get(srv.url + "/ready")).status_code != 200 and time.monotonic() < end:
            time.sleep(0.05)
        assert ready.status_code == 200 and ready.json()["warmup_s"] > 0
        assert httpx.get(srv.url + "/health").json()["ready"] is True


def test_a_failed_warm_up_fails_both_probes_and_refuses_requests(smollm):
    model, tok = smollm

    def broken(llm):
        raise RuntimeError("no memory for the KV pool")

    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=256), warmup=broken) as srv:
        end = time.monotonic() + 30
        while (health := httpx.get(srv.url + "/health")).status_code == 200 and time.monotonic() < end:
            time.sleep(0.02)
        assert health.status_code == 503 and "no memory for the KV pool" in health.json()["error"]
        assert httpx.get(srv.url + "/ready").json()["status"] == "failed"
        r = httpx.post(srv.url + "/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 503 and "warm-up failed: RuntimeError" in r.json()["error"]["message"]


def test_the_dashboard_spans_the_load_however_close_the_metrics_polls():
    """Three /metrics polls a millisecond apart (notebook 06's smoke knee, once) made the engine-state panel an
    axis of 2 ms whose tick labels overlapped ("0.30025", "0.30050", ...), which the figure check failed. Every
    panel now spans the load, from 0 to its end."""
    import matplotlib.pyplot as plt

    from lab.bench.dashboard import plot_dashboard
    from lab.bench.serve import LoadReport
    from lab.figures.check import problems

    scrapes = [{"t": 0.3 + i * 1e-3, "lab_kv_blocks_used": 5 + i, "lab_num_requests_running": 1,
                "lab_num_requests_waiting": 0} for i in range(3)]
    fig = plot_dashboard(LoadReport({}, [], 1.3, 0, scrapes), "concurrency 2 (knee)")
    try:
        assert problems(fig) == []
        assert [ax.get_xlim() for ax in fig.axes if ax.get_visible()] == [(0.0, 1.3)] * 5
    finally:
        plt.close(fig)


def test_compared_settings_take_turns_running_first(monkeypatch):
    """Study 06 compares settings back to back within a run; a fixed order lets a drift over the run's minutes
    favour whichever runs first (prefix caching on always ran before off). Each setting now runs first equally
    often, and with as many runs as settings the three length shapes take every position once."""
    from lab.bench.serve import LoadReport
    from lab.studies.serving import measure

    ran = []

    def fake_serve_and_load(model, tokenizer, engine, cfg):
        ran.append(engine.get("enable_prefix_caching"))
        report = LoadReport.__new__(LoadReport)
        report.scrapes = []
        return report

    monkeypatch.setattr(measure, "serve_and_load", fake_serve_and_load)
    metrics = dict.fromkeys(("goodput_requests", "output_throughput", "tpot_p99", "ttft_p99"), 1.0)
    monkeypatch.setattr(measure, "_row", lambda label, report: {**label, **metrics})
    p = measure.ServingParams(REPEATS=3)
    model = type("M", (), {"config": type("C", (), {"vocab_size": 100})()})()

    prefix, _ = measure.prefix_caching(p, model, None, 2)
    first = prefix[prefix["position"] == 0].groupby("prompts")["prefix_caching"].apply(list)
    assert all(v == [True, False, True] for v in first), first  # on first in runs 0 and 2, off first in run 1
    assert ran[:4] == [True, False, True, False] and ran[4:8] == [False, True] * 2  # as they ran

    chunked, _ = measure.chunked_prefill(p, model, None, 2)
    assert chunked.sort_values(["repeat", "position"])["chunked_prefill"].tolist() == [True, False, False, True,
                                                                                     True, False]
    shapes = measure.length_shapes(p, model, None, 2)
    by_position = shapes.pivot(index="repeat", columns="position", values="lengths")
    for col in by_position:  # every shape once in every position over the three runs
        assert sorted(by_position[col]) == sorted(shapes["lengths"].unique()), by_position
    assert measure.in_turn(("a", "b", "c"), 4) == ["b", "c", "a"]
