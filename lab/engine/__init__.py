"""The lab's reference inference engine: paged KV cache, continuous batching, chunked prefill,
prefix caching, preemption by recompute. Start at `llm.LLM`."""

from .llm import LLM, EngineConfig
from .sampling import SamplingParams
from .sequence import RequestMetrics, RequestOutput

__all__ = ["LLM", "EngineConfig", "RequestMetrics", "RequestOutput", "SamplingParams"]
