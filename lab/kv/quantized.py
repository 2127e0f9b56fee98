"""The pool the quantized KV formats share: codes and scales per block, read back by dequantizing.

A quantized store keeps the codes of a `lab.kv.format.KVCacheFormat` in the pool (uint8 bytes: how a format's
codes become bytes is its module's `encode`/`decode`, `lab.kv.fp8` and `lab.kv.integer`) and, for per-token
formats, an fp16 scale (and an fp16 zero point on asymmetric integer grids) per token and KV head; static formats
keep one calibrated scale per layer (and head) outside the pool. Reads dequantize the gathered blocks. With
`pre_rope`, keys are un-rotated before they are quantized and rotated back on read, at their positions in the
sequence. The bytes of the pool are what `lab.memory.kv_bytes_per_token` predicts for the format (tested).

Per-channel keys and full-precision windows read exact copies kept outside the pool (`lab.kv.staging`); such a
store cannot be rewound, read by the Triton kernels, or attended with sliding windows (its `capabilities`).
"""

from __future__ import annotations

import math

import torch

from lab.models.llama import apply_rope

from .format import KVCacheFormat, QuantizedKV, dequantize, exact_mask, quantize, staging_length
from .protocol import KVCapabilities, pool_bytes_per_token
from .staging import StagedSequence, StagingLanes, StagingMetadata


def stages(fmt: KVCacheFormat) -> bool:
    """Whether `fmt` keeps exact copies outside the pool: a window, or per-channel keys whose group is filling."""
    return staging_length(fmt) > 0 or fmt.granularity == "per-channel"


class QuantizedKVStore:
    """A format module subclasses it with `code_width`, `encode` and `decode` (and may add checks, scales and
    capabilities); the pool, the scales, the staging and the pre-RoPE rotation are shared."""

    codec = "lab.kernels.kv_codec.PagedKVCache"

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv: int, head_dim: int,
                 fmt: KVCacheFormat, dtype: torch.dtype, device: torch.device, static_scales=None, rope=None,
                 num_lanes: int = 1, running=None):
        self.check_servable(fmt, head_dim, block_size)
        if fmt.static and static_scales is None:
            raise ValueError(f"kv_cache_dtype {fmt.dtype} at {fmt.granularity} needs static scales: calibrate them "
                             f"with lab.kv.calibration.calibrate_kv_absmax, or pass KVScales.unit(...) for "
                             f"vLLM's default scale of 1.0")
        self.fmt, self.dtype, self.block_size, self.head_dim, self.rope = fmt, dtype, block_size, head_dim, rope
        self.num_layers, self.num_blocks = n_layers, num_blocks
        code_shape = (n_layers, num_blocks, block_size, n_kv, self.code_width(fmt, head_dim))
        # Bytes in the pool; fp8 codes are viewed as float8 only to compute (index_copy_ wants plain types).
        self.codes = {r: torch.zeros(code_shape, dtype=torch.uint8, device=device) for r in "kv"}
        self.scale, self.zero = {}, {}
        if fmt.static:
            self.static = {r: [static_scales.scale(fmt, i, r).to(device).reshape(1, 1, -1, 1) for i in range(n_layers)]
                           for r in "kv"}
        for role in "kv":
            shape = _meta_shape(fmt, role, block_size, n_kv, head_dim)
            if shape is not None:
                self.scale[role] = torch.ones((n_layers, num_blocks, *shape), dtype=torch.float16, device=device)
                if fmt.asymmetric:
                    self.zero[role] = torch.zeros((n_layers, num_blocks, *shape), dtype=torch.float16, device=device)
        self.staging_length = staging_length(fmt)
        stage_shape = (n_layers, num_lanes * self.staging_length, n_kv, head_dim)
        self.staged = {r: torch.zeros(stage_shape, dtype=dtype, device=device) for r in "kv"} \
            if self.staging_length else {}
        # Staging lanes (exact K/V of each running sequence's last tokens), for windows and per-channel keys.
        self.stages = stages(fmt)
        self.lanes = StagingLanes(num_lanes, block_size, self.staging_length,
                                  fmt.token_group if fmt.granularity == "per-channel" else 0, device, running)

    @classmethod
    def build(cls, model, shape: tuple, fmt: KVCacheFormat, dtype: torch.dtype, device: torch.device,
              kv_scales=None, num_lanes: int = 1, running=None) -> QuantizedKVStore:
        """The registry's constructor (`lab.kv.build_store`): `shape` (layers, blocks, block_size, KV heads,
        head_dim), the format's static scales (`serving_scales`) and `num_lanes` staging lanes."""
        scales = cls.serving_scales(model, fmt, kv_scales)
        return cls(*shape, fmt, dtype, device, scales, model.rope, num_lanes, running)

    @classmethod
    def serving_scales(cls, model, fmt: KVCacheFormat, kv_scales):
        """The calibrated scales a static format serves with (a format module may supply a default)."""
        return kv_scales

    @staticmethod
    def capabilities_for(fmt: KVCacheFormat) -> KVCapabilities:
        in_pool = not stages(fmt) and not fmt.pre_rope  # every token read from the pool, keys after RoPE
        return KVCapabilities(triton=in_pool, speculation=not stages(fmt), attention_layouts=in_pool, parallel=False)

    @property
    def capabilities(self) -> KVCapabilities:
        return self.capabilities_for(self.fmt)

    # ---- what a format module defines: its codes as bytes ------------------------------------------------
    @staticmethod
    def code_width(fmt: KVCacheFormat, head_dim: int) -> int:
        """Bytes of one token's codes for one KV head."""
        raise NotImplementedError

    def encode(self, codes: torch.Tensor) -> torch.Tensor:
        """`quantize`'s codes [T, H, D] as the pool's uint8 bytes [T, H, code_width]."""
        raise NotImplementedError

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        """The pool's bytes back to codes `dequantize` reads."""
        raise NotImplementedError

    @classmethod
    def check_servable(cls, fmt: KVCacheFormat, head_dim: int, block_size: int) -> None:
        if fmt.granularity == "per-channel" and block_size % fmt.token_group:
            raise ValueError(f"per-channel keys group {fmt.token_group} tokens, which must divide block_size "
                             f"{block_size} (a group's scales live in its block)")

    # ---- sizes ---------------------------------------------------------------------------------------------
    @classmethod
    def bytes_per_block(cls, n_layers, block_size, n_kv, head_dim, fmt: KVCacheFormat, dtype=None) -> int:
        cls.check_servable(fmt, head_dim, block_size)
        meta_bytes = 2 * (2 if fmt.asymmetric else 1)
        total = 0
        for role in "kv":
            shape = _meta_shape(fmt, role, block_size, n_kv, head_dim)
            total += block_size * n_kv * cls.code_width(fmt, head_dim) + (math.prod(shape) * meta_bytes if shape else 0)
        return n_layers * total

    @staticmethod
    def staging_bytes_for(n_layers, n_kv, head_dim, fmt: KVCacheFormat, num_lanes: int, dtype: torch.dtype) -> int:
        return 2 * n_layers * num_lanes * staging_length(fmt) * n_kv * head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the block pool (codes and scales)."""
        return sum(t.nbytes for d in (self.codes, self.scale, self.zero) for t in d.values())

    @property
    def bytes_per_token(self) -> float:
        return pool_bytes_per_token(self)

    @property
    def staging_bytes(self) -> int:
        return sum(t.nbytes for t in self.staged.values())

    # ---- exact copies --------------------------------------------------------------------------------------
    def staging_metadata(self, scheduled: list[tuple[StagedSequence, int]], num_tokens: int) -> StagingMetadata | None:
        """Where this step's exact K/V come from and go to (None for a format without exact copies)."""
        return self.lanes.metadata(scheduled, num_tokens) if self.stages else None

    def exact_mask(self, role: str, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Where a query at q_pos reads the key (or value) at k_pos exactly (`lab.kv.format.exact_mask`)."""
        return exact_mask(self.fmt, role, q_pos, k_pos)

    def exact_source(self, layer: int, staging, k: torch.Tensor, v: torch.Tensor):
        """The exact K and V this step can read: its own tokens' rows, then the staged rows it reads."""
        return tuple(torch.cat([x, self.staged[r][layer].index_select(0, staging.read_slots)])
                     for r, x in (("k", k), ("v", v)))

    def stage(self, layer: int, staging, k: torch.Tensor, v: torch.Tensor) -> None:
        for role, x in (("k", k), ("v", v)):
            self.staged[role][layer].index_copy_(0, staging.write_slots, x.index_select(0, staging.write_rows))

    # ---- the pool ------------------------------------------------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor | None = None, staging=None, exact_k: torch.Tensor | None = None) -> None:
        """Quantize this step's tokens into their slots; per-channel keys instead quantize the groups this step
        completes, from `exact_k` (`exact_source`) at the rows `staging` names."""
        if self.fmt.granularity_of("k") == "per-channel":
            groups = exact_k.index_select(0, staging.group_rows)
            self._write(layer, "k", staging.group_meta, staging.group_slots,
                        self._unrotate(groups, staging.group_positions))
        else:
            self._write(layer, "k", slots, slots, self._unrotate(k, positions))
        self._write(layer, "v", slots, slots, v)

    def _unrotate(self, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self.fmt.pre_rope or not k.shape[0]:
            return k
        cos, signed_sin = self.rope(positions)
        return apply_rope(k, cos, -signed_sin)

    def _write(self, layer: int, role: str, meta_slots: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
        if not x.shape[0]:
            return
        scale = self.static[role][layer].reshape(-1) if self.fmt.static else None
        q = quantize(x, self.fmt, role, scale)
        codes = self.encode(q.codes)
        flat = self.codes[role][layer].view(-1, *self.codes[role].shape[-2:])
        flat.index_copy_(0, slots, codes)
        if role in self.scale:
            # Per-channel groups: one row of scales per group (all tokens of a group share it).
            step = self.fmt.token_group if self.fmt.granularity_of(role) == "per-channel" else 1
            for store, value in ((self.scale, q.scale), (self.zero, q.zero)):
                if role in store:
                    store[role][layer].view(-1, *store[role].shape[-2:]).index_copy_(0, meta_slots, value[::step].half())

    def gather(self, layer: int, blocks: torch.Tensor, per_sequence: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`blocks` holds the block tables of one or more sequences, `per_sequence` blocks each (default: one
        sequence); keys stored before RoPE are rotated to their positions in their sequence."""
        out = []
        for role in "kv":
            codes = self.decode(self.codes[role][layer].index_select(0, blocks))
            scale = zero = None
            if self.fmt.static:
                scale = self.static[role][layer]
            else:
                scale = self._read_meta(self.scale[role][layer], blocks, role)
                zero = self._read_meta(self.zero[role][layer], blocks, role) if self.fmt.asymmetric else None
            x = dequantize(QuantizedKV(codes, scale, zero, 0), self.fmt)
            if role == "k" and self.fmt.pre_rope:
                n = x.shape[0] * x.shape[1]
                span = (per_sequence or x.shape[0]) * self.block_size  # slots of one sequence's table
                cos, signed_sin = self.rope(torch.arange(n, device=x.device) % span)
                x = apply_rope(x.reshape(n, *x.shape[2:]), cos, signed_sin).reshape(x.shape)
            out.append(x.to(self.dtype))
        return out[0], out[1]

    def _read_meta(self, meta: torch.Tensor, blocks: torch.Tensor, role: str) -> torch.Tensor:
        m = meta.index_select(0, blocks).float()
        return m.repeat_interleave(self.fmt.token_group, dim=1) if self.fmt.granularity_of(role) == "per-channel" else m

    def kernel_view(self, layer: int) -> dict:
        n_kv = self.codes["k"].shape[3]
        if self.fmt.static:
            scales = [self.static[r][layer].reshape(-1).expand(n_kv).contiguous() for r in "kv"]
            zeros = [None, None]
        else:
            scales = [self.scale[r][layer] for r in "kv"]
            zeros = [self.zero[r][layer] if r in self.zero else None for r in "kv"]
        return dict(k=self.codes["k"][layer], v=self.codes["v"][layer], head_dim=self.head_dim, fmt=self.fmt,
                    k_scale=scales[0], v_scale=scales[1], k_zero=zeros[0], v_zero=zeros[1])


def _meta_shape(fmt: KVCacheFormat, role: str, block_size: int, n_kv: int, head_dim: int) -> tuple | None:
    """Per-block shape of the dynamic scales (and zeros) of `role`: None for static scales."""
    gran = fmt.granularity_of(role)
    if gran == "per-token":
        return (block_size, n_kv, 1)
    if gran == "per-channel":
        return (block_size // fmt.token_group, n_kv, head_dim)
    return None
