"""Memory accounting: parameters, weight bytes by format, KV bytes per token, paging waste, capacity.

The accounts every inference argument starts from (the deployment article, `003_...` section 1.1,
and the replay article, `000_...` section 1.1, in ../shared/seeds), done exactly, one module each:

- `shape`: parameters from the shapes of a config.json, with an explicit head_dim, GQA, tied embeddings,
  MoE (total and active) and DeepSeek's multi-head latent attention (MLA);
- `weights`: weight bytes per storage format, scale and zero-point overhead included (GPTQ/AWQ store zeros
  packed at the weight bit width; GGUF blocks hold their own scales), embeddings and LM head
  optionally left unquantized;
- `kv_cache`: KV bytes per token: 2 x layers x kv_heads x head_dim x bytes for MHA/GQA, and one latent of
  kv_lora_rank + qk_rope_head_dim per layer for MLA (DeepSeek-V2 paper, section 2.1: no factor 2),
  plus the scales each quantization granularity stores, capped by sliding windows;
- `paging`: paging waste (Kwon et al., PagedAttention, SOSP 2023: at most one partly filled block per
  sequence) against contiguous preallocation to max_model_len, and the blocks a sequence holds when sliding
  windows free some (`blocks_held`: every layer windowed; with some global layers one shared pool frees none);
- `device_capacity`: capacity by vLLM's rule: KV blocks = (memory x utilization - weights - activation peak - overhead)
  / block bytes, and the concurrency they hold;
- `report`: all of it for one model, as `lab memory` prints it.

GiB (1024^3 bytes) is used wherever a number is reported in "GB", as the articles' own code does.
Every public name is importable from `lab.memory` itself.
"""

from .device_capacity import Capacity, activation_peak_bytes, capacity, memory_for_concurrency
from .kv_cache import (KV_DTYPE_BITS, KV_GRANULARITIES, default_kv_granularity, dtype_name, effective_layers,
                       kv_bytes_per_token, kv_cache_bytes, kv_elements_per_token_per_layer)
from .paging import blocks_held, lognormal_from_percentiles, lognormal_lengths, paging_waste
from .report import GIB, format_report, memory_report
from .shape import PRESETS_DIR, ModelShape, attention_params, param_counts
from .weights import WeightFormat, linear_shapes, weight_bytes, weight_bytes_for_params, weight_format

__all__ = [
    "GIB", "KV_DTYPE_BITS", "KV_GRANULARITIES", "PRESETS_DIR", "Capacity", "ModelShape", "WeightFormat",
    "activation_peak_bytes", "attention_params", "blocks_held", "capacity", "default_kv_granularity", "dtype_name",
    "effective_layers", "format_report", "kv_bytes_per_token", "kv_cache_bytes", "kv_elements_per_token_per_layer",
    "linear_shapes", "lognormal_from_percentiles", "lognormal_lengths", "memory_for_concurrency", "memory_report",
    "paging_waste", "param_counts", "weight_bytes", "weight_bytes_for_params", "weight_format",
]
