"""GPTQ and AWQ checkpoints between the lab and the tools that write the hub's: GPTQModel (GPTQ) and AutoAWQ (AWQ GEMM),
both ways, on a small random-weight Llama built from transformers' LlamaConfig (no download).

GPTQ, with GPTQModel 7.3.6 (in a child process, `lab.quant.gptqmodel_peer`):
- GPTQModel quantizes the model on CPU and saves its checkpoint; the lab loads it dequantized and packed, with
  weights equal to what GPTQModel's own loader dequantizes from it, and greedy tokens that are the lab's
  dequantized model's choices;
- the lab's checkpoints (its GPTQ with act-order on a symmetric grid: classic "gptq" format; an asymmetric grid
  with a zero point of 0: "gptq_v2") load in GPTQModel with the weights the lab dequantizes.
GPTQModel's torch kernel runs in float16 only, so its weights are compared with the lab's float32 weights rounded
to float16: the product of an fp16 scale and a small integer is exact in float32 and rounded once either way, so
the comparison is exact (torch.equal), not a tolerance.

AWQ, with AutoAWQ 0.2.9 (installed): AutoAWQ's own packing (`WQLinear_GEMM.from_linear`) of the lab's AWQ codes
writes a checkpoint the lab loads; the lab's `save_quantized` writes the same tensors bit for bit, and AutoAWQ's
`dequantize_gemm` reads the lab's checkpoint back to the lab's weights (float16, exact as above).
"""

import copy
import json

import pytest
import torch
from test_quant_packed import assert_greedy_close, check_linear

from lab.models.hf_export import hf_state_dict
from lab.models.reference import greedy_generate
from lab.quant import autoawq_peer, gptqmodel_peer
from lab.quant.formats import is_quantized, load_quantized, save_quantized
from lab.quant.packed import PackedLinear, checkpoint_codes, load_packed
from lab.quant.rtn import QuantSpec, dequantize, quantize

pytestmark = pytest.mark.usefixtures("one_thread")
needs_gptqmodel = pytest.mark.skipif(bool(gptqmodel_peer.available()), reason=gptqmodel_peer.available())
needs_autoawq = pytest.mark.skipif(bool(autoawq_peer.available()), reason=autoawq_peer.available())

VOCAB = 128
PROMPT = [5, 17, 42, 9, 100, 3]
STEPS = 8
# The tiny model's logits are small and its top two sometimes close; float16 (GPTQModel) and bfloat16-input
# (packed) runs may pick the runner-up there. A wrong weight layout misses by far more (logits span ~4).
MARGIN = 0.05


def calibration(n: int = 8, length: int = 64, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length,), generator=g).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A Llama of 2 layers (hidden 64, 4 heads, 2 KV heads, MLP 128) in transformers' format with a word-level
    tokenizer (GPTQModel's loader wants one): (directory, the lab's float32 model of it, the tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    from lab.models import load_model

    path = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # weights large enough that a wrong layout shows (as tests/test_model_families.py)
        for p in hf.parameters():
            p.normal_(0, 0.1) if p.dim() > 1 else p.normal_(1, 0.2)
    hf.save_pretrained(path)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t1").save_pretrained(path)
    model, tok = load_model(path, dtype=torch.float32, device="cpu")
    return path, model, tok


def lab_gptq(model, spec, act_order):
    from lab.quant.gptq import GPTQConfig, gptq_quantize_model

    model = copy.deepcopy(model)
    codes: dict = {}
    gptq_quantize_model(model, calibration(4, 32), spec, GPTQConfig(act_order=act_order), progress=False,
                        results=codes)
    return model, codes


def rtn_with_a_zero_of_zero(model, spec):
    """RTN codes of every decoder linear after one row of layer 0's q/k/v is made all positive: RTN's range then
    starts at 0, so that group's zero point is 0, which the classic GPTQ format cannot store (it is saved as
    GPTQModel's gptq_v2)."""
    from lab.quant.pipeline import decoder_linears

    model = copy.deepcopy(model)
    with torch.no_grad():
        model.layers[0].self_attn.qkv_proj.weight[3].abs_()
    codes = {name: quantize(lin.weight.detach(), spec) for name, lin in decoder_linears(model).items()}
    assert int(codes["layers.0.self_attn.qkv_proj"][2].min()) == 0
    return model, codes


def lab_weights(path) -> dict[str, torch.Tensor]:
    """The lab's dequantized float32 weights of a checkpoint under Hugging Face names."""
    deq, _ = load_quantized(path, dtype=torch.float32, device="cpu")
    return deq, hf_state_dict(deq)


def assert_equal_to_fp16(theirs: dict, ours: dict, expected_names: int):
    assert len(theirs) == expected_names, sorted(theirs)
    for name, w in theirs.items():
        mine = ours[f"{name}.weight"].float()
        assert w.shape == mine.shape, name
        assert torch.equal(w, mine.half().float()), (name, float((w - mine).abs().max()))


# GPTQModel's checkpoints: its 7.x defaults (group-aware reordering, asymmetric), and act-order on a symmetric grid
GPTQMODEL_SETTINGS = {"gptqmodel-default": dict(group_aware=True),
                      "gptqmodel-act-order": dict(symmetric=True, act_order=True)}


@pytest.fixture(scope="module")
def gptqmodel_runs(tiny, tmp_path_factory):
    """Two checkpoints GPTQModel writes of the tiny model, two of the lab's, and what GPTQModel's loader reads
    from each, all in one child process: ({name: quantize result}, {name: checkpoint}, {name: (weights, tokens)})."""
    from safetensors.torch import load_file

    path, model, tok = tiny
    out = tmp_path_factory.mktemp("gptq-interchange")
    spec = QuantSpec(4, 32)
    act_model, act_codes = lab_gptq(model, QuantSpec(4, 32, symmetric=True), act_order=True)
    v2_model, v2_codes = rtn_with_a_zero_of_zero(model, spec)
    ckpts = {name: out / name for name in GPTQMODEL_SETTINGS}
    ckpts["lab-act-order"] = save_quantized(act_model, act_codes, QuantSpec(4, 32, symmetric=True), "gptq",
                                            out / "lab-act-order", tok)  # GPTQModel's loader wants a tokenizer
    ckpts["lab-v2"] = save_quantized(v2_model, v2_codes, spec, "gptq", out / "lab-v2", tok)
    tasks = [gptqmodel_peer.quantize_task(path, ckpts[name], calibration(), spec.bits, spec.group_size, **kw)
             for name, kw in GPTQMODEL_SETTINGS.items()]
    # GPTQModel's own checkpoints read by its loader; the lab's by its loader and by transformers'
    reads = [(name, "gptqmodel") for name in ckpts] + [(name, "transformers") for name in ckpts if "lab" in name]
    tasks += [gptqmodel_peer.dequantize_task(ckpts[name], out / f"{name}.{loader}.safetensors", PROMPT, STEPS, loader)
              for name, loader in reads]
    results = gptqmodel_peer.run(tasks)
    quantized = dict(zip(GPTQMODEL_SETTINGS, results))
    read = {(name, loader): (load_file(out / f"{name}.{loader}.safetensors"), r["tokens"], r["kernels"])
            for (name, loader), r in zip(reads, results[len(GPTQMODEL_SETTINGS):])}
    return quantized, ckpts, read


@needs_gptqmodel
@pytest.mark.parametrize("name", list(GPTQMODEL_SETTINGS))
def test_a_checkpoint_gptqmodel_wrote_loads_in_the_lab(gptqmodel_runs, name):
    quantized, ckpts, read = gptqmodel_runs
    path = ckpts[name]
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert quantized[name]["version"] == gptqmodel_peer.VERSION
    assert qc["quant_method"] == "gptq" and qc["bits"] == 4 and qc["group_size"] == 32
    assert qc["sym"] == (name == "gptqmodel-act-order") and qc["desc_act"] == (name == "gptqmodel-act-order")
    deq, ours = lab_weights(path)
    theirs, their_tokens, kernels = read[name, "gptqmodel"]
    assert kernels == ["TorchLinear"]
    assert_equal_to_fp16(theirs, ours, expected_names=2 * 7)
    # packed: the kernels hold the codes the checkpoint stores (the same ones load_quantized dequantizes)
    packed, _ = load_packed(path)
    fused, bits = checkpoint_codes(path)
    assert bits == 4 and sum(isinstance(m, PackedLinear) for m in packed.modules()) == 2 * 4
    for mod_name, mod in packed.named_modules():
        if isinstance(mod, PackedLinear):
            q, s, z, g = fused[mod_name]
            assert torch.equal(dequantize(q, s, z, g), deq.get_submodule(mod_name).weight), mod_name
            check_linear(mod, torch.randn(5, mod.in_features), q, s, z, g, bits)
    # greedy tokens: GPTQModel's own model's, and the lab's packed model's, are the dequantized lab model's choices
    assert assert_greedy_close_tokens(deq, their_tokens) >= STEPS - 1
    assert assert_greedy_close(packed, deq, PROMPT, STEPS, margin=MARGIN) >= STEPS - 1


def assert_greedy_close_tokens(reference, tokens):
    """`tokens` (another runtime's greedy continuation of PROMPT) are `reference`'s choices, or within MARGIN of
    them; returns how many are exactly its choices."""
    from lab.models.reference import forward_logits

    assert len(tokens) == STEPS
    ref = forward_logits(reference, PROMPT + tokens)[len(PROMPT) - 1:-1]
    gap = ref.max(-1).values - ref.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    assert float(gap.max()) <= MARGIN, (gap, tokens, greedy_generate(reference, PROMPT, STEPS))
    return int((gap == 0).sum())


@needs_gptqmodel
@pytest.mark.parametrize("loader", ["gptqmodel", "transformers"])
@pytest.mark.parametrize("name", ["lab-act-order", "lab-v2"])
def test_the_labs_gptq_checkpoints_load_in_gptqmodel_and_transformers(gptqmodel_runs, name, loader):
    _, ckpts, read = gptqmodel_runs
    qc = json.loads((ckpts[name] / "config.json").read_text())["quantization_config"]
    assert qc["checkpoint_format"] == ("gptq_v2" if name == "lab-v2" else "gptq")
    assert qc["desc_act"] == (name == "lab-act-order")
    deq, ours = lab_weights(ckpts[name])
    theirs, their_tokens, kernels = read[name, loader]
    assert kernels == ["TorchLinear"]
    assert_equal_to_fp16(theirs, ours, expected_names=2 * 7)
    assert assert_greedy_close_tokens(deq, their_tokens) >= STEPS - 1


# --------------------------------------------------------------------------- AWQ with AutoAWQ

def lab_awq(model, spec):
    from lab.quant.awq import awq_quantize_model

    model = copy.deepcopy(model)
    codes: dict = {}
    awq_quantize_model(model, calibration(4, 32), spec, progress=False, results=codes, n_grid=4, clip_grid=4)
    return model, codes


def autoawq_checkpoint(model, codes, spec, path):
    """The AWQ checkpoint AutoAWQ would save for the lab's codes: each Hugging Face projection packed by AutoAWQ's
    `WQLinear_GEMM.from_linear` (given the dequantized weight, scales and zeros as its quantizer passes them:
    [groups, out]), the config from AutoAWQ's `AwqConfig`; every other tensor as the lab stores it."""
    from awq.models._config import AwqConfig
    from awq.modules.linear.gemm import WQLinear_GEMM
    from safetensors.torch import save_file

    from lab.quant.formats import _hf_parts

    tensors = {k: v for k, v in hf_state_dict(model).items() if k.removesuffix(".weight").removeprefix("model.")
               not in {p.removeprefix("model.") for name in codes for p, _ in _hf_parts(model, name)}}
    for name, (q, s, z, _) in codes.items():
        for hf, rows in _hf_parts(model, name):
            w = dequantize(q[rows], s[rows], z[rows], group_size=spec.group_size)
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            lin.weight.data.copy_(w)
            packed = WQLinear_GEMM.from_linear(lin, spec.bits, spec.group_size, False, s[rows].t().contiguous(),
                                               z[rows].t().contiguous().float())
            for kind in ("qweight", "qzeros", "scales"):
                tensors[f"{hf}.{kind}"] = getattr(packed, kind).contiguous()
    path.mkdir(parents=True)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_hf_dict()
    config["quantization_config"] = AwqConfig(q_group_size=spec.group_size, w_bit=spec.bits).to_transformers_dict()
    (path / "config.json").write_text(json.dumps(config))
    return path


@needs_autoawq
def test_awq_checkpoints_between_the_lab_and_autoawq(tiny, tmp_path):
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file

    _, model, _ = tiny
    spec = QuantSpec(4, 32)
    awq_model, codes = lab_awq(model, spec)
    theirs_dir = autoawq_checkpoint(awq_model, codes, spec, tmp_path / "autoawq")
    ours_dir = save_quantized(awq_model, codes, spec, "awq", tmp_path / "lab")
    theirs, ours = load_file(theirs_dir / "model.safetensors"), load_file(ours_dir / "model.safetensors")
    packed_keys = sorted(k for k in theirs if k.endswith((".qweight", ".qzeros", ".scales")))
    assert len(packed_keys) == 3 * 2 * 7
    for key in packed_keys:  # the lab packs bit for bit as AutoAWQ does
        assert theirs[key].dtype == ours[key].dtype and torch.equal(theirs[key], ours[key]), key
    # AutoAWQ's checkpoint in the lab, and the lab's in AutoAWQ's dequantizer: the same weights
    deq, weights = lab_weights(theirs_dir)
    for key in (k for k in packed_keys if k.endswith(".qweight")):
        prefix = key.removesuffix(".qweight")
        w = dequantize_gemm(ours[key], ours[f"{prefix}.qzeros"], ours[f"{prefix}.scales"], 4, spec.group_size)
        assert torch.equal(w.t().float(), weights[f"{prefix}.weight"].half().float()), prefix
    packed, _ = load_packed(theirs_dir)
    assert assert_greedy_close(packed, deq, PROMPT, STEPS, margin=MARGIN) >= STEPS - 1


# --------------------------------------------------------------------------- what the config says about the layout

def without_config_quantization(src, dst, quantize_config: dict | None = None):
    """A copy of checkpoint `src` whose config.json has no quantization_config (as AutoGPTQ up to 0.4 saved them:
    the settings only in quantize_config.json); `quantize_config` replaces that file's contents when given."""
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    qc = config.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(config))
    (dst / "quantize_config.json").write_text(json.dumps(quantize_config if quantize_config is not None else qc))
    return dst


@needs_gptqmodel
def test_settings_in_quantize_config_json_only_are_read(gptqmodel_runs, tmp_path):
    """GPTQModel writes quantize_config.json beside config.json; AutoGPTQ up to 0.4 wrote only that file, and its
    checkpoints are still on the hub. Before the fix the lab refused them ("has no quantization_config")."""
    _, ckpts, read = gptqmodel_runs
    src = ckpts["gptqmodel-act-order"]
    assert (src / "quantize_config.json").exists()  # GPTQModel's own file
    only = without_config_quantization(src, tmp_path / "only", json.loads((src / "quantize_config.json").read_text()))
    _, ours = lab_weights(only)
    assert_equal_to_fp16(read["gptqmodel-act-order", "gptqmodel"][0], ours, expected_names=2 * 7)
    packed, _ = load_packed(only)
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 2 * 4


def test_autogptq_04_quantize_config_is_read(tiny, tmp_path):
    """AutoGPTQ 0.4's quantize_config.json: no quant_method, no checkpoint_format (the file itself says GPTQ, and
    the classic zero - 1 layout)."""
    _, model, _ = tiny
    spec = QuantSpec(4, 32)
    gptq_model, codes = lab_gptq(model, spec, act_order=True)
    src = save_quantized(gptq_model, codes, spec, "gptq", tmp_path / "lab")
    assert json.loads((src / "config.json").read_text())["quantization_config"]["checkpoint_format"] == "gptq"
    auto_gptq = {"bits": 4, "group_size": 32, "damp_percent": 0.01, "desc_act": True, "static_groups": False,
                 "sym": False, "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model"}
    only = without_config_quantization(src, tmp_path / "auto-gptq", auto_gptq)
    _, expected = lab_weights(src)
    _, got = lab_weights(only)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    # `lab eval` takes such a directory as quantized too (it looked at config.json only)
    assert is_quantized(only) and is_quantized(src) and not is_quantized(tmp_path)


@pytest.mark.parametrize("method,key,value", [("awq", "version", "gemv"), ("awq", "version", "marlin"),
                                              ("gptq", "checkpoint_format", "marlin"),
                                              ("gptq", "checkpoint_format", "bitblas")])
def test_other_layouts_are_refused_by_name(tiny, tmp_path, method, key, value):
    """AWQ's GEMV and Marlin versions and GPTQ's Marlin and BitBLAS formats store the same numbers in other
    layouts; before the fix the lab read them as GEMM / GPTQ without a word (wrong weights)."""
    from lab.quant.pipeline import decoder_linears

    _, model, _ = tiny
    spec = QuantSpec(4, 32)
    codes = {name: quantize(lin.weight.detach(), spec) for name, lin in decoder_linears(model).items()}
    path = save_quantized(model, codes, spec, method, tmp_path / method)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"][key] = value
    (path / "config.json").write_text(json.dumps(config))
    for load in (lambda p: load_quantized(p, dtype=torch.float32, device="cpu"), load_packed):
        with pytest.raises(ValueError, match=f"{key}.*{value}"):
            load(path)
