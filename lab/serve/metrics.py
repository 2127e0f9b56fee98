"""The server's Prometheus metrics (`/metrics`, text exposition format, via `prometheus_client`).

Latencies are histograms observed when a request finishes, from the engine's own timestamps
(`RequestMetrics`): TTFT, TPOT (mean inter-token time of the request) and end-to-end latency. The engine's
state is read at scrape time from `LLM.stats()`: waiting and running requests, KV blocks in use, the prefix
cache's hit rate, preemptions, and with speculative decoding its rounds, drafted and accepted tokens. Names follow vLLM's where one exists (`vllm:time_to_first_token_seconds` is
`lab_time_to_first_token_seconds` here), so dashboards carry over.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


class _EngineState:
    """Reads the engine's counters at scrape time (a read of Python ints: safe from the server thread)."""

    def __init__(self, llm):
        self.llm = llm

    def collect(self):
        s = self.llm.stats()
        for name, doc, value in (("lab_num_requests_waiting", "requests queued, not yet scheduled", s["waiting"]),
                                 ("lab_num_requests_running", "requests holding KV blocks", s["running"]),
                                 ("lab_kv_blocks_used", "KV cache blocks in use", s["kv_blocks_used"]),
                                 ("lab_kv_blocks_total", "KV cache blocks in the pool", s["kv_blocks_total"]),
                                 ("lab_prefix_cache_hit_rate", "prompt tokens served from the prefix cache over "
                                                               "prompt tokens looked up", s["prefix_cache_hit_rate"])):
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("lab_num_preemptions", "sequences preempted (recomputed later)",
                                  value=s["preemptions"])
        yield CounterMetricFamily("lab_engine_steps", "engine steps run", value=s["steps"])
        if "spec_rounds" in s:  # an engine with speculative decoding
            for name, doc in (("rounds", "speculative verification rounds"), ("drafted", "draft tokens verified"),
                              ("accepted", "draft tokens accepted")):
                yield CounterMetricFamily(f"lab_spec_{name}", doc, value=s[f"spec_{name}"])


class ServerMetrics:
    def __init__(self, llm):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineState(llm))

        def hist(name, doc):
            return Histogram(name, doc, buckets=LATENCY_BUCKETS, registry=self.registry)

        self.ttft = hist("lab_time_to_first_token_seconds", "arrival to first token")
        self.tpot = hist("lab_time_per_output_token_seconds", "mean time between a request's output tokens")
        self.e2e = hist("lab_e2e_request_latency_seconds", "arrival to last token")
        self.finished = Counter("lab_requests_finished", "requests that finished", ["finish_reason"],
                                registry=self.registry)
        self.aborted = Counter("lab_requests_aborted", "requests abandoned by their client", registry=self.registry)
        self.failed = Counter("lab_requests_failed", "requests failed by an engine error", registry=self.registry)
        self.rejected = Counter("lab_requests_rejected", "requests refused with a 4xx", registry=self.registry)
        self.generation_tokens = Counter("lab_generation_tokens", "output tokens of finished requests",
                                         registry=self.registry)

    def observe_finished(self, out) -> None:
        m = out.metrics
        self.finished.labels(out.finish_reason).inc()
        self.generation_tokens.inc(len(out.token_ids))
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        if m.tpot is not None:
            self.tpot.observe(m.tpot)
        if m.e2e_latency is not None:
            self.e2e.observe(m.e2e_latency)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
