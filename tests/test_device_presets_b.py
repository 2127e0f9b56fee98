"""Notebooks 02, 03 and 05 and `lab quant` / `lab bench quant` are device-aware (issue 24): each study has a DEVICE
parameter and a `gpu` preset, validated here without a GPU (the preset is refused by name where CUDA is absent),
and the quantization commands take `--device`, checked before any model loads."""

import pytest
import torch

from lab.workflow.run import params_from_namespace
from lab.studies.kv_quantization import KVStudyParams
from lab.studies.quant_accuracy.measure import QuantAccuracyParams
from lab.studies.spec_acceptance import SpecParams

STUDIES = [QuantAccuracyParams, KVStudyParams, SpecParams]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")


@pytest.mark.usefixtures("gpu_memory")
@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_the_gpu_preset_changes_the_reference_and_passes_validation(cls):
    gpu = cls.PRESETS["gpu"]
    params = cls(**{**gpu, "DEVICE": "cpu"})  # a name that is not a field raises TypeError here
    reference = cls()
    assert any(getattr(params, n) != getattr(reference, n) for n in gpu), "the gpu preset must change something"
    assert "DEVICE" not in gpu and "PRESET" not in gpu


@no_cuda
@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_the_gpu_preset_is_refused_without_cuda(cls, monkeypatch):
    monkeypatch.delenv("LAB_EXPLICIT_PARAMS", raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        params_from_namespace(cls, {"PRESET": "gpu"})


@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_a_bad_device_is_refused_by_name(cls):
    with pytest.raises(ValueError, match="tpu"):
        cls(DEVICE="tpu")
    assert cls(DEVICE="cpu").DEVICE == "cpu" and cls().DEVICE == "auto"


@no_cuda
@pytest.mark.parametrize("cls", STUDIES, ids=lambda c: c.__name__)
def test_cuda_is_refused_where_there_is_none(cls):
    with pytest.raises(ValueError, match="CUDA is not available"):
        cls(DEVICE="cuda:0")


@pytest.mark.usefixtures("gpu_memory")
def test_the_speculative_target_is_checked_against_its_shape_before_loading():
    assert SpecParams(MODEL="random:llama-3-8b", DRAFT_LAYERS=31).DRAFT_LAYERS == 31  # 32 layers
    with pytest.raises(ValueError, match="DRAFT_LAYERS"):
        SpecParams(MODEL="random:llama-3-8b", DRAFT_LAYERS=32)
    with pytest.raises(ValueError, match="DRAFT_LAYERS"):
        SpecParams(DRAFT_LAYERS=30)  # SmolLM2 has 30 layers
    with pytest.raises(ValueError, match="vocabulary"):
        SpecParams(MODEL="random:tiny")  # the prompts are SmolLM2 token ids, beyond its 512
    with pytest.raises(ValueError, match="gpt2"):
        SpecParams(MODEL="gpt2")
    with pytest.raises(ValueError, match="unknown preset"):
        SpecParams(MODEL="random:no-such-shape")


def test_the_roofline_floor_uses_the_ceilings_it_is_given():
    from lab.machine.hardware import Hardware
    from lab.models import load_model
    from lab.studies.spec_acceptance import roofline_costs

    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    slow_memory = Hardware("slow memory", 2**30, peak_flops=1e15, mem_bandwidth=1e6, source="test")
    slow_compute = Hardware("slow compute", 2**30, peak_flops=1e3, mem_bandwidth=1e15, source="test")
    memory_bound = roofline_costs(model, 64, [1, 4], slow_memory)
    assert memory_bound["roofline bound"] == "memory" and memory_bound["roofline v(4)"] == pytest.approx(1.0)
    compute_bound = roofline_costs(model, 64, [1, 4], slow_compute)
    assert compute_bound["roofline bound"] == "compute" and compute_bound["roofline v(4)"] == pytest.approx(5.0)
    assert compute_bound["roofline step ms"] != memory_bound["roofline step ms"]


@pytest.mark.parametrize("argv", [["quant", "--out", "x"], ["bench", "quant"]], ids=["quant", "bench-quant"])
def test_the_quant_commands_take_a_device_and_refuse_a_bad_one(argv, capsys):
    from lab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(argv).device == "auto"
    assert parser.parse_args(argv + ["--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        parser.parse_args(argv + ["--device", "tpu"])
    assert "tpu" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            parser.parse_args(argv + ["--device", "cuda"])
        assert "CUDA is not available" in capsys.readouterr().err


def test_the_quant_job_and_bench_check_the_device_before_loading_a_model(tmp_path, monkeypatch):
    import lab.models
    from lab.bench.quant import run_quant_bench
    from lab.quant.pipeline import QuantJob, run_quant_job

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the device was checked")

    monkeypatch.setattr(lab.models, "load_model", no_load)
    with pytest.raises(ValueError, match="tpu"):
        run_quant_job(QuantJob(method="rtn"), tmp_path, device="tpu")
    with pytest.raises(ValueError, match="tpu"):
        run_quant_bench(device="tpu")
    with pytest.raises(AssertionError, match="loaded"):  # a good device gets as far as loading
        run_quant_job(QuantJob(method="rtn"), tmp_path, device="cpu")


def test_the_quant_bench_report_names_the_device_it_ran_on():
    from lab.bench.quant import format_result

    r = {"model": "smollm2-135m", "bits": 4, "group_size": 64, "device": "cuda:0", "device_name": "this machine (H200)",
         "threads": 16, "gemm_gflops_fp32": 50000.0, "rows": [], "autoawq": "absent", "autoawq_peer": [],
         "cpu_busy_at_start": 0.0}
    assert format_result(r).splitlines()[0].startswith("smollm2-135m w4g64 on cuda:0 (this machine (H200))")
