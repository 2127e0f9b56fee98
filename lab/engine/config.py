"""`EngineConfig`: every option of the engine in one dataclass, validated in one place.

`LLM(model, **options)` builds one; its field names are vLLM's where the concept exists (`dtype`,
`block_size`, `max_model_len`, `max_num_seqs`, `max_num_batched_tokens`, `enable_prefix_caching`,
`enable_chunked_prefill`, `kv_cache_dtype`), so a vLLM user's keyword arguments mean the same here. Checks
that need no model run in `__post_init__`; those that need the loaded model (its rotary table, its attention
layout) in `lab.engine.model_runner.check_model`. Features (`speculative`, `replay`, `structured_outputs`, `extensions`) are
`lab.engine.extension.ExtensionConfig`s: the engine builds them and knows nothing else about them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from lab.models.loader import DTYPES, default_device, parse_dtype
from lab.kv import KVCacheFormat, capabilities, parse_kv_cache_dtype

from .structured import StructuredOutputsConfig

__all__ = ["ATTENTION_BACKENDS", "DTYPES", "EngineConfig", "parse_dtype"]

# "torch": gather the blocks, then SDPA (lab.models.attention); "triton": the lab.kernels read them in place.
ATTENTION_BACKENDS = ("torch", "triton")


@dataclass
class EngineConfig:
    model: object = "smollm2-135m"  # a name or path for lab.models.load_model, or a loaded LlamaModel
    tokenizer: object = None  # with a loaded model: its tokenizer
    dtype: str | torch.dtype | None = "auto"
    device: str | torch.device | None = None  # None: CUDA if present, else the CPU
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: as many as max_num_seqs x max_model_len need, within free memory
    max_model_len: int = 2048
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str = "torch"
    # vLLM's switch: False runs each step's forward and LM head as one torch.compile graph (lab.engine.compiled;
    # compiled on first use, minutes on a small CPU, then cached on disk). The lab's default is the eager
    # reference path, which every invariant is stated against.
    enforce_eager: bool = True
    # A model the engine loads itself in bfloat16 or float16 on a CPU gets its linears' weights reordered once for
    # oneDNN (lab.models.prepack: 1.5-2.7x faster matmuls at decode's few rows), eager or compiled (each prepacked
    # linear is then one opaque operator in the graph); float32 gains nothing measurable there. A model passed in is
    # left as it is.
    prepack_weights: bool = True
    # "auto" (the model's dtype), a lab.kv format string ("fp8", "int4/per-channel/window64", ...) or a
    # KVCacheFormat; static granularities need kv_scales (lab.kv.calibration.KVScales). What its store supports
    # (the Triton kernels, parallelism, ...) is `kv_capabilities`, from its store (lab.kv.registry).
    kv_cache_dtype: str | KVCacheFormat | None = "auto"
    kv_scales: object = None
    speculative: object = None  # lab.speculative.SpeculativeConfig
    replay: object = None  # lab.replay.ReplayConfig
    # grammar-constrained decoding for requests that ask for it (SamplingParams.structured_outputs); always built
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    extensions: list = field(default_factory=list)  # any further ExtensionConfigs, built in this order
    # N > 1: the model split over N ranks, this process and N - 1 workers (lab.parallel): tensor parallelism
    # splits every layer (Megatron-style), pipeline parallelism the layers into stages, a step's batch flowing
    # through them in micro-batches (None: one per stage; the count the engine starts with, which
    # `PipelineGroup.set_micro_batches` may change between steps). The timeout bounds every collective of a step
    # (and, x5, the workers' start-up).
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_micro_batches: int | None = None
    parallel_timeout: float = 60.0

    def __post_init__(self):
        for name in ("block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1):
            raise ValueError(f"num_kv_blocks must be a positive integer, got {self.num_kv_blocks!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend {self.attention_backend!r} is not one of {ATTENTION_BACKENDS}")
        self.torch_dtype = parse_dtype(self.dtype)
        self.kv_format = parse_kv_cache_dtype(self.kv_cache_dtype)
        self.kv_capabilities = capabilities(self.kv_format)
        if self.attention_backend == "triton" and not self.kv_capabilities.triton:
            raise ValueError(f"the Triton kernels cannot read kv_cache_dtype {self.kv_cache_dtype!r} in place (its "
                             f"store lacks the 'triton' capability: the kernels read per-token, per-head and "
                             f"per-tensor formats whose every token is in the pool); use attention_backend='torch'")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: max_num_batched_tokens "
                f"{self.max_num_batched_tokens} < max_model_len {self.max_model_len}"
            )
        if not isinstance(self.structured_outputs, StructuredOutputsConfig):
            raise ValueError(f"structured_outputs must be a StructuredOutputsConfig, got {self.structured_outputs!r}")
        self.check_parallel()
        for ext in self.extension_configs:
            if not callable(getattr(ext, "build", None)):
                raise ValueError(f"{ext!r} is not an engine extension config (it has no build(engine) method)")

    @property
    def extension_configs(self) -> list:
        return [e for e in (self.replay, self.speculative, self.structured_outputs, *self.extensions) if e is not None]

    @property
    def parallel(self) -> bool:
        return self.tensor_parallel_size > 1 or self.pipeline_parallel_size > 1

    def check_parallel(self) -> None:
        """The options tensor and pipeline parallelism take (lab.parallel); what they do not support is refused
        by name."""
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive integer, got {n!r}")
        m = self.pipeline_micro_batches
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"pipeline_micro_batches must be a positive integer or None, got {m!r}")
        if not self.parallel:
            return
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} with pipeline_parallel_size "
                             f"{self.pipeline_parallel_size}: the two are not combined yet; use one of them")
        option = "tensor_parallel_size" if self.tensor_parallel_size > 1 else "pipeline_parallel_size"
        n = getattr(self, option)
        device = default_device() if self.device is None else torch.device(self.device)
        devices = torch.cuda.device_count() if device.type == "cuda" else None
        if devices is not None and n > devices:
            raise ValueError(f"{option} {n} exceeds the {devices} CUDA devices")
        if not isinstance(self.parallel_timeout, (int, float)) or not self.parallel_timeout > 0:
            raise ValueError(f"parallel_timeout must be positive seconds, got {self.parallel_timeout!r}")
        refused = {
            "model": not isinstance(self.model, (str, os.PathLike)),  # each rank loads its part from the source
            "kv_cache_dtype": not self.kv_capabilities.parallel,
            "attention_backend": self.attention_backend != "torch",
            "enforce_eager": not self.enforce_eager,
            # each feature says whether it runs across processes (`ExtensionConfig.across_processes`)
            "speculative": not getattr(self.speculative, "across_processes", True),
            "replay": not getattr(self.replay, "across_processes", True),
        }
        for name, bad in refused.items():
            if bad:
                value = f"a loaded {type(self.model).__name__}" if name == "model" else repr(getattr(self, name))
                raise ValueError(f"{option} {n} does not support {name}={value} (supported across processes: a "
                                 f"model name or path, kv_cache_dtype='auto', attention_backend='torch', "
                                 f"enforce_eager=True, ngram speculation, token replay)")
