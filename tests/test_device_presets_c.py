"""Notebooks 06-09 are device-aware: each study has a DEVICE parameter and a gpu preset. This machine may have no
GPU, so the gpu presets are checked without running them: their values pass the study's own validation (built
with DEVICE="cpu"), asking for one without CUDA is refused by name, and a bad DEVICE is refused with its value."""

import dataclasses

import pytest
import torch

from lab.workflow.run import params_from_namespace
from lab.studies.parallelism.measure import ParallelParams
from lab.studies.serving.measure import ServingParams
from lab.studies.structured_output.measure import StructuredParams
from lab.studies.ttft_claims.measure import TTFTParams

STUDIES = [ServingParams, StructuredParams, ParallelParams, TTFTParams]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of CUDA where there is none")


@pytest.mark.usefixtures("gpu_memory")
@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_gpu_preset_exists_and_its_values_pass_the_validation(cls):
    values = cls.PRESETS["gpu"]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert values and set(values) <= fields, set(values) - fields
    p = cls(**values, PRESET="gpu", DEVICE="cpu")  # __post_init__ validates (and normalizes) every value
    for name, value in values.items():
        got = getattr(p, name)
        assert (tuple(value) if isinstance(value, list) else value) == got, (name, value, got)
    assert p.DEVICE == "cpu"


@no_cuda
@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_gpu_preset_without_cuda_is_refused_by_name(cls):
    with pytest.raises(ValueError, match="CUDA"):
        params_from_namespace(cls, {"PRESET": "gpu"})


@no_cuda
@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_cuda_device_without_cuda_is_refused_by_name(cls):
    with pytest.raises(ValueError, match="DEVICE='cuda'.*CUDA is not available"):
        cls(DEVICE="cuda")


@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad", ["tpu", "cuda:x", ""])
def test_bad_device_is_refused_with_its_value(cls, bad):
    with pytest.raises(ValueError, match=f"DEVICE={bad!r}"):
        cls(DEVICE=bad)


@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_device_is_a_field_defaulting_to_auto(cls):
    assert {f.name: f.default for f in dataclasses.fields(cls)}["DEVICE"] == "auto"
    assert cls().DEVICE == "auto" and cls(DEVICE="cpu").DEVICE == "cpu"


def test_dtype_follows_the_device():
    """"auto" is the serving dtype of the device the study runs on, not of the CPU always."""
    from lab.models.loader import default_dtype

    for cls in (StructuredParams, TTFTParams):
        assert cls(DEVICE="cpu").torch_dtype == default_dtype("cpu")
        assert cls(DEVICE="cpu", DTYPE="float32").torch_dtype == torch.float32
    p = ParallelParams(DEVICE="cpu")
    assert p.torch_dtype == p.device_dtype == default_dtype("cpu")


def test_lab_serve_child_sees_only_the_run_device(monkeypatch):
    from lab.studies.ttft_claims.serving import device_env

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_env("cpu")["CUDA_VISIBLE_DEVICES"] == ""
    assert device_env("cuda:1")["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in device_env("cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert device_env("cuda:1")["CUDA_VISIBLE_DEVICES"] == "6"


def test_rank_projection_adds_the_collectives_to_the_measured_compute():
    import pandas as pd

    from lab.machine.hardware import GPUS
    from lab.parallel.comm_model import LINKS
    from lab.studies.parallelism.rank import rank_projection

    p = ParallelParams(DEVICE="cpu")
    measured = pd.DataFrame({"batch": [1, 64], "rank step ms (measured)": [5.0, 9.0]})
    proj = rank_projection(p, measured, GPUS["h200"])
    assert len(proj) == 2 * len(LINKS) and set(proj["link"]) == set(LINKS)
    row = proj.set_index(["link", "batch"]).loc[("nvlink-h100x8", 1)]
    assert row["step ms (projected)"] == pytest.approx(5.0 + row["comm ms (alpha-beta)"])
    assert row["comm share"] == pytest.approx(row["comm ms (alpha-beta)"] / row["step ms (projected)"])
    # at batch 1 the step is memory-bound: the two rooflines differ by the bandwidths' ratio
    assert row["compute ms (roofline, measured ceilings)"] == pytest.approx(row["compute ms (roofline, datasheet)"] *
                                                                           GPUS[p.HARDWARE].mem_bandwidth / 4.8e12)


def test_the_timestamp_experiment_runs_on_a_model_without_a_tokenizer():
    """The gpu preset serves `random:llama-3-8b`, which has no tokenizer: the timestamp inserted into the shared
    system prompt is then random ids (it called `tokenizer.encode` on None). Counts, on a tiny random model."""
    from lab.models import load_model
    from lab.studies.serving.measure import dynamic_prefix

    model, tok = load_model("random:tiny", dtype="float32")
    assert tok is None
    p = ServingParams(**{**ServingParams.PRESETS["smoke"], "MODEL": "random:tiny", "SYSTEM_PROMPT": 64},
                      PRESET="smoke", DEVICE="cpu")
    rows = dynamic_prefix(p, model, tok).set_index("timestamp")["cached_tokens"]
    assert rows["no change"] >= 64 and rows["at the start"] == 0 and rows["at the start"] < rows["halfway"]
