"""The lab's reference inference engine: paged KV cache, continuous batching, chunked prefill,
prefix caching, preemption by recompute; features plug in as extensions. Start at `llm.LLM`."""

from .config import EngineConfig
from .extension import EngineExtension
from .grammar import StructuredOutputsParams
from .llm import LLM
from .model_runner import KeysNotRebuildable
from .request import RequestMetrics, RequestOutput, SamplingParams
from .structured import StructuredOutputsConfig

__all__ = ["LLM", "EngineConfig", "EngineExtension", "KeysNotRebuildable", "RequestMetrics", "RequestOutput",
           "SamplingParams", "StructuredOutputsConfig", "StructuredOutputsParams"]
