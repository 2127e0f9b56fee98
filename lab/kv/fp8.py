"""The fp8 KV formats (`fp8_e4m3`, `fp8_e5m2`; vLLM's "fp8" is e4m3): each code is one float8 byte.

Codes: torch's float8 types, stored as their raw byte (`encode` views them as uint8, `decode` back), at any
granularity of `lab.kv.format` (per-tensor by default, vLLM's `k_scale`/`v_scale`). Calibration: static scales
come from `lab.kv.calibration.calibrate_kv_absmax`; without them this format does what vLLM does, serves at a scale
of 1.0 and says so (`serving_scales`). The Triton kernels encode and decode fp8 from its bit fields
(`lab.kernels.kv_codec`, picked by `kernel_flags` from the format).
"""

from __future__ import annotations

import logging

import torch

from .format import FP8_TYPES, KVCacheFormat
from .quantized import QuantizedKVStore

log = logging.getLogger(__name__)


class FP8KVStore(QuantizedKVStore):
    @classmethod
    def serving_scales(cls, model, fmt: KVCacheFormat, kv_scales):
        if fmt.static and kv_scales is None:
            from .calibration import KVScales  # the calibration tools load tqdm; only this fallback needs them

            # vLLM's behaviour: fp8 without k_scale/v_scale runs at a scale of 1.0.
            log.warning("kv_cache_dtype %s without kv_scales: a static scale of 1.0 (vLLM's default); calibrate "
                        "with lab.kv.calibration.calibrate_kv_absmax for real scales", fmt.dtype)
            return KVScales.unit(model, fmt)
        return kv_scales

    @staticmethod
    def code_width(fmt: KVCacheFormat, head_dim: int) -> int:
        return head_dim

    def encode(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.view(torch.uint8)

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        return data.view(FP8_TYPES[self.fmt.dtype])
