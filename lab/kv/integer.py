"""The integer KV formats (`int8`, `int4`, `int2`): uniform grids, codes packed along the head dimension.

Codes: `bits`-bit integers, packed lowest bits first into bytes along the head dimension (`pack_codes`), so a head
of D channels takes D * bits / 8 bytes and D * bits must be a multiple of 8 (`check_servable`). Dynamic
granularities (per-token, per-channel keys) are asymmetric with an fp16 zero point beside each scale; static ones
(per-tensor, per-head) are symmetric and need calibrated scales (`lab.kv.calibration.calibrate_kv_absmax`): there is
no default to fall back on, so the store refuses to start without them. The Triton kernels unpack and quantize the
same grid (`lab.kernels.kv_codec`, its integer path).
"""

from __future__ import annotations

import torch

from .format import KVCacheFormat, pack_codes, unpack_codes
from .quantized import QuantizedKVStore


class IntKVStore(QuantizedKVStore):
    @staticmethod
    def code_width(fmt: KVCacheFormat, head_dim: int) -> int:
        return head_dim * fmt.bits // 8

    @classmethod
    def check_servable(cls, fmt: KVCacheFormat, head_dim: int, block_size: int) -> None:
        super().check_servable(fmt, head_dim, block_size)
        if head_dim * fmt.bits % 8:
            raise ValueError(f"head_dim {head_dim} cannot be packed at {fmt.bits} bits")

    def encode(self, codes: torch.Tensor) -> torch.Tensor:
        return pack_codes(codes, self.fmt.bits)

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        return unpack_codes(data, self.fmt.bits)
