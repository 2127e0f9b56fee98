"""Speculative decoding (issue 9, in progress; see its note for what is missing):

- `verify`: lossless speculative sampling (accept min(1, p/q), resample from max(0, p - q), bonus token);
- `theory`: expected tokens per round (1 - a^(k+1)) / (1 - a), the speedup with draft cost ratio c, best k,
  the conditional acceptance a from rounds;
- `drafters`: n-gram prompt lookup;
- `speculator`: drafting, verification and rollback in the engine (`LLM(speculative=SpeculativeConfig(...))`).
"""

from .drafters import NgramDrafter
from .speculator import SpeculativeConfig, Speculator
from .theory import best_k, conditional_acceptance, expected_tokens_per_round, predicted_speedup
from .verify import Verification, verify

__all__ = ["NgramDrafter", "SpeculativeConfig", "Speculator", "Verification", "best_k", "conditional_acceptance",
           "expected_tokens_per_round", "predicted_speedup", "verify"]
