"""Packed low-bit linears for the CPU: int4 and int8 weight-only, one kernel call per linear.

Until now every quantized model ran dequantized to float32, so a 4-bit model read as many weight bytes
per token as the float one. Here the codes stay packed and torch's CPU kernels dequantize them inside
the matrix product. A `PackedLinear` replaces an `nn.Linear`; its input is rounded to bfloat16 (the
only activation dtype with a vectorized kernel), its output comes back in the input's dtype, so a
float32 model keeps float32 norms, attention and residual stream around packed linears.

Kernels (torch 2.13 CPU; timings on this 2-core AMD EPYC (Zen 4, AVX-512 with AVX512-BF16, no AMX),
one thread, median of interleaved repeats; `python -m lab.bench.lowbit` measures them again):

- int4: `aten._convert_weight_to_int4pack_for_cpu(codes int32 [N, K] in 0..15, innerKTiles)` -> uint8
  [N, K/2] (innerKTiles is ignored on the CPU; 64 output channels are interleaved per AVX-512 block),
  and `aten._weight_int4pack_mm_for_cpu(x [M, K], packed, group, scales_and_zeros [K/group, N, 2])`.
  It reads each weight as (q - 8) * scale + zero in float32 (an FMA; scale and zero are stored in x's
  dtype), accumulates in float32 and rounds the output to x's dtype. group must be 32, 64, 128 or 256
  and divide K; N must be a multiple of 16 (we pad). Only bfloat16 x has the AVX-512 kernel: float32
  and float16 take a scalar loop (LM head at M=1: 70 ms vs 1.6 ms). This is the tinygemm-style int4
  path of gpt-fast on CPU; torchao's CPU int4 weight-only format (Int4OpaqueTensor, 0.18) calls the
  same op behind a tensor subclass and measured the same plus ~0.03 ms of dispatch, so torchao is
  not used. LM head 49152x576 at M=1: float32 5.8-18.7 ms (it varies most with other work's memory
  traffic), bfloat16 9-12 ms, int4 1.5-1.9 ms.
- int8, per output channel (one group per row): `aten._weight_int8pack_mm(x bf16 [M, K], codes int8
  [N, K], scales bf16 [N])`, the fastest int8 candidate at M=1 on every decoder shape (960x576: 0.036
  ms vs float32 0.062, two int4 planes 0.088, dequantize-to-bf16-then-matmul 0.19). With float32 x it
  is slow (LM head 12-35 ms, the 26 ms seen before); with bf16 x fast (LM head 3.9 ms). It misreads K
  not a multiple of 16 (wrong results at K=72, a crash at K=70, torch 2.13), so such K are refused.
  An asymmetric grid w = s (q - z) runs as s (q - 128) plus the rank-1 term sum(x) * s (128 - z).
- int8, grouped: that kernel has one scale per row, so grouped 8-bit codes are split into two 4-bit
  planes q = 16 hi + lo and packed as ONE int4 matrix of 2N rows (scales 16 s and s; the zero
  s (136 - z) split into a bf16 part and its bf16 remainder): one int4 call, then y[:, :N] + y[:, N:].
  About 2x the int4 time (LM head 3.0 ms at M=1). Rejected: dequantizing int8 to bf16 per call and
  a bf16 matmul (the conversion costs more than the float32 matmul at M=1: 960x576 0.19 ms vs
  0.06), and torch.compile of the same (default and max-autotune: eager speed, 30 s to compile).
- At M=32 bfloat16 matmuls beat every packed kernel (960x576: bf16 0.32-0.43 ms, int4 0.45-0.52,
  int8 0.51-0.60, float32 0.52-0.65): the kernels dequantize the weights again for every 4 rows.
  Packing pays for decoding: a batch-1 decode step of SmolLM2-135M (64-token context, one thread,
  beside other work) took float32 50-57 ms, int4 27-44 ms (1.3-1.9x), int4 with the LM head packed
  too 20-25 ms (2.3-2.5x), int8 36-45 ms (1.3-1.4x), int8 with its head 32-40 ms (1.4-1.6x); a
  whole bfloat16 model was no faster than float32 (49-75 ms).

The lab's grid w = s (q - z) (`lab.quant.rtn`) maps onto the int4 kernel's as scale = s and zero =
s (8 - z) with unsigned codes (a signed grid's codes get +8 and its zero becomes exactly 0). Both are
rounded to bfloat16 (relative error <= 2^-9), so a kernel weight differs from s (q - z) by at most
2^-9 s (|q - 8| + |8 - z|), i.e. <= s/32 at 4 bits: well inside a quantization step. Groups reach the
kernel as it wants them: a group size it has no kernel for but that a kernel size divides (the
per-channel group of 576 columns, or 128 with a ragged last group of 64) runs at that smaller size
with repeated scales (exact); act-order (a permuted g_idx) runs with the input columns permuted so
groups are contiguous (as exllama does). Anything else is refused with a ValueError that names it.

`pack_model` swaps the linears of a quantized lab model for packed ones (embedding and norms stay);
`load_packed` reads a GPTQ / AWQ checkpoint (`lab.quant.formats`) straight into a packed model.
The LM head: SmolLM2's is tied to the embedding and the lab's checkpoints leave it in float (as GPTQ
and AWQ do), so it is packed only when the quantization included it (a result named "lm_head") or when
asked (`lm_head=QuantSpec(...)`: RTN-quantized at pack time). Packing it unties it: the embedding keeps
its float table for the lookup. It is the largest matrix (28M of the 135M weights; float32 ~40% of a
decode step), so a 4-bit drafter or speed-bound model should ask for it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from .rtn import QuantSpec, quantize

INT4_GROUP_SIZES = (256, 128, 64, 32)  # what _weight_int4pack_mm_for_cpu serves, largest first
PACKED_BITS = (4, 8)
INT8_K_MULTIPLE = 16  # _weight_int8pack_mm misreads other K (see the module docstring)
_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu wants N % 16 == 0
KERNELS = ("int4", "int8", "int8x2")  # int8x2: grouped int8 as two int4 planes in one int4 call


class PackedLinear(nn.Module):
    """y = x W^T + b with W held packed; built by `pack_linear`. `kernel` is one of KERNELS."""

    def __init__(self, in_features: int, out_features: int, kernel: str, bits: int, group_size: int | None,
                 packed: torch.Tensor, scales: torch.Tensor, correction: torch.Tensor | None = None,
                 perm: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel={kernel!r}; choose one of {KERNELS}")
        self.in_features, self.out_features = in_features, out_features
        self.kernel, self.bits, self.group_size = kernel, bits, group_size  # group_size: the kernel's
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)  # bf16: [K/group, rows, 2] for int4 kernels, [N] for int8
        self.register_buffer("correction", correction)  # int8 asymmetric grid: s (128 - z) [N], float32
        self.register_buffer("perm", perm)  # act-order: input columns in kernel order
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def _apply(self, fn, recurse=True):
        # model.to(dtype) / .float() cast floating buffers; the kernels read their scales in bf16 only
        # (the values are bf16 numbers, so the round trip is exact).
        super()._apply(fn, recurse)
        self.scales = self.scales.to(torch.bfloat16)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:  # the lab's model passes [tokens, features]; anything else goes flat and back
            return self.forward(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], self.out_features)
        if x.shape[1] != self.in_features:
            raise ValueError(f"input has {x.shape[1]} features; this linear takes {self.in_features}")
        n = self.out_features
        xb = (x if self.perm is None else x.index_select(1, self.perm)).to(torch.bfloat16).contiguous()
        if self.kernel == "int8":
            y = torch.ops.aten._weight_int8pack_mm(xb, self.packed, self.scales).to(x.dtype)
            if self.correction is not None:
                y = y + xb.to(self.correction.dtype).sum(-1, keepdim=True) * self.correction
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, self.group_size, self.scales)
            if self.kernel == "int8x2":  # hi plane rows, then lo plane rows (each padded alike)
                rows = y.shape[1] // 2
                y = y[:, :n].to(x.dtype) + y[:, rows:rows + n].to(x.dtype)
            else:  # rows past n are padding (the kernel packs 16 rows at a time)
                y = (y if y.shape[1] == n else y[:, :n]).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}, "
                f"bits={self.bits}, group_size={self.group_size}, act_order={self.perm is not None}, "
                f"bias={self.bias is not None}")


# --------------------------------------------------------------------------- lab codes -> kernel layout

def _unsigned(q: torch.Tensor, zeros: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and zero points on the unsigned grid 0 .. 2^bits - 1 (a signed grid shifts by 2^(bits-1))."""
    if q.dtype not in (torch.uint8, torch.int8, torch.int32, torch.int64):
        raise ValueError(f"codes must be an integer tensor (uint8 or int8 as lab.quant.rtn makes them); got {q.dtype}")
    qi, zi = q.to(torch.int64), zeros.to(torch.int64)
    if q.dtype == torch.int8:
        qi, zi = qi + 2 ** (bits - 1), zi + 2 ** (bits - 1)
    hi = 2 ** bits - 1
    if qi.numel() and (int(qi.min()) < 0 or int(qi.max()) > hi):
        raise ValueError(f"codes do not fit {bits} bits: range [{int(q.min())}, {int(q.max())}] ({q.dtype})")
    if zi.numel() and (int(zi.min()) < 0 or int(zi.max()) > hi):
        raise ValueError(f"zero points do not fit {bits} bits: range [{int(zeros.min())}, {int(zeros.max())}]")
    return qi, zi


def _kernel_groups(g_idx: torch.Tensor, in_features: int) -> tuple[torch.Tensor | None, int, torch.Tensor]:
    """(perm or None, kernel group size, lab group of each kernel group) for columns grouped by g_idx.

    Columns are taken in group order (perm sorts them when g_idx is not already sorted); the kernel group
    is the largest supported size dividing every group's width, so each kernel group lies in one lab group.
    """
    if g_idx.shape != (in_features,):
        raise ValueError(f"g_idx has shape {tuple(g_idx.shape)}; expected ({in_features},), one group per input column")
    g = g_idx.to(torch.int64).cpu()
    perm = None
    if bool((g[1:] < g[:-1]).any()):
        perm = torch.argsort(g, stable=True)
        g = g[perm]
    widths = torch.unique_consecutive(g, return_counts=True)[1]
    for size in INT4_GROUP_SIZES:
        if bool((widths % size == 0).all()):
            return perm, size, g[::size]
    nominal = int(widths.max())
    raise ValueError(f"group size {nominal} (group widths {sorted(set(widths.tolist()))} over in_features="
                     f"{in_features}) cannot be served: torch's int4 CPU kernel takes groups of "
                     f"{sorted(INT4_GROUP_SIZES)} columns, so every group must be a multiple of one of them")


def _pad_rows(t: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -t.shape[0] % multiple
    return t if not extra else torch.cat([t, t.new_zeros(extra, *t.shape[1:])])


def _int4_pack(codes: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit codes [rows, K] (rows a multiple of 16) -> the kernel's uint8 layout."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 2)


def _scales_zeros(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Per kernel group [rows, G] scale and zero -> the kernel's bf16 [G, rows, 2]."""
    return torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()


def pack_linear(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, bits: int,
                bias: torch.Tensor | None = None) -> PackedLinear:
    """A PackedLinear computing x (s (q - z))^T + bias, from lab codes q [out, in] (uint8 unsigned grid
    or int8 signed grid), scales/zeros [out, groups] and g_idx [in] (each column's group)."""
    if isinstance(bits, bool) or bits not in PACKED_BITS:
        raise ValueError(f"bits={bits!r}: there are packed CPU kernels for {PACKED_BITS} bits only")
    if q.dim() != 2 or scales.shape != zeros.shape or scales.dim() != 2 or scales.shape[0] != q.shape[0]:
        raise ValueError(f"shapes do not match: codes {tuple(q.shape)} [out, in], scales {tuple(scales.shape)} "
                         f"and zeros {tuple(zeros.shape)} [out, groups]")
    n, k = q.shape
    qi, zi = _unsigned(q, zeros, bits)
    s = scales.float().cpu()
    g = g_idx.to(torch.int64).cpu()
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= s.shape[1]):
        raise ValueError(f"g_idx must map each of the {k} columns to one of {s.shape[1]} groups")
    if bits == 8 and bool((g == g[0]).all()):
        return _pack_int8_per_channel(qi, s[:, int(g[0])], zi[:, int(g[0])], bias)
    perm, size, kg = _kernel_groups(g, k)
    if perm is not None:
        qi = qi[:, perm]
    s, z = s[:, kg], zi[:, kg].float()
    if bits == 4:
        codes, sz = qi, _scales_zeros(_pad_rows(s, _N_MULTIPLE), _pad_rows(s * (8 - z), _N_MULTIPLE))
        kernel = "int4"
    else:  # q = 16 hi + lo: w = 16 s (hi - 8) + s (lo - 8) + s (136 - z)
        c = s * (136 - z)
        c_hi = c.to(torch.bfloat16).float()  # the bf16 remainder goes to the lo plane's zero
        codes = torch.cat([_pad_rows(qi >> 4, _N_MULTIPLE), _pad_rows(qi & 15, _N_MULTIPLE)])
        sz = torch.cat([_scales_zeros(_pad_rows(16 * s, _N_MULTIPLE), _pad_rows(c_hi, _N_MULTIPLE)),
                        _scales_zeros(_pad_rows(s, _N_MULTIPLE), _pad_rows(c - c_hi, _N_MULTIPLE))], dim=1)
        kernel = "int8x2"
    packed = _int4_pack(_pad_rows(codes, _N_MULTIPLE))
    return PackedLinear(k, n, kernel, bits, size, packed, sz, perm=perm, bias=bias)


def _pack_int8_per_channel(qi, s, zi, bias) -> PackedLinear:
    n, k = qi.shape
    if k % INT8_K_MULTIPLE:
        raise ValueError(f"in_features={k} is not a multiple of {INT8_K_MULTIPLE}: torch's _weight_int8pack_mm "
                         f"misreads such widths (wrong results at 72, a crash at 70)")
    corr = s * (128 - zi.float())
    return PackedLinear(k, n, "int8", 8, None, (qi - 128).to(torch.int8).contiguous(), s.to(torch.bfloat16),
                        correction=None if not bool(corr.any()) else corr, bias=bias)


# --------------------------------------------------------------------------- whole models

def _codes(result, spec: QuantSpec, in_features: int):
    """(q, scales, zeros, g_idx) from a tuple (g_idx missing or None: contiguous groups of the spec)
    or from a GPTQResult (codes re-derived from its fake-quantized weight: round(w / s) + z is exact)."""
    if isinstance(result, (tuple, list)):
        q, scales, zeros, *rest = result
        g_idx = rest[0] if rest and rest[0] is not None else spec.group_index(in_features)
        return q, scales, zeros, g_idx
    w, scales, zeros, g_idx = result.weight, result.scales, result.zeros, result.g_idx
    codes = (torch.round(w.float() / scales[:, g_idx].float()) + zeros[:, g_idx].float()).clamp(spec.qmin, spec.qmax)
    return codes.to(torch.int8 if spec.symmetric else torch.uint8), scales, zeros, g_idx


def _install(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def _linear(model: nn.Module, name: str) -> nn.Linear:
    try:
        lin = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"{name!r} is not a module of the model") from None
    if not isinstance(lin, nn.Linear):
        raise ValueError(f"{name!r} is a {type(lin).__name__}, not an nn.Linear (already packed?)")
    return lin


def pack_head(model: nn.Module, spec: QuantSpec) -> nn.Module:
    """RTN-quantize the LM head's weight with `spec` and pack it; the embedding keeps its float table."""
    head = _linear(model, "lm_head")
    q, s, z = quantize(head.weight.detach().float().cpu(), spec)
    model.lm_head = pack_linear(q, s, z, spec.group_index(head.in_features), spec.bits, head.bias)
    return model


@torch.no_grad()
def pack_model(model: nn.Module, results: dict, spec: QuantSpec, lm_head: QuantSpec | None = None) -> nn.Module:
    """Swap the linears named in `results` for PackedLinears, in place; returns the model.

    results: lab module name ("layers.0.self_attn.qkv_proj", optionally "model."-prefixed; "lm_head"
    allowed) -> (q, scales, zeros[, g_idx]) as `rtn.quantize` makes them, or a `GPTQResult`, as
    `lab.quant.pipeline.quantize_model` returns for RTN, GPTQ and AWQ. `lm_head`: also RTN-quantize
    and pack the LM head with this spec (see the module docstring). Biases are kept in float.
    """
    results = {k.removeprefix("model."): v for k, v in results.items()}
    if lm_head is not None and "lm_head" in results:
        raise ValueError("lm_head is in results already; pass lm_head=None or leave it out of results")
    for name, result in results.items():
        lin = _linear(model, name)
        q, scales, zeros, g_idx = _codes(result, spec, lin.in_features)
        if tuple(q.shape) != (lin.out_features, lin.in_features):
            raise ValueError(f"{name}: codes {tuple(q.shape)} do not match the weight "
                             f"{(lin.out_features, lin.in_features)}")
        _install(model, name, pack_linear(q, scales, zeros, g_idx, spec.bits, lin.bias))
    if lm_head is not None:
        pack_head(model, lm_head)
    return model


# --------------------------------------------------------------------------- checkpoints

def _lab_target(hf_prefix: str) -> tuple[str, int]:
    """Hugging Face module name -> (the lab's linear holding it, position of its rows in it)."""
    from lab.models.llama import FUSED_INTO  # the one statement of how the lab fuses q/k/v and gate/up

    *parent, proj = hf_prefix.removeprefix("model.").split(".")
    if proj in FUSED_INTO:
        target, slot = FUSED_INTO[proj]
        return ".".join([*parent, target]), slot
    return ".".join([*parent, proj]), 0


def checkpoint_codes(path) -> tuple[dict[str, tuple], int]:
    """The codes of every packed linear of a GPTQ or AWQ (GEMM) checkpoint directory, by lab module
    name, q/k/v and gate/up fused as the lab's model fuses them: ({name: (q, scales, zeros, g_idx)}, bits).
    Read as `lab.quant.formats.load_quantized` reads them (same offsets, g_idx and fp16 scales)."""
    from safetensors.torch import load_file

    from .formats import gptq_zero_offset, read_quantization_config
    from .packing import unpack_awq, unpack_gptq
    path = Path(path)
    qc = read_quantization_config(path)  # GPTQ or AWQ in a layout the lab reads, else a ValueError
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(f, device="cpu"))
    parts: dict[str, dict[int, tuple]] = {}
    for key in (k for k in tensors if k.endswith(".qweight")):
        prefix = key.removesuffix(".qweight")
        packed = [tensors.get(f"{prefix}.{n}") for n in ("qweight", "qzeros", "scales")]
        if any(p is None for p in packed):
            raise ValueError(f"{prefix}: a packed linear needs qweight, qzeros and scales")
        if qc["quant_method"] == "gptq":
            bits, offset = qc["bits"], gptq_zero_offset(qc)
            g_idx = tensors.get(f"{prefix}.g_idx") if qc.get("desc_act") else None
            codes = unpack_gptq(*packed, g_idx, bits, zero_offset=offset)
        else:
            if not qc.get("zero_point", True):
                raise ValueError("AWQ checkpoints without zero points (zero_point: false) are not supported")
            bits = qc.get("w_bit", qc.get("bits", 4))
            codes = unpack_awq(*packed, bits)
        target, slot = _lab_target(prefix)
        parts.setdefault(target, {})[slot] = codes
    fused = {}
    for target, by_slot in parts.items():
        pieces = [by_slot[i] for i in sorted(by_slot)]
        g_idx = pieces[0][3]
        if any(not torch.equal(p[3], g_idx) for p in pieces[1:]):
            raise ValueError(f"{target}: its projections have different g_idx (act-order per projection); "
                             f"they cannot be fused into one packed matrix")
        fused[target] = tuple(torch.cat([p[i] for p in pieces]) for i in range(3)) + (g_idx,)
    return fused, bits


@torch.no_grad()
def load_packed(path, max_positions: int | None = None, lm_head: QuantSpec | None = None):
    """A GPTQ or AWQ checkpoint directory -> (model with packed linears, tokenizer or None), float32 on
    the CPU. Everything not packed comes from `load_quantized` (so the two loads cannot drift apart);
    its dequantized float weights are then replaced by the packed codes. `lm_head`: see `pack_model`."""
    from .formats import load_quantized

    model, tok = load_quantized(path, dtype=torch.float32, device="cpu", max_positions=max_positions)
    codes, bits = checkpoint_codes(path)
    for name, (q, scales, zeros, g_idx) in codes.items():
        lin = _linear(model, name)
        if tuple(q.shape) != (lin.out_features, lin.in_features):
            raise ValueError(f"{name}: checkpoint codes {tuple(q.shape)} do not match the model's weight "
                             f"{(lin.out_features, lin.in_features)}")
        _install(model, name, pack_linear(q, scales, zeros, g_idx, bits, lin.bias))
    if lm_head is not None:
        if "lm_head" in codes:
            raise ValueError("the checkpoint's lm_head is packed already; pass lm_head=None")
        pack_head(model, lm_head)
    return model, tok


def rtn_packed(model: nn.Module, spec: QuantSpec, head: bool = True) -> nn.Module:
    """A copy of `model` whose decoder linears (and with `head`, its LM head) are RTN-quantized with `spec` and
    packed: the quickest way to a low-bit model that runs on the packed kernels (benchmarks, drafters)."""
    from lab.quant.pipeline import decoder_linears

    packed = copy.deepcopy(model)
    results = {name: quantize(lin.weight.detach().float(), spec) for name, lin in decoder_linears(packed).items()}
    pack_model(packed, results, spec, lm_head=spec if head else None)
    return packed
