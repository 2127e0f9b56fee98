"""Notebooks 00, 01 and 04 are device-aware: a DEVICE parameter, a `gpu` preset whose values are checked
here without a GPU, and rooflines whose byte costs and probed ceilings follow the dtype and device the model
actually ran in (notebook 01 used to cost a bfloat16 model at 4 bytes an element; notebook 04 used to time
its recompute on the CPU in float32 against ceilings probed on the GPU in bfloat16)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from lab.machine.hardware import Hardware
from lab.models.loader import preset_config
from lab.workflow.run import EXPLICIT_ENV, params_from_namespace
from lab.studies import replay_break_even
from lab.studies.engine_tour import measure as engine_tour
from lab.studies.memory_accounting import measure as memory_accounting

STUDIES = {"00_engine_tour": engine_tour.TourParams, "01_memory_accounting": memory_accounting.MemoryParams,
           "04_replay_break_even": replay_break_even.ReplayParams}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="what is refused here is CUDA where there is none")


@pytest.mark.usefixtures("gpu_memory")
@pytest.mark.parametrize("cls", STUDIES.values(), ids=STUDIES.keys())
def test_gpu_preset_exists_and_its_values_pass_validation(cls):
    preset = cls.PRESETS["gpu"]
    params = cls(**{**preset, "DEVICE": "cpu"})  # the dataclass's checks, without the CUDA check of the preset
    assert {n: getattr(params, n) for n in preset} == preset


@no_cuda
@pytest.mark.parametrize("cls", STUDIES.values(), ids=STUDIES.keys())
def test_gpu_preset_and_cuda_are_refused_by_name_without_cuda(cls, monkeypatch):
    monkeypatch.delenv(EXPLICIT_ENV, raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        params_from_namespace(cls, {"PRESET": "gpu"})
    with pytest.raises(ValueError, match="DEVICE='cuda'.*CUDA"):
        cls(DEVICE="cuda")


@pytest.mark.parametrize("cls", STUDIES.values(), ids=STUDIES.keys())
@pytest.mark.parametrize("device", ["tpu", "cuda:x", "CPU"])
def test_a_bad_device_is_refused_naming_the_value(cls, device):
    with pytest.raises(ValueError, match=re.escape(f"DEVICE={device!r}")):
        cls(DEVICE=device)


def test_the_tour_builds_its_engines_on_device(monkeypatch):
    built = []
    monkeypatch.setattr(engine_tour, "LLM", lambda model, **kw: built.append(kw))
    engine_tour.make_engine(engine_tour.TourParams(DEVICE="cpu"), model="a model")
    assert built[0]["device"] == torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    """random:tiny in bfloat16 and in float32, on the CPU."""
    from lab.models import load_model

    return {dtype: load_model("random:tiny", dtype=dtype, device="cpu")[0] for dtype in ("bfloat16", "float32")}


def test_notebook_01_byte_costs_follow_the_dtype_the_model_ran_in(tiny):
    c = tiny["bfloat16"].config
    per_element = {"bfloat16": 2, "float32": 4}
    for dtype, model in tiny.items():
        cost = memory_accounting.engine_cost(model)
        assert cost.kv_bytes_per_token == per_element[dtype] * 2 * c.num_hidden_layers * c.num_key_value_heads \
            * c.head_dim, dtype
        unique = {p.data_ptr(): p for p in model.parameters()}.values()
        assert cost.weight_bytes == per_element[dtype] * sum(p.numel() for p in unique), dtype


def test_notebook_01_allocation_check_accounts_for_the_model_that_ran(tiny):
    from lab.engine import LLM

    alloc = memory_accounting.engine_allocation_check(LLM(tiny["bfloat16"], num_kv_blocks=8, max_model_len=64))
    assert alloc["measured / predicted"].tolist() == pytest.approx([1.0, 1.0])


def test_notebook_01_ceilings_are_probed_in_the_models_dtype_on_its_device(tiny, monkeypatch):
    calls = []
    from lab.machine import hardware
    monkeypatch.setattr(hardware, "probe_inference", lambda *a, **kw: calls.append((a, kw)))
    hardware.model_ceilings(tiny["bfloat16"], 1.0)
    (dtype, device), kw = calls[0]
    assert (dtype, device) == (torch.bfloat16, "cpu")
    assert (kw["gemv_shape"], kw["gemm_n"]) == ((49152, 576), 1024)  # tiny is cache-sized: the probe's defaults
    big = SimpleNamespace(embed_tokens=SimpleNamespace(weight=torch.empty(0, dtype=torch.bfloat16)),
                          config=preset_config("llama-3-8b"))  # the gpu preset's model, as far as the probe looks
    hardware.model_ceilings(big, 1.0)
    assert (calls[1][1]["gemv_shape"], calls[1][1]["gemm_n"]) == ((128256, 4096), 4096)


def test_notebook_04_auto_dtype_is_the_serving_dtype_of_its_device():
    from lab.models.loader import default_dtype

    p = replay_break_even.ReplayParams(DEVICE="cpu")
    assert (p.device, p.torch_dtype) == (torch.device("cpu"), default_dtype("cpu"))
    assert replay_break_even.ReplayParams(DEVICE="cpu", DTYPE="float32").torch_dtype == torch.float32


def test_notebook_04_recompute_runs_on_device_in_the_dtype_its_roofline_probes(monkeypatch):
    import lab.machine.hardware
    import lab.models

    loaded, probed = [], []
    load = lab.models.load_model
    monkeypatch.setattr(lab.models, "load_model", lambda *a, **kw: loaded.append(load(*a, **kw)) or loaded[-1])
    fake = Hardware("fake", 1, 1e12, 1e11, "a test")
    monkeypatch.setattr(lab.machine.hardware, "model_ceilings", lambda model, seconds: probed.append(model) or fake)
    p = replay_break_even.ReplayParams(DEVICE="cpu", DTYPE="bfloat16", MODEL="random:tiny", MORE_MODELS=(),
                                       PREFIXES=(32,),
                                       WINDOWS=(16,), REPEATS=1)
    measured = replay_break_even.measure(p)
    model = loaded[0][0]
    assert probed == [model]  # the ceilings are those of the model that ran the recompute
    assert (model.embed_tokens.weight.dtype, model.embed_tokens.weight.device) == (torch.bfloat16, torch.device("cpu"))
    assert measured["probe_GBps"].tolist() == [100.0]
    summary = replay_break_even.summarize(measured)
    for tier in (c[5:-2] for c in measured if c.startswith("load ")):  # every tier measured is summarized
        assert f"recompute_beats_{tier}" in summary
