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
