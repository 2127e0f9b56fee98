"""The whole workbench on a user's model (issue 51), on small random-weight 16-bit checkpoints with a tokenizer
(`lab.models.random_checkpoint`, built from transformers' own config classes: no download).

`lab run all --preset smoke --model DIR` runs every study notebook on a 16-bit Llama, and (in process, the GPU
machine's runner) the five whose code takes a family's own paths on a Qwen3; each run records the models it loaded (`models_loaded.jsonl`, its child processes'
too), and every load is of that checkpoint, so a notebook that ignores the switch (a hard-coded model, a parameter
`MODEL` does not reach) fails here. Notebook 02's detector reports 16-bit weights, and `lab claims --runs` then
decides the weight-accuracy rows that the committed ledger, measured on the already-4-bit embedded model, leaves
"not checkable here". A model a study cannot use is refused up front with its reason, and the rest go on.
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lab.cli import main
from lab.models.loader import TOKENIZER_FILES
from lab.models.random_checkpoint import write_random_checkpoint
from lab.workflow.notebook import study_notebooks
from lab.workflow.run import MODELS_LOADED, ModelRefused

NOTEBOOKS = [p.stem for p in study_notebooks()]
REPO = Path(__file__).resolve().parents[1]


def foreign_loads(run_dir: Path, model: Path) -> list[dict]:
    """The loads a run made of anything but `model` (a checkpoint directory) and the checkpoints it wrote from it
    (notebook 02's quantized copies, under the cache's checkpoints/<run id>/): what ignoring the switch looks like."""
    from lab.models.loader import cache_dir

    own = str((cache_dir() / "checkpoints" / run_dir.name).resolve())
    lines = [json.loads(x) for x in (run_dir / MODELS_LOADED).read_text().splitlines()]
    return [x for x in lines if x["dir"] != str(model.resolve()) and not x["dir"].startswith(own + "/")]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("ck") / "llama16", family="llama")


def test_a_load_of_another_model_is_caught(tmp_path, llama):
    """The check the switch is held to fails on a run that loaded the embedded model beside the checkpoint."""
    from lab.models.loader import LOAD_LOG_ENV, load_tokenizer, resolve_model_dir

    run = tmp_path / "run"
    run.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOAD_LOG_ENV, str(run / MODELS_LOADED))
        load_tokenizer(llama)
        assert foreign_loads(run, llama) == []
        load_tokenizer(resolve_model_dir("smollm2-135m"))  # what a notebook ignoring MODEL would do
    (bad,) = foreign_loads(run, llama)
    assert bad["what"] == "tokenizer" and "SmolLM2" in bad["dir"]


@pytest.fixture(scope="module")
def runs(llama, tmp_path_factory):
    """`lab run all --preset smoke --model <16-bit Llama>` into a folder of its own."""
    out = tmp_path_factory.mktemp("yours")
    assert main(["run", "all", "--preset", "smoke", "--model", str(llama), "--results-dir", str(out)]) == 0
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_notebook_runs_on_the_switch_and_loads_only_that_model(name, runs, llama):
    (run,) = (runs / name).glob("2*")
    assert json.loads((run / "params.json").read_text())["parameters"]["MODEL"] == str(llama)
    assert (run / MODELS_LOADED).exists(), f"{name} loaded no model at all"
    assert foreign_loads(run, llama) == [], name


def test_notebook_02_detects_16bit_weights_and_the_ledger_decides_the_weight_accuracy_rows(runs, tmp_path):
    (run,) = (runs / "02_quantization_accuracy").glob("2*")
    assert json.loads((run / "metrics.json").read_text())["weights16"] is True
    # random weights pass none of the sensitive items: AWQ cannot be "steadier" than GPTQ from that floor (it read
    # "wrong" from 0 - 0 pts before the floor reached this row)
    assert pd.read_csv(run / "grid.csv")["pass_all"].iloc[0] == 0
    table = pd.read_csv(run / "claims.csv").set_index("claim")
    steadier = table.loc[table.index.str.startswith("AWQ is steadier than GPTQ")].iloc[0]
    assert steadier["verdict"] == "not checkable here" and "passes none of the sensitive items" in steadier["note"]
    ledger = tmp_path / "ledger"
    assert main(["claims", "--runs", str(runs), "--out", str(ledger)]) == 0
    yours = pd.read_csv(ledger / "CLAIMS.csv", dtype=str).fillna("").set_index("id")
    committed = pd.read_csv(REPO / "results" / "CLAIMS.csv", dtype=str).fillna("").set_index("id")
    rows = committed.index[(committed["scope"] == "weight-accuracy")
                           & (committed["notebook"] == "02_quantization_accuracy")]
    assert len(rows) >= 3  # 003-15, 003-18, 003-19
    # the embedded model's weights are 4-bit already: the committed rows stay undecided by weight precision...
    assert set(committed.loc[rows, "verdict"]) == {"not checkable here"}
    assert committed.loc[rows, "undecided by"].str.startswith("weight precision").all()
    # ... and the 16-bit checkpoint decides them by measurement, through the same rules and scopes
    measured = {"holds", "wrong", "wrong by rounding", "not distinguishable"}
    assert set(yours.loc[rows, "verdict"]) <= measured, yours.loc[rows, ["verdict", "undecided by"]]
    beside = pd.read_csv(ledger / "BESIDE.csv", dtype=str).set_index("id")
    assert set(beside.loc[rows, "stands"]) == {"decided by your runs"}
    site = tmp_path / "site"
    assert main(["report", "--out", str(site), "--beside", str(ledger)]) == 0
    html = (site / "index.html").read_text()
    assert "Your runs beside the committed ledger" in html and all(r in html for r in rows)


# The notebooks whose code takes a family's own paths: the engine (00), quantization's walks over the linears (02),
# the KV formats per head (03), the layer-skip and quantized drafters (05), tensor parallelism's sharding (08). The
# other five drive the engine as 00 does.
FAMILY_PATHS = ("00_engine_tour", "02_quantization_accuracy", "03_kv_quantization", "05_speculative_acceptance",
                "08_parallelism")


def test_the_switch_reaches_another_family_in_process(tmp_path):
    """A Qwen3 (q/k norms, an explicit head_dim) through the in-process runner, the GPU machine's."""
    qwen = write_random_checkpoint(tmp_path / "qwen16", family="qwen3")
    out = tmp_path / "runs"
    for nb in FAMILY_PATHS:
        assert main(["run", nb, "--in-process", "--preset", "smoke", "--model", str(qwen),
                     "--results-dir", str(out)]) == 0
        (run,) = (out / nb).glob("2*")
        assert foreign_loads(run, qwen) == [], nb
    (run,) = (out / "02_quantization_accuracy").glob("2*")
    assert json.loads((run / "metrics.json").read_text())["weights16"] is True


@pytest.fixture(scope="module")
def no_tokenizer(llama, tmp_path_factory):
    """The same weights without a tokenizer: a weights-only checkpoint."""
    bare = tmp_path_factory.mktemp("bare") / "weights_only"
    shutil.copytree(llama, bare)
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
