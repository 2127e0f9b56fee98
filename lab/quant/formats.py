"""Checkpoint I/O for weight-only quantized models: GPTQ and AWQ (GEMM) Hugging Face-style directories.

The linears are bit-packed as GPTQModel / AutoGPTQ / AutoAWQ / vLLM read them (`lab.quant.packing`, whose
docstring gives the layouts and why ragged last groups are refused).

`save_quantized` writes a Hugging Face-style directory (config.json with `quantization_config`,
model.safetensors with Hugging Face tensor names, the fused qkv/gate_up split back into
q/k/v/gate/up projections). `load_quantized` reads one back into the lab's FLOAT model: every
packed linear is unpacked and DEQUANTIZED (weight-only fake quantization), so inference runs on
dequantized float weights, not on integer kernels. Scales are stored as fp16 (the format's dtype),
so the loaded weights equal `dequantize(q, scales.half().float(), zeros, g_idx)`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .packing import AWQ_BITS, GPTQ_BITS, pack_awq, pack_gptq, unpack_awq, unpack_gptq
from .rtn import QuantSpec, dequantize

METHODS = ("gptq", "awq")
# The layouts `lab.quant.packing` reads: GPTQ's checkpoint_format (GPTQModel also writes "marlin", "bitblas", ...,
# the same numbers in other layouts) and AWQ's version (AutoAWQ also writes "gemv", "gemv_fast", "marlin", ...).
GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ_VERSIONS = ("gemm",)
# The lab's fused matrices -> the Hugging Face projections they are made of, in row order.
_SPLITS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _as_codes(result, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, scales, zeros, g_idx) from a tuple, or from a GPTQResult (codes re-derived from its
    fake-quantized weight: round(w / s) + z recovers them exactly)."""
    if isinstance(result, (tuple, list)):
        q, scales, zeros, *rest = result
        return q, scales, zeros, (rest[0] if rest else None)
    w, scales, zeros, g_idx = result.weight, result.scales, result.zeros, result.g_idx
    s, z = scales[:, g_idx].float(), zeros[:, g_idx].float()
    codes = torch.round(w.float() / s) + z
    codes = codes.clamp(spec.qmin, spec.qmax)
    return codes.to(torch.int8 if spec.symmetric else torch.uint8), scales, zeros, g_idx


def _hf_name(lab_name: str) -> str:
    return lab_name if lab_name.startswith("lm_head") else f"model.{lab_name}"


def _split_sizes(model, name: str) -> tuple[tuple[str, ...], list[int]] | None:
    """Hugging Face projections and their row counts of a fused lab linear `name`, else None."""
    leaf = name.rsplit(".", 1)[-1]
    c = model.config
    if leaf == "qkv_proj":
        return _SPLITS[leaf], [c.num_attention_heads * c.head_dim] + [c.num_key_value_heads * c.head_dim] * 2
    if leaf == "gate_up_proj":
        return _SPLITS[leaf], [c.intermediate_size] * 2
    return None


def _hf_parts(model, name: str) -> list[tuple[str, slice]]:
    """[(Hugging Face module name, row slice of the lab matrix)] for lab linear `name`."""
    split = _split_sizes(model, name)
    if split is None:
        return [(_hf_name(name), slice(None))]
    parent = name.rsplit(".", 1)[0]
    out, start = [], 0
    for proj, n in zip(*split):
        out.append((_hf_name(f"{parent}.{proj}"), slice(start, start + n)))
        start += n
    return out


def save_quantized(model, results: dict, spec: QuantSpec, method: str, out_dir, tokenizer=None) -> Path:
    """Write `model` with its linears in `results` packed as `method` ("gptq" or "awq") to `out_dir`.

    results: lab module name (e.g. "layers.0.self_attn.qkv_proj", optionally "model."-prefixed) ->
    (q, scales, zeros, g_idx) as from `rtn.quantize` (g_idx may be None) or a `GPTQResult`.
    Fused qkv/gate_up matrices are split back into q/k/v and gate/up projections, each packed on
    its own (groups run along the input dim, so a row split is exact). Every other tensor
    (embeddings, norms, biases, lm_head unless tied, linears not in `results`) is stored unpacked
    in the model's dtype. Linears left out of `results` inside decoder layers make a checkpoint
    that vLLM's GPTQ/AWQ loaders will not read; `load_quantized` reads it. Returns the directory.
    """
    from safetensors.torch import save_file

    _check_method(spec, method)
    results = {k.removeprefix("model."): v for k, v in results.items()}
    tied = model.config.tie_word_embeddings
    if tied and "lm_head" in results:
        raise ValueError("lm_head is tied to the embeddings; it cannot be quantized on its own")
    codes = {name: _as_codes(result, spec) for name, result in results.items()}
    zero_offset = _zero_offset(codes, spec, method)
    tensors, desc_act = _packed_tensors(model, codes, spec, method, zero_offset)
    tensors.update(_unpacked_tensors(model, results, tied))

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_hf_dict()
    config["torch_dtype"] = str(model.embed_tokens.weight.dtype).removeprefix("torch.")
    config["quantization_config"] = _quantization_config(model, results, spec, method, desc_act, zero_offset)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def _check_method(spec: QuantSpec, method: str) -> None:
    """Refuse a method the spec cannot be stored in."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; choose one of {METHODS}")
    if method == "awq":
        if spec.bits not in AWQ_BITS:
            raise ValueError(f"the AWQ GEMM format stores {AWQ_BITS}-bit weights only; spec has bits={spec.bits}")
        if spec.group_size is None:
            raise ValueError("the AWQ GEMM format needs a group size; spec has group_size=None (per channel)")
    elif spec.bits not in GPTQ_BITS:
        raise ValueError(f"GPTQ packing supports bits {GPTQ_BITS}; spec has bits={spec.bits}")


def _zero_offset(codes: dict, spec: QuantSpec, method: str) -> int:
    """What the checkpoint subtracts from each stored zero point: 1 in the classic GPTQ format, else 0."""
    # The classic GPTQ format stores zero - 1, so an asymmetric zero point of 0 does not fit; then the
    # whole checkpoint is written as GPTQModel's "gptq_v2" (zeros stored as they are), which the
    # config's checkpoint_format says, instead of refusing or nudging a zero.
    if method == "gptq" and not spec.symmetric and any(bool((z == 0).any()) for _, _, z, _ in codes.values()):
        return 0
    return 1


def _packed_tensors(model, codes: dict, spec: QuantSpec, method: str,
                    zero_offset: int) -> tuple[dict[str, torch.Tensor], bool]:
    """The packed tensors (and biases) of every quantized linear under its Hugging Face names, and whether
    any linear's groups are permuted (act-order: the config's desc_act)."""
    tensors: dict[str, torch.Tensor] = {}
    desc_act = False
    for name, (q, scales, zeros, g_idx) in codes.items():
        module = model.get_submodule(name)
        if tuple(q.shape) != (module.out_features, module.in_features):
            raise ValueError(f"{name}: codes {tuple(q.shape)} do not match the module's weight "
                             f"{(module.out_features, module.in_features)}")
        if spec.group_size is not None and module.in_features % spec.group_size:
            raise ValueError(f"{name}: in_features={module.in_features} is not a multiple of group_size="
                             f"{spec.group_size}: the last group would be ragged, which {method.upper()} "
                             f"checkpoints cannot store; choose a group size that divides {module.in_features}")
        gs = spec.group_size or module.in_features
        if g_idx is not None and not torch.equal(g_idx.to(torch.int64).cpu(), torch.arange(module.in_features) // gs):
            desc_act = True
        for hf, rows in _hf_parts(model, name):
            args = (q[rows], scales[rows], zeros[rows])
            if method == "gptq":
                packed = pack_gptq(*args, g_idx, spec.bits, gs, zero_offset=zero_offset)
            else:
                packed = pack_awq(*args, g_idx, spec.bits, gs)
            for kind, t in packed.items():
                tensors[f"{hf}.{kind}"] = t.cpu().contiguous()
            if module.bias is not None:
                tensors[f"{hf}.bias"] = module.bias.detach()[rows].cpu().contiguous()
    return tensors, desc_act


def _unpacked_tensors(model, results: dict, tied: bool) -> dict[str, torch.Tensor]:
    """Every other tensor of the model (embeddings, norms, linears not in `results`) under its Hugging Face
    names, fused matrices split; a tied lm_head is left out (the embedding holds it)."""
    tensors: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        *mod, kind = key.split(".")
        mod = ".".join(mod)
        if mod in results or (tied and mod == "lm_head"):
            continue
        for hf, rows in _hf_parts(model, mod):
            tensors[f"{hf}.{kind}"] = value.detach()[rows].cpu().contiguous()
    return tensors


def _quantization_config(model, results: dict, spec: QuantSpec, method: str, desc_act: bool,
                         zero_offset: int) -> dict:
    """config.json's `quantization_config`, in the keys the format's readers look for."""
    if method == "gptq":
        qc = {"quant_method": "gptq", "bits": spec.bits, "group_size": spec.group_size or -1,
              "desc_act": desc_act, "sym": spec.symmetric, "static_groups": False, "true_sequential": True,
              "lm_head": "lm_head" in results,
              "checkpoint_format": "gptq" if zero_offset else "gptq_v2"}
    else:
        # AutoAWQ's names (w_bit, q_group_size) and transformers' (bits, group_size) both given.
        # A symmetric lab grid is stored with explicit zero points 2^(bits-1), hence zero_point True.
        qc = {"quant_method": "awq", "version": "gemm", "w_bit": spec.bits, "q_group_size": spec.group_size,
              "zero_point": True, "bits": spec.bits, "group_size": spec.group_size}
        skipped = sorted(hf for name, mod in model.named_modules()
                         if isinstance(mod, torch.nn.Linear) and name not in results and name != "lm_head"
                         for hf, _ in _hf_parts(model, name))
        if skipped:
            qc["modules_to_not_convert"] = skipped
    qc["lab_method_grid"] = "symmetric" if spec.symmetric else "asymmetric"
    return qc


def _stored_config(path: Path) -> dict | None:
    """The settings as the checkpoint stores them (see `read_quantization_config`), unchecked; None if it has none."""
    config = path / "config.json"
    qc = json.loads(config.read_text()).get("quantization_config") if config.exists() else None
    if not qc and (path / "quantize_config.json").exists():
        qc = {"quant_method": "gptq", **json.loads((path / "quantize_config.json").read_text())}
    return qc or None


def is_quantized(path) -> bool:
    """Whether the directory `path` holds a GPTQ or AWQ checkpoint by the places `read_quantization_config` reads."""
    return _stored_config(Path(path)) is not None


def read_quantization_config(path) -> dict:
    """The checkpoint's quantization settings, checked to be a layout the lab reads (else a ValueError naming it).

    From config.json's `quantization_config` (transformers' place, where GPTQModel and AutoAWQ write them), else from
    quantize_config.json (AutoGPTQ's file: up to 0.4 AutoGPTQ wrote only that one, without `quant_method` or
    `checkpoint_format`; the file itself means GPTQ, and no format the classic one; GPTQModel still writes it)."""
    path = Path(path)
    qc = _stored_config(path)
    if qc is None:
        raise ValueError(f"{path / 'config.json'} has no quantization_config (and there is no quantize_config.json); "
                         f"use lab.models.load_model")
    method = qc.get("quant_method")
    if method not in METHODS:
        raise ValueError(f"unsupported quant_method {method!r} in quantization_config; supported: {METHODS}")
    if method == "gptq" and gptq_format(qc) not in GPTQ_FORMATS:
        raise ValueError(f"GPTQ checkpoint_format {gptq_format(qc)!r} stores its tensors in another layout; the lab "
                         f"reads {GPTQ_FORMATS}")
    version = str(qc.get("version", "gemm")).lower()  # AutoAWQ's own files spell it "GEMM"
    if method == "awq" and version not in AWQ_VERSIONS:
        raise ValueError(f"AWQ version {qc.get('version')!r} stores its tensors in another layout; the lab reads "
                         f"{AWQ_VERSIONS}")
    return qc


def gptq_format(qc: dict) -> str:
    """A GPTQ config's checkpoint format (GPTQModel writes `checkpoint_format` and `format`; AutoGPTQ neither)."""
    return str(qc.get("checkpoint_format", qc.get("format", "gptq"))).lower()


def gptq_zero_offset(qc: dict) -> int:
    """What a GPTQ checkpoint subtracted from its zero points: 0 in GPTQModel's gptq_v2, 1 in the classic format."""
    return 0 if gptq_format(qc) == "gptq_v2" else 1


def _dequantized_state(tensors: dict[str, torch.Tensor], qc: dict) -> dict[str, torch.Tensor]:
    """Hugging Face state dict with every packed linear replaced by its float32 dequantized weight (`qc` as from
    `read_quantization_config`)."""
    method = qc["quant_method"]
    state = {k: v for k, v in tensors.items() if not k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
    for key in (k for k in tensors if k.endswith(".qweight")):
        prefix = key.removesuffix(".qweight")
        parts = [tensors.get(f"{prefix}.{n}") for n in ("qweight", "qzeros", "scales")]
        if any(p is None for p in parts):
            raise ValueError(f"{prefix}: a packed linear needs qweight, qzeros and scales")
        if method == "gptq":
            bits = qc["bits"]
            offset = gptq_zero_offset(qc)
            g_idx = tensors.get(f"{prefix}.g_idx") if qc.get("desc_act") else None
            q, scales, zeros, g_idx = unpack_gptq(*parts, g_idx, bits, zero_offset=offset)
        else:
            if not qc.get("zero_point", True):
                raise ValueError("AWQ checkpoints without zero points (zero_point: false) are not supported")
            q, scales, zeros, g_idx = unpack_awq(*parts, qc.get("w_bit", qc.get("bits", 4)))
        state[f"{prefix}.weight"] = dequantize(q, scales, zeros, g_idx)
    return state


def load_quantized(path, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                   max_positions: int | None = None):
    """Read a GPTQ or AWQ (GEMM) Hugging Face-style directory -> (model, tokenizer or None).

    Weight-only fake-quant load: packed linears are unpacked and dequantized into the lab's float
    model (so `LLM(model, tokenizer=tok)` runs it on dequantized weights, not integer kernels).
    """
    from safetensors.torch import load_file

    from lab.models.config import ModelConfig
    from lab.models.llama import LlamaModel
    from lab.models.loader import default_device, default_dtype, load_tokenizer

    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    qc = read_quantization_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    tensors = {}
    for f in files:
        tensors.update(load_file(f, device="cpu"))
    state = _dequantized_state(tensors, qc)

    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    config = ModelConfig.from_hf_dict(raw)
    net = LlamaModel.empty(config, device, max_positions)
    net.load_hf_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()})
    return net.eval(), load_tokenizer(path)
