"""Bit packing of weight-only quantized linears: GPTQ and AWQ (GEMM) qweight/qzeros layouts, both ways.

The lab keeps a quantized linear as codes q [out, in] (uint8 on an asymmetric grid, int8 on a
symmetric one), scales and zeros [out, groups] and g_idx [in] (see `lab.quant.rtn`). The formats
that GPTQModel / AutoGPTQ / AutoAWQ / vLLM read store the same numbers transposed ([in, out] order)
and bit-packed into int32 words:

GPTQ (`pack_gptq`, bits 2, 4, 8; 3-bit packing spans word boundaries and is refused):
    qweight int32 [in * bits / 32, out]   packed along the INPUT dimension: word r of column o holds
                                          codes of inputs r*32/bits + j at bit offset j * bits
    qzeros  int32 [groups, out * bits/32] packed along OUTPUT channels (same bit order), storing
                                          zero - 1 (the historical AutoGPTQ offset, "gptq" format;
                                          GPTQModel's "gptq_v2" stores zero itself)
    scales  fp16  [groups, out]
    g_idx   int32 [in]                    group of each input column (act-order makes it a permuted
                                          j // group_size)
    A symmetric (signed) grid is stored as unsigned codes q + 2^(b-1) with zero 2^(b-1), which is
    what `sym: true` GPTQ checkpoints hold (qzeros 0x77777777 at 4 bits after the offset).
    Because of the offset, an asymmetric zero point of 0 cannot be stored (zero - 1 = -1 does not fit
    in `bits` unsigned bits; kernels would read it back as 2^bits): `pack_gptq` refuses it.

AWQ GEMM (`pack_awq`, AutoAWQ's WQLinear_GEMM, 4 bits only):
    qweight int32 [in, out / 8]           packed along OUTPUT channels; the 8 nibbles of a word, from
                                          the lowest, hold output channels 0, 2, 4, 6, 1, 3, 5, 7 of
                                          its block of 8
    qzeros  int32 [groups, out / 8]       same packing, zero points WITHOUT offset
    scales  fp16  [groups, out]
    No g_idx: groups are always contiguous (j // group_size).

Ragged last groups (SmolLM2's 576 = 4 * 128 + 64) are REFUSED with a ValueError naming the
dimension and the group size. GPTQ's g_idx could in principle express them, but every reader of
these formats (GPTQ's exllama/marlin kernels in vLLM and GPTQModel, AutoAWQ's GEMM kernel) takes
groups = in_features // group_size from the config and checks in_features % group_size == 0, so
such a checkpoint would be rejected or misread by the very tools the format exists for. Quantize
with a group size that divides every input dimension (e.g. 64 or 32 for 576) instead.

`lab.quant.formats` writes and reads whole checkpoints in these layouts.
"""

from __future__ import annotations

import torch

GPTQ_BITS = (2, 4, 8)
AWQ_BITS = (4,)
# AutoAWQ's WQLinear_GEMM: nibble i of a packed word holds output channel AWQ_ORDER[i] of its block.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


# --------------------------------------------------------------------------- bit packing helpers

def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> int32 with the same bit pattern."""
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def _from_int32(words: torch.Tensor) -> torch.Tensor:
    """int32 -> int64 in [0, 2^32) with the same bit pattern."""
    if words.dtype != torch.int32:
        raise ValueError(f"packed tensors must be int32; got {words.dtype}")
    return words.to(torch.int64) & 0xFFFFFFFF


def _pack_last(x: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """Pack the last dim of int64 `x` (values in [0, 2^bits)) into int32 words of 32/bits values;
    value `order[i]` of each block goes to bit offset i * bits."""
    pf = 32 // bits
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // pf, pf)
    if order is not None:
        blocks = blocks[..., list(order)]
    shifts = torch.arange(pf, dtype=torch.int64, device=x.device) * bits
    return _to_int32((blocks << shifts).sum(-1))


def _unpack_last(words: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """Inverse of `_pack_last`: int32 [..., n] -> int64 [..., n * 32/bits]."""
    pf = 32 // bits
    shifts = torch.arange(pf, dtype=torch.int64, device=words.device) * bits
    vals = (_from_int32(words).unsqueeze(-1) >> shifts) & (2 ** bits - 1)
    if order is not None:
        inverse = [0] * pf
        for i, o in enumerate(order):
            inverse[o] = i
        vals = vals[..., inverse]
    return vals.reshape(*words.shape[:-1], words.shape[-1] * pf)


def _check_common(q, scales, zeros, bits, supported, fmt):
    if isinstance(bits, bool) or bits not in supported:
        hint = " (3-bit packing, which spans int32 words, is not implemented)" if bits == 3 else ""
        raise ValueError(f"{fmt} packing supports bits {supported}; got bits={bits!r}{hint}")
    if q.dim() != 2 or scales.dim() != 2 or scales.shape != zeros.shape or scales.shape[0] != q.shape[0]:
        raise ValueError(f"shapes do not match: codes {tuple(q.shape)} [out, in], scales {tuple(scales.shape)} "
                         f"and zeros {tuple(zeros.shape)} [out, groups]")
    if q.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"codes must be uint8 (asymmetric grid) or int8 (symmetric grid); got {q.dtype}")


def _to_unsigned(q, zeros, bits):
    qi, zi = q.to(torch.int64), zeros.to(torch.int64)
    if q.dtype == torch.int8:
        qi, zi = qi + 2 ** (bits - 1), zi + 2 ** (bits - 1)
    hi = 2 ** bits - 1
    if qi.numel() and (int(qi.min()) < 0 or int(qi.max()) > hi):
        raise ValueError(f"codes do not fit {bits} bits ({'signed' if q.dtype == torch.int8 else 'unsigned'} "
                         f"grid): range [{int(q.min())}, {int(q.max())}]")
    if zi.numel() and (int(zi.min()) < 0 or int(zi.max()) > hi):
        raise ValueError(f"zero points do not fit {bits} bits: range [{int(zeros.min())}, {int(zeros.max())}]")
    return qi, zi


def _from_unsigned(qi, zi, bits, signed):
    if not signed:
        return qi.to(torch.uint8), zi.to(torch.int32)
    off = 2 ** (bits - 1)
    if zi.numel() and bool((zi != off).any()):
        raise ValueError(f"signed=True needs every zero point to be {off} (a symmetric grid); they are not")
    return (qi - off).to(torch.int8), torch.zeros_like(zi, dtype=torch.int32)


def _fp16_scales(scales: torch.Tensor) -> torch.Tensor:
    s = scales.t().contiguous().to(torch.float16)
    if not torch.isfinite(s).all():
        raise ValueError("scales overflow float16 (the formats store fp16 scales)")
    return s


def _check_groups(in_features: int, num_groups: int, group_size: int | None, what: str = "in_features") -> int:
    """The group size, after refusing ragged groups (see the module docstring for why)."""
    if group_size is None:
        if in_features % num_groups:
            raise ValueError(f"{what}={in_features} is not a multiple of the number of groups {num_groups}: "
                             f"a ragged last group, which these formats cannot store (they assume "
                             f"groups = {what} / group_size)")
        group_size = in_features // num_groups
    if in_features % group_size:
        raise ValueError(f"{what}={in_features} is not a multiple of group_size={group_size}: the last group "
                         f"would be ragged ({in_features % group_size} columns), which GPTQ/AWQ checkpoints "
                         f"cannot store (readers assume groups = {what} // group_size); choose a group size "
                         f"that divides {in_features}")
    if in_features // group_size != num_groups:
        raise ValueError(f"{num_groups} groups do not match {what}={in_features} with group_size={group_size}")
    return group_size


# --------------------------------------------------------------------------- GPTQ

def pack_gptq(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None,
              bits: int, group_size: int | None = None, zero_offset: int = 1) -> dict[str, torch.Tensor]:
    """Lab codes [out, in], scales/zeros [out, groups], g_idx [in] -> GPTQ tensors
    {"qweight", "qzeros", "scales", "g_idx"} (layouts in the module docstring).

    `group_size` None: inferred as in / groups. `g_idx` None: contiguous groups j // group_size.
    `zero_offset` 1 writes the classic "gptq" format (zero - 1), 0 GPTQModel's "gptq_v2".
    """
    _check_common(q, scales, zeros, bits, GPTQ_BITS, "GPTQ")
    out_f, in_f = q.shape
    num_groups = scales.shape[1]
    group_size = _check_groups(in_f, num_groups, group_size)
    pf = 32 // bits
    if in_f % pf or out_f % pf:
        raise ValueError(f"GPTQ at {bits} bits packs {pf} values per int32: in_features={in_f} and "
                         f"out_features={out_f} must both be multiples of {pf}")
    if g_idx is None:
        g_idx = torch.arange(in_f, device=q.device) // group_size
    g_idx = g_idx.to(torch.int64)
    if g_idx.shape != (in_f,) or (in_f and (int(g_idx.min()) < 0 or int(g_idx.max()) >= num_groups)):
        raise ValueError(f"g_idx must map each of the {in_f} input columns to one of {num_groups} groups")
    if bool((torch.bincount(g_idx.cpu(), minlength=num_groups) != group_size).any()):
        raise ValueError(f"g_idx must give every group exactly group_size={group_size} columns "
                         f"(contiguous or act-order permuted groups)")
    qi, zi = _to_unsigned(q, zeros, bits)
    zi = zi - zero_offset
    if zi.numel() and int(zi.min()) < 0:
        raise ValueError(f"a zero point of 0 cannot be stored in the GPTQ format with its offset of "
                         f"{zero_offset} (zero - 1 = -1 does not fit {bits} unsigned bits); use "
                         f"zero_offset=0 (checkpoint_format 'gptq_v2') or the AWQ format")
    qweight = _pack_last(qi.t().contiguous().reshape(in_f // pf, pf, out_f).transpose(1, 2), bits).squeeze(-1)
    return {"qweight": qweight.contiguous(), "qzeros": _pack_last(zi.t().contiguous(), bits),
            "scales": _fp16_scales(scales), "g_idx": g_idx.to(torch.int32)}


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                bits: int, signed: bool = False, zero_offset: int = 1):
    """GPTQ tensors -> (codes [out, in], scales [out, groups] float32, zeros [out, groups] int32,
    g_idx [in] int64). Codes are uint8 on the unsigned grid, or with `signed` int8 codes and zero
    zeros (a symmetric checkpoint back on the lab's signed grid). `g_idx` None: contiguous groups."""
    if isinstance(bits, bool) or bits not in GPTQ_BITS:
        raise ValueError(f"GPTQ unpacking supports bits {GPTQ_BITS}; got bits={bits!r}")
    pf = 32 // bits
    if qweight.dim() != 2 or qzeros.dim() != 2 or scales.dim() != 2:
        raise ValueError("qweight, qzeros and scales must be 2-D")
    in_f, out_f = qweight.shape[0] * pf, qweight.shape[1]
    num_groups = scales.shape[0]
    if scales.shape[1] != out_f or qzeros.shape != (num_groups, out_f // pf):
        raise ValueError(f"GPTQ shapes do not match: qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)} at {bits} bits")
    # [in/pf, out] -> [in/pf, out, pf] -> [in, out]
    qi = _unpack_last(qweight.unsqueeze(-1), bits).reshape(in_f // pf, out_f, pf).transpose(1, 2).reshape(in_f, out_f)
    zi = _unpack_last(qzeros, bits) + zero_offset
    if g_idx is None:
        g_idx = torch.arange(in_f, device=qweight.device) // _check_groups(in_f, num_groups, None)
    q, z = _from_unsigned(qi.t().contiguous(), zi.t().contiguous(), bits, signed)
    return q, scales.t().float().contiguous(), z, g_idx.to(torch.int64)


# --------------------------------------------------------------------------- AWQ (GEMM)

def pack_awq(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None = None,
             bits: int = 4, group_size: int | None = None) -> dict[str, torch.Tensor]:
    """Lab codes [out, in], scales/zeros [out, groups] -> AWQ GEMM {"qweight", "qzeros", "scales"}.

    AWQ has no g_idx: a `g_idx` other than the contiguous j // group_size (act-order) is refused.
    """
    _check_common(q, scales, zeros, bits, AWQ_BITS, "AWQ")
    out_f, in_f = q.shape
    group_size = _check_groups(in_f, scales.shape[1], group_size)
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64).cpu(), torch.arange(in_f) // group_size):
        raise ValueError("AWQ checkpoints have no g_idx: act-order (permuted) groups cannot be stored; "
                         "use the GPTQ format")
    pf = 32 // bits
    if out_f % pf:
        raise ValueError(f"AWQ packs {pf} output channels per int32: out_features={out_f} must be a multiple of {pf}")
    qi, zi = _to_unsigned(q, zeros, bits)
    return {"qweight": _pack_last(qi.t().contiguous(), bits, AWQ_ORDER),
            "qzeros": _pack_last(zi.t().contiguous(), bits, AWQ_ORDER), "scales": _fp16_scales(scales)}


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, bits: int = 4,
               signed: bool = False):
    """AWQ GEMM tensors -> (codes [out, in], scales [out, groups] float32, zeros [out, groups] int32,
    g_idx [in] int64, contiguous)."""
    if isinstance(bits, bool) or bits not in AWQ_BITS:
        raise ValueError(f"AWQ unpacking supports bits {AWQ_BITS}; got bits={bits!r}")
    pf = 32 // bits
    in_f, out_f = qweight.shape[0], qweight.shape[1] * pf
    num_groups = scales.shape[0]
    if scales.shape[1] != out_f or qzeros.shape != (num_groups, qweight.shape[1]):
        raise ValueError(f"AWQ shapes do not match: qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}")
    group_size = _check_groups(in_f, num_groups, None)
    qi = _unpack_last(qweight, bits, AWQ_ORDER)
    zi = _unpack_last(qzeros, bits, AWQ_ORDER)
    q, z = _from_unsigned(qi.t().contiguous(), zi.t().contiguous(), bits, signed)
    return q, scales.t().float().contiguous(), z, torch.arange(in_f, device=qweight.device) // group_size
