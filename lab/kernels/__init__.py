"""Triton kernels of the lab (`lab.kernels`; inside `lab/` because a top-level `kernels/` folder would shadow the
Hugging Face `kernels` package, which transformers imports):

- `paged_attention`: decode (split-KV, GQA) and prefill/extend attention reading the paged pool in place;
- `kv_write`: the KV write (`reshape_and_cache`), quantizing on the way;
- `replay`: K/V recomputed from stored layer inputs (projection + RoPE), written to the cache;
- `kv_codec`: the pool's layout (`PagedKVCache`) and the dequantize/quantize code the kernels share.

Each kernel has its PyTorch reference beside it and its memory traffic as a formula in its docstring.

Without a GPU the kernels run on CPU tensors in Triton's interpreter: importing `lab` sets TRITON_INTERPRET=1
when CUDA is absent and the variable is unset (Triton reads it when it is first imported). The interpreter is
slow (numpy, one program at a time) and has no bf16 arithmetic: tests use small shapes in float32. `interpreter`
removes the part of its slowness that is repetition (a patch of `triton.language` on every device-function call).
"""

import os

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

if os.environ.get("TRITON_INTERPRET") == "1":
    if not isinstance(tl.zeros, InterpretedFunction):
        raise ImportError("TRITON_INTERPRET=1 was set after Triton was first imported, so its interpreter is off: "
                          "set it in the environment, or import lab before anything that imports triton")
    from .interpreter import install

    install()  # one patch of triton.language per launch, not per device-function call (see its docstring)

from .kv_codec import PagedKVCache, check_supported  # noqa: E402
from .paged_attention import (paged_decode_attention, paged_decode_attention_ref, paged_prefill_attention,  # noqa: E402
                              paged_prefill_attention_ref)
from .replay import replay_kv, replay_kv_ref  # noqa: E402
from .kv_write import reshape_and_cache, reshape_and_cache_ref  # noqa: E402

__all__ = ["PagedKVCache", "check_supported", "paged_decode_attention", "paged_decode_attention_ref",
           "paged_prefill_attention", "paged_prefill_attention_ref", "replay_kv", "replay_kv_ref",
           "reshape_and_cache", "reshape_and_cache_ref"]
