"""Every tensor a code path builds lives on the model's device, and seeded generators on the device of the
probabilities they draw from (issue 24: the CUDA paths no GPU has run).

A CPU has one device, so these tests make the *default* device a foreign one ("meta"): a tensor built without
naming its device lands there, and the first operation that mixes it with the model's tensors, or reads a
number out of it, fails, as a CPU tensor would beside a CUDA model. A generator is always made on the CPU
unless its device is named, so generators are checked by recording the device each one was made for.
"""

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.models import load_model
from lab.quant.rtn import QuantSpec
from lab.speculative import SpeculativeConfig

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 2, 3, 4, 5, 1, 2, 3]]


@pytest.fixture
def tiny():
    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    return model


@pytest.fixture
def foreign_default_device():
    with torch.device("meta"):
        yield


@pytest.fixture
def generator_devices(monkeypatch):
    """The device each torch.Generator was made for (None: not named, so the CPU whatever the model's)."""
    made, real = [], torch.Generator

    def spy(device=None):
        made.append(device)
        return real() if device is None else real(device=device)

    monkeypatch.setattr(torch, "Generator", spy)
    return made


def _speculative(model, method):
    from lab.speculative import layer_skip_model

    if method == "plain":
        return None
    draft = layer_skip_model(model, 1) if method == "layerskip" else None
    return SpeculativeConfig(k=3, method=method, draft_model=draft)


def _params(n: int = 6):
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
            SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=n, ignore_eos=True)]


@pytest.mark.parametrize("method", ["plain", "ngram", "layerskip"])
def test_engine_steps_build_nothing_on_the_default_device(tiny, foreign_default_device, method):
    llm = LLM(tiny, num_kv_blocks=32, max_model_len=128, speculative=_speculative(tiny, method))
    outs = llm.generate(PROMPTS, _params())
    assert [len(o.token_ids) for o in outs] == [6, 6]


@pytest.mark.parametrize("method", ["plain", "ngram", "layerskip"])
def test_seeded_generators_are_made_on_the_device_of_the_probabilities(tiny, generator_devices, method):
    """A CPU generator with CUDA probabilities makes torch.multinomial raise: every seeded request would fail."""
    llm = LLM(tiny, num_kv_blocks=32, max_model_len=128, speculative=_speculative(tiny, method))
    first = [o.token_ids for o in llm.generate(PROMPTS, _params())]
    assert generator_devices and all(d is not None and torch.device(d) == torch.device("cpu")
                                     for d in generator_devices), generator_devices
    assert [o.token_ids for o in llm.generate(PROMPTS, _params())] == first  # one seed, one stream


def test_a_sequence_keeps_one_seeded_stream_per_device():
    from lab.engine.request import Sequence

    seq = Sequence([1, 2, 3], SamplingParams(temperature=1.0, seed=7))
    g = seq.generator("cpu")
    assert g is seq.generator(torch.device("cpu")) and g.initial_seed() == 7
    assert Sequence([1], SamplingParams(temperature=1.0)).generator("cpu") is None


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptq_and_awq_keep_their_statistics_where_the_weights_are(tiny, foreign_default_device, method):
    """GPTQ's Hessian and AWQ's search buffers were made on the default device, beside CUDA weights."""
    from lab.quant.awq import awq_quantize_model
    from lab.quant.gptq import gptq_quantize_model

    before = tiny.layers[0].mlp.down_proj.weight.detach().clone()
    quantize = gptq_quantize_model if method == "gptq" else awq_quantize_model
    quantize(tiny, [list(range(3, 35)), list(range(40, 72))], QuantSpec(bits=4, group_size=32), layers=[0],
             progress=False)
    after = tiny.layers[0].mlp.down_proj.weight
    assert after.device.type == "cpu" and not torch.equal(after, before)


@pytest.mark.parametrize("name", ["int8/per-token", "fp8_e4m3/per-tensor"])
def test_the_kv_error_study_feeds_the_model_on_its_device(tiny, foreign_default_device, name):
    from lab.eval.kv_error import attention_error_by_position, kl_by_position, record
    from lab.kv.calibration import KVScales
    from lab.studies.kv_quantization import study_format

    fmt, roles, _ = study_format(name)
    scales = KVScales.unit(tiny, fmt)
    ids = list(range(3, 40))
    rec = record(tiny, ids)
    err = attention_error_by_position(tiny, rec, fmt, roles, scales if fmt.static else None, stride=4)
    kl = kl_by_position(tiny, ids, rec.hidden, fmt, roles, scales if fmt.static else None)
    assert err.device.type == "cpu" and kl.shape == (len(ids),) and torch.isfinite(kl).all()


def test_random_presets_keep_float32_rotary_tables():
    """`.to(bfloat16)` cast the tables too: in bfloat16 the angles of positions past 256 collide."""
    bf, _ = load_model("random:tiny", dtype=torch.bfloat16, device="cpu")
    fp, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    assert bf.rope.cos.dtype == bf.rope.sin.dtype == torch.float32
    assert torch.equal(bf.rope.cos, fp.rope.cos) and torch.equal(bf.rope.sin, fp.rope.sin)


def test_timing_waits_for_every_gpu_holding_work_not_only_the_current_one(monkeypatch):
    """A defect: `lab.machine.timing.sync` waited for the current device only (cuda:0), so a study on DEVICE=cuda:1
    was timed at its launches. With CUDA faked (two devices, memory on cuda:1, none on cuda:2), both the
    current device and cuda:1 are waited for, and cuda:2 is left alone (a synchronize would create a context)."""
    from lab.machine import timing
    waited = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i=None: {0: 0, 1: 1 << 20, 2: 0}[i])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: waited.append(i))
    timing.sync()
    assert waited == [0, 1]
