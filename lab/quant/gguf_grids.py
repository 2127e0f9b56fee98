"""llama.cpp's block grids (GGUF Q4_0, Q4_1, Q8_0) as quantizers, and a detector of weights already on a grid.

GGUF stores a weight in blocks of 32 consecutive input columns, each with its own float16 scale d (and for Q4_1
a float16 minimum m), following llama.cpp's reference quantizers (`quantize_row_q4_0_ref`,
`quantize_row_q4_1_ref`, `quantize_row_q8_0_ref` in ggml's `ggml-quants.c`):

- Q4_1: min and max of the block; d = (max - min) / 15; q = min(15, trunc((x - min) / d + 0.5)); w = d q + m with
  m = min. A *float* offset: the grid starts exactly at the block's minimum, with no zero point to round and no
  widening of the range to include 0 (the lab's RTN, `lab.quant.rtn`, has both).
- Q4_0: the value of largest magnitude, max (with its sign); d = max / -8; q = min(15, trunc(x / d + 8.5));
  w = d (q - 8). Symmetric around 0, with the extreme value landing exactly on code 0.
- Q8_0: d = absmax / 127; q = round(x / d); w = d q.

The codes are computed with the float32 scale and the scale is then stored in float16, as llama.cpp does, so a
weight read back is d16 * q (+ m16). Why it matters here: the embedded SmolLM2 ships as a Q4_1 GGUF, so its
"unquantized" decoder linears sit exactly on this grid, and `quantize_gguf(w, "q4_1")` gives them back bit for
bit (`tests/test_gguf_grids.py`): re-quantizing that model to 4 bits on its own grid costs exactly nothing, and
any other 4-bit grid measures a grid mismatch, not the cost of 4 bits. `distinct_per_block` and
`already_quantized` tell such a model from a 16-bit one: a 4-bit block holds at most 16 distinct values, a
16-bit trained weight holds 32 in a block of 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

BLOCK = 32  # input columns per GGUF block (QK4_0 = QK4_1 = QK8_0 = 32)


@dataclass(frozen=True)
class GGUFGrid:
    name: str
    bits: int
    offset: bool  # a float16 minimum per block (Q4_1) beside the scale


GRIDS = {"q4_0": GGUFGrid("q4_0", 4, False), "q4_1": GGUFGrid("q4_1", 4, True), "q8_0": GGUFGrid("q8_0", 8, False)}


def _blocks(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"a GGUF grid needs a 2-D weight whose input columns are a multiple of {BLOCK}; "
                         f"got shape {tuple(w.shape)}")
    return w.detach().float().reshape(w.shape[0], w.shape[1] // BLOCK, BLOCK)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d != 0, 1.0 / d, torch.zeros_like(d))  # llama.cpp: id = d ? 1/d : 0


def quantize_gguf(w: torch.Tensor, grid: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes [out, in] int16, d [out, in/32] float16, m [out, in/32] float16 or None) of `w` on `grid`."""
    if grid not in GRIDS:
        raise ValueError(f"grid {grid!r} is not one of {tuple(GRIDS)}")
    x = _blocks(w)
    m16 = None
    if grid == "q4_1":
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        d = (hi - lo) / 15
        q = torch.clamp(torch.trunc((x - lo) * _inverse(d) + 0.5), max=15)
        m16 = lo.half()
    elif grid == "q4_0":
        signed_max = torch.gather(x, -1, x.abs().argmax(-1, keepdim=True))  # the first of largest magnitude
        d = signed_max / -8
        q = torch.clamp(torch.trunc(x * _inverse(d) + 8.5), max=15)
    else:
        d = x.abs().amax(-1, keepdim=True) / 127
        y = x * _inverse(d)
        q = torch.sign(y) * torch.floor(y.abs() + 0.5)  # C's roundf: halves away from zero (torch.round: to even)
    shape = (w.shape[0], w.shape[1] // BLOCK)
    return (q.reshape(w.shape).to(torch.int16), d.half().reshape(shape),
            None if m16 is None else m16.reshape(shape))


def dequantize_gguf(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, grid: str) -> torch.Tensor:
    """The float32 weight GGUF reads back: d q + m (Q4_1), d (q - 8) (Q4_0), d q (Q8_0), d and m from float16."""
    q = codes.float().reshape(codes.shape[0], -1, BLOCK)
    if grid == "q4_0":
        q = q - 8
    w = d.float().unsqueeze(-1) * q
    if m is not None:
        w = w + m.float().unsqueeze(-1)
    return w.reshape(codes.shape)


def fake_quantize_gguf(w: torch.Tensor, grid: str) -> torch.Tensor:
    """`w` quantized to `grid` and read back, in float32."""
    return dequantize_gguf(*quantize_gguf(w, grid), grid)


def distinct_per_block(w: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Distinct values in each block of `block` consecutive input columns, [out, in // block] (a ragged last
    block is left out)."""
    w = w.detach().float()
    cols = w.shape[1] // block * block
    x = torch.sort(w[:, :cols].reshape(w.shape[0], -1, block), dim=-1).values
    return 1 + (x[..., 1:] != x[..., :-1]).sum(-1)


@dataclass(frozen=True)
class QuantizedBaseline:
    """Whether a model's decoder linears already sit on a low-bit block grid, and the evidence."""
    detected: bool
    bits: int | None  # the fewest bits whose 2^bits levels cover every block of every linear
    linears: int
    max_distinct: int  # the most distinct values in any block of 32
    mean_distinct: float

    def __str__(self) -> str:
        verdict = (f"already quantized: at most {self.max_distinct} distinct values in every block of {BLOCK} "
                   f"columns of all {self.linears} decoder linears ({self.mean_distinct:.1f} on average), i.e. on a "
                   f"{self.bits}-bit grid" if self.detected else
                   f"not detected as quantized: up to {self.max_distinct} distinct values in a block of {BLOCK} "
                   f"({self.mean_distinct:.1f} on average) over {self.linears} decoder linears")
        return verdict


def already_quantized(model: nn.Module, max_bits: int = 4) -> QuantizedBaseline:
    """Are the decoder layers' linears (`model.layers`) already on a grid of at most 2^max_bits levels per block of
    32 input columns? A trained 16-bit weight has 32 distinct values in nearly every block; a dequantized 4-bit
    GGUF has at most 16. The embedding and LM head are left out (GGUF often keeps them at 6-8 bits)."""
    counts = [distinct_per_block(m.weight) for layer in model.layers for m in layer.modules()
              if isinstance(m, nn.Linear) and m.weight.shape[1] >= BLOCK]
    if not counts:
        raise ValueError("the model has no decoder linear with at least 32 input columns to inspect")
    flat = torch.cat([c.reshape(-1) for c in counts]).float()
    most = int(flat.max())
    bits = max(1, (most - 1).bit_length())
    return QuantizedBaseline(bits <= max_bits, bits if bits <= max_bits else None, len(counts), most,
                             float(flat.mean()))
