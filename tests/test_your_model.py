"""The whole workbench on a user's model (issue 51), on small random-weight 16-bit checkpoints with a tokenizer
(`lab.models.random_checkpoint`, built from transformers' own config classes: no download).

`lab run all --model DIR` hands every study notebook MODEL=DIR, and every notebook's smoke run is made on a 16-bit
Qwen3, a family other than the embedded model's (both in tests/test_notebooks.py, one run per notebook serving the
notebook convention, the switch and the family's own paths): each run records the models it loaded
(`models_loaded.jsonl`, its child processes' too), and every load must be of that checkpoint, so a notebook that
ignores the switch (a hard-coded model, a parameter `MODEL` does not reach) fails there; notebook 02's detector
reports 16-bit weights, and `lab claims --runs` then decides the weight-accuracy rows that the committed ledger,
measured on the already-4-bit embedded model, leaves "not checkable here". Here: a load of another model is caught,
and a model a study cannot use is refused up front with its reason while the rest go on. (The five notebooks whose
code takes a family's own paths once ran here a second time, on a Qwen3 in process, while the smoke runs used a
Llama: issue 52 made the smoke runs' checkpoint the Qwen3, and the in-process runner is tests/test_run_script.py's.)
"""

import shutil

import pytest

from lab.cli import main
from lab.models.loader import TOKENIZER_FILES
from lab.workflow.run import MODELS_LOADED, ModelRefused, foreign_loads


def test_a_load_of_another_model_is_caught(tmp_path, user16):
    """The check the switch is held to fails on a run that loaded the embedded model beside the checkpoint."""
    from lab.models.loader import LOAD_LOG_ENV, load_tokenizer, resolve_model_dir

    run = tmp_path / "run"
    run.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOAD_LOG_ENV, str(run / MODELS_LOADED))
        load_tokenizer(user16)
        assert foreign_loads(run, user16) == []
        load_tokenizer(resolve_model_dir("smollm2-135m"))  # what a notebook ignoring MODEL would do
    (bad,) = foreign_loads(run, user16)
    assert bad["what"] == "tokenizer" and "SmolLM2" in bad["dir"]


@pytest.fixture(scope="module")
def no_tokenizer(user16, tmp_path_factory):
    """The same weights without a tokenizer: a weights-only checkpoint."""
    bare = tmp_path_factory.mktemp("bare") / "weights_only"
    shutil.copytree(user16, bare)
    for f in (*TOKENIZER_FILES, "chat_template.jinja"):
        (bare / f).unlink(missing_ok=True)
    return bare


NEEDS_TOKENIZER = {"00_engine_tour": ("lab.studies.engine_tour.measure", "TourParams"),
                   "02_quantization_accuracy": ("lab.studies.quant_accuracy.measure", "QuantAccuracyParams"),
                   "03_kv_quantization": ("lab.studies.kv_quantization.params", "KVStudyParams"),
                   "07_structured_output": ("lab.studies.structured_output.measure", "StructuredParams")}


@pytest.mark.parametrize("name", sorted(NEEDS_TOKENIZER))
def test_a_study_that_needs_a_tokenizer_refuses_a_model_without_one_up_front(name, no_tokenizer):
    import importlib

    module, cls = NEEDS_TOKENIZER[name]
    with pytest.raises(ModelRefused, match="has no tokenizer, and this study needs one"):
        getattr(importlib.import_module(module), cls)(MODEL=str(no_tokenizer))


def test_lab_run_reports_a_refusal_and_goes_on(no_tokenizer, tmp_path, capsys):
    """Through papermill: the refusal is said with its reason, is not a failure, and leaves no run behind."""
    assert main(["run", "07_structured_output", "--preset", "smoke", "--model", str(no_tokenizer),
                 "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "07_structured_output refused its model" in out and "grammars are over its vocabulary" in out
    assert not list(tmp_path.glob("07_structured_output/2*/metrics.json"))


def test_a_model_too_large_for_the_device_is_refused_by_its_size():
    from lab.studies.serving.measure import ServingParams

    with pytest.raises(ModelRefused, match=r"weights take \d+\.\d GB in float32, more than 90% of this machine"):
        ServingParams(MODEL="random:llama-3-70b", DTYPE="float32")


def test_a_ledger_of_no_runs_is_refused_by_name(tmp_path, capsys):
    """`lab claims --runs` on a folder without a finished run, or with --check, is an error naming the folder or
    the flag, never an empty ledger."""
    assert main(["claims", "--runs", str(tmp_path)]) == 2
    assert f"{tmp_path} holds no finished run" in capsys.readouterr().err
    assert main(["claims", "--runs", str(tmp_path), "--check"]) == 2
    assert "--check compares the committed ledger" in capsys.readouterr().err
