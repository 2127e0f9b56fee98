"""`lab quant` end to end: quantize the real model, save a checkpoint, load it back into the engine."""

import json
import subprocess
import sys

import torch

from lab.engine import LLM, SamplingParams
from lab.quant.formats import load_quantized
from lab.quant.pipeline import decoder_linears
from lab.quant.rtn import QuantSpec, fake_quantize


def test_lab_quant_rtn_checkpoint_loads_into_the_engine(tmp_path, smollm, chat_prompt_ids):
    out = subprocess.run([sys.executable, "-m", "lab.cli", "quant", "smollm2-135m", "--method", "rtn", "--bits", "4",
                          "--group-size", "64", "--out", str(tmp_path / "q")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["method"] == "rtn" and summary["quantization_seconds"] > 0
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "gptq" and config["quantization_config"]["bits"] == 4

    model, tok = load_quantized(tmp_path / "q", dtype=torch.float32)  # compared numerically: float32
    float_model, _ = smollm
    spec = QuantSpec(bits=4, group_size=64)
    for name, lin in list(decoder_linears(model).items())[:8]:
        expected = fake_quantize(decoder_linears(float_model)[name].weight.detach().float(), spec)
        # fp16 scales in the checkpoint: equal up to the scale's fp16 rounding
        assert torch.allclose(lin.weight.float(), expected, rtol=2e-3, atol=1e-4), name
        assert not torch.equal(lin.weight.float(), decoder_linears(float_model)[name].weight.float())

    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    outs = llm.generate(chat_prompt_ids[:2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert all(len(o.token_ids) == 12 and o.text for o in outs)


def test_quant_job_rejects_bad_options():
    import pytest

    from lab.quant.pipeline import QuantJob

    with pytest.raises(ValueError, match="method"):
        QuantJob(method="smoothquant")
    with pytest.raises(ValueError, match="act_order"):
        QuantJob(method="awq", act_order=True)
    with pytest.raises(ValueError, match="layers"):
        QuantJob(method="rtn", layers=())
    with pytest.raises(ValueError, match="layers"):
        QuantJob(method="rtn", layers=(0, -1))


def test_a_job_on_some_layers_quantizes_those_and_saves_the_rest_unquantized(tmp_path, smollm):
    import copy

    import pytest

    from lab.cli.quant import layer_list
    from lab.quant.formats import save_quantized
    from lab.quant.pipeline import QuantJob, checkpoint_format, quantize_model

    float_model, tok = smollm
    job = QuantJob(method="rtn", layers=layer_list("0,2"))
    with pytest.raises(ValueError, match="30 decoder layers"):
        quantize_model(QuantJob(method="rtn", layers=(0, 30)), copy.deepcopy(float_model), tok)
    model = copy.deepcopy(float_model)
    codes, summary = quantize_model(job, model, tok, progress=False)
    assert summary["layers"] == 2 and {k.split(".")[1] for k in codes} == {"0", "2"}
    loaded, _ = load_quantized(save_quantized(model, codes, job.spec(), checkpoint_format(job), tmp_path / "q"),
                               dtype=torch.float32)
    before, after = decoder_linears(float_model), decoder_linears(loaded)
    for name, lin in after.items():
        changed = not torch.equal(lin.weight.float(), before[name].weight.float())
        assert changed == (name.split(".")[1] in ("0", "2")), name
