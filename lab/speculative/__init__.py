"""Speculative decoding (Leviathan et al., 2023; Chen et al., 2023), lossless, in the paged engine:

- `verify`: speculative sampling (accept min(1, p/q), resample from max(0, p - q), bonus token);
- `theory`: expected tokens per round (1 - a^(k+1)) / (1 - a), the speedup with draft cost ratio c, best k,
  the conditional acceptance a from rounds;
- `drafters`: n-gram prompt lookup, layer-skip self-drafting, a quantized copy, any draft model;
- `speculator`: drafting, verification, rollback and the acceptance-threshold policy in the engine
  (`LLM(speculative=SpeculativeConfig(...))`);
- `prompts`: the task categories (the lab's prompt set, Spec-Bench's question.jsonl);
- `measure`: the draft cost ratio c and the verification cost, timed on the engine.
"""

from .drafters import Draft, ModelDrafter, NgramDrafter, layer_skip_model, quantized_copy, weight_bytes_ratio
from .speculator import DRAFTERS, SpeculativeConfig, Speculator, SpecStats
from .theory import best_k, conditional_acceptance, expected_tokens_per_round, predicted_speedup
from .verify import Verification, verify

__all__ = ["DRAFTERS", "Draft", "ModelDrafter", "NgramDrafter", "SpecStats", "SpeculativeConfig", "Speculator",
           "Verification", "best_k", "conditional_acceptance", "expected_tokens_per_round", "layer_skip_model",
           "predicted_speedup", "quantized_copy", "verify", "weight_bytes_ratio"]
