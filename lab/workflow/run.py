"""Study runs: validated parameters in, results with provenance out, one directory per run.

Every study notebook follows one convention (see notebooks/README.md). Its parameters cell (tagged
`parameters` for papermill) holds plain assignments; the next cell turns them into the study's
parameter dataclass, whose `__post_init__` rejects a bad value before any heavy work, and calls
`start_run`. Results go to `results/<notebook>/<run-id>/`:

    params.json      the parameters and the provenance (git commit, versions, machine, start time)
    metrics.json     the key numbers of the run, and its duration once finished
    models_loaded.jsonl  every model (weights or tokenizer) the run loaded, its child processes' too
    *.csv, *.png     tidy tables and plots
    <notebook>.ipynb the executed notebook (written by `lab run`, image outputs stripped)
    profile_cells.csv, profile_functions.csv   where the run's time went, by cell and by function (`lab run`:
                     `lab.workflow.profile`)
    INCOMPLETE       present while `lab run` has not finished writing the run (`lab.workflow.index`)

A run id is a UTC timestamp (to the microsecond) plus a random suffix, so two runs never share a
directory and ids sort in the order the runs started.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import secrets
import time
from pathlib import Path

from .atomic import write_atomic
from .provenance import provenance

_ROOT = Path(__file__).resolve().parents[2]


def results_root() -> Path:
    """`$LAB_RESULTS_DIR`, else `results/` in the checkout."""
    return Path(os.environ.get("LAB_RESULTS_DIR") or _ROOT / "results")


def new_run_id() -> str:
    """UTC time to the microsecond (so ids sort in run order) plus a random suffix (so they never collide)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + "-" + secrets.token_hex(3)


MODELS_LOADED = "models_loaded.jsonl"  # a run's record of the models it loaded (`lab.models.loader._record_load`)
PRESETS = ("quick", "reference", "smoke", "gpu")  # gpu: what a CPU cannot study (production shapes, long contexts)
EXPLICIT_ENV = "LAB_EXPLICIT_PARAMS"  # set by `lab run`: the names it injected (JSON list)


def foreign_loads(run_dir: Path, model: Path) -> list[dict]:
    """The loads run `run_dir` recorded (its MODELS_LOADED) of anything but the checkpoint directory `model` and the
    checkpoints the run wrote from it (notebook 02's quantized copies, under the cache's checkpoints/<run id>/):
    what a notebook that ignores its MODEL looks like (issue 51)."""
    from lab.models.loader import cache_dir

    own = str((cache_dir() / "checkpoints" / Path(run_dir).name).resolve())
    lines = [json.loads(x) for x in (Path(run_dir) / MODELS_LOADED).read_text().splitlines()]
    return [x for x in lines if x["dir"] != str(Path(model).resolve()) and not x["dir"].startswith(own + "/")]


def _same(a, b) -> bool:
    """Parameter equality with papermill's lists and the dataclasses' tuples taken as equal."""
    norm = lambda v: tuple(v) if isinstance(v, list) else v  # noqa: E731
    return norm(a) == norm(b)


def params_from_namespace(cls, namespace: dict):
    """Build the parameter dataclass `cls` from a notebook's globals (fields are the UPPERCASE names).

    Presets: a study's dataclass defaults are its `reference` values (the committed reference runs) and its
    `PRESETS` class attribute maps `quick` and `smoke` to the values they change. The notebook's `PRESET`
    picks one; an explicit parameter beats the preset. A parameter is explicit when `lab run` (papermill)
    injected it, named in `$LAB_EXPLICIT_PARAMS`, or when its value differs from the reference default (edited
    in the parameters cell). The values the preset set are printed and kept in `params.preset_values`, which
    `start_run` writes to params.json beside the values actually used."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given = {n: namespace[n] for n in fields if n in namespace}
    preset = given.get("PRESET", fields["PRESET"].default)
    check_choice("PRESET", preset, PRESETS)
    injected = set(json.loads(os.environ.get(EXPLICIT_ENV) or "[]"))
    explicit = {n for n, v in given.items()
                if n in injected or (fields[n].default is not dataclasses.MISSING and not _same(v, fields[n].default))}
    table = getattr(cls, "PRESETS", {})
    if preset == "gpu":  # quick and smoke may equal the reference; a gpu preset must say what it studies
        if "gpu" not in table:
            raise ValueError(f"{cls.__name__} has no 'gpu' preset yet; its presets are {['reference', *table]}")
        check_device("DEVICE", "cuda")  # the gpu preset's shapes would take hours on a CPU
    unknown = sorted(set(table.get(preset, {})) - set(fields))
    if unknown:  # a typo in a preset table would otherwise be silently ignored
        raise ValueError(f"{cls.__name__}.PRESETS[{preset!r}] names unknown parameters {unknown}")
    from_preset = {n: v for n, v in table.get(preset, {}).items() if n not in explicit}
    params = cls(**{**given, **from_preset})
    params.preset_values = {n: getattr(params, n) for n in from_preset}
    if from_preset:
        print(f"preset {preset!r} sets " + ", ".join(f"{n}={v!r}" for n, v in params.preset_values.items()))
    return params


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"parameter {name}={value!r} is not one of {list(choices)}")


def check_dtype(name: str, value) -> None:
    """A model dtype parameter: "auto" (the serving dtype) or one of vLLM's dtype strings."""
    from lab.models.loader import DTYPES

    check_choice(name, value, ["auto", *DTYPES])


def check_device(name: str, value) -> None:
    """A DEVICE parameter: "auto" (CUDA when present, else the CPU), "cpu", "cuda" or "cuda:N". CUDA where
    none is present is refused by name, before any work."""
    import torch

    if value == "auto" or value == "cpu":
        return
    if not isinstance(value, str) or not (value == "cuda" or value.startswith("cuda:") and value[5:].isdigit()):
        raise ValueError(f"parameter {name}={value!r} is not one of 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise ValueError(f"parameter {name}={value!r}: CUDA is not available here (use 'cpu' or 'auto')")
    index = int(value[5:]) if value.startswith("cuda:") else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"parameter {name}={value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


class ModelRefused(ValueError):
    """A study cannot run on the model it was given (no tokenizer, a refused architecture, too large for the device):
    raised while its parameters are checked, before any heavy work. `lab run all` reports it as a refusal with its
    reason and goes on with the other notebooks (issue 51)."""


def refusal(e: BaseException) -> str | None:
    """The reason a notebook refused its model up front (`ModelRefused`, raised while its parameters were checked),
    from papermill's error or the in-process runner's; None where it failed otherwise."""
    if getattr(e, "ename", None) == ModelRefused.__name__:  # papermill.PapermillExecutionError
        lines = [line for line in str(e.evalue).splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""
    cause = e.__cause__
    return str(cause) if isinstance(cause, ModelRefused) else None


def _device_memory(device) -> tuple[int, str]:
    """(bytes, what they are) of the memory a model on `device` must fit in."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, f"{device}'s memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"


def check_model(name: str, value, device: str = "auto", dtype: str = "auto", needs_tokenizer: str = "",
                needs_chat_template: str = "", copies: float = 1.0):
    """A model parameter (MODEL): a model `lab.models.load_model` takes, whose `ModelInfo` it returns; refused with
    `ModelRefused`, naming the value and the reason, where the study cannot use it. `needs_tokenizer` and
    `needs_chat_template`: why the study needs one ("" where it does not); `copies`: how many builds of its weights
    in `dtype` the study holds at once (a reference beside its quantized copies), which must fit in the memory of
    `device` (checked as DEVICE and DTYPE parameters are)."""
    from lab.models.loader import default_dtype, describe_model, parse_dtype

    if not isinstance(value, str) or not value:
        raise ModelRefused(f"parameter {name}={value!r} must name a model: a name, 'random:<preset>', a checkpoint "
                           f"directory or a .gguf path")
    try:
        info = describe_model(value)
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise ModelRefused(f"parameter {name}={value!r}: {e}") from e
    if needs_tokenizer and not info.tokenizer:
        raise ModelRefused(f"parameter {name}={value!r} has no tokenizer, and this study needs one: {needs_tokenizer}")
    if needs_chat_template and not info.chat_template:
        raise ModelRefused(f"parameter {name}={value!r}: its tokenizer has no chat template, and this study needs one: "
                           f"{needs_chat_template}")
    where = resolve_device(device)
    torch_dtype = parse_dtype(dtype) or default_dtype(where)
    need, (have, what) = info.weight_bytes(torch_dtype) * copies, _device_memory(where)
    if need > 0.9 * have:  # the activations, the KV pool and the process need the rest
        held = f" ({copies:g} builds held at once)" if copies != 1 else ""
        dtype_name = str(torch_dtype).removeprefix("torch.")
        raise ModelRefused(f"parameter {name}={value!r}: its weights take {need / 1e9:.1f} GB in {dtype_name}{held}, "
                           f"more than 90% of {what} ({have / 1e9:.1f} GB)")
    return info


def resolve_device(value: str):
    """The torch.device a checked DEVICE parameter names ("auto": CUDA when present)."""
    import torch

    from lab.models.loader import default_device

    return default_device() if value == "auto" else torch.device(value)


def as_tuple(name: str, value) -> tuple:
    """A list or tuple parameter as a tuple; a string is refused (tuple("rtn") would be its letters)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"parameter {name}={value!r} must be a list or tuple")
    return tuple(value)


def check_range(name: str, value, lo=None, hi=None, kind=(int, float)) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"parameter {name}={value!r} must be a number")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"parameter {name}={value!r} is outside [{lo}, {hi}]")


def save_figure(directory: Path, name: str, fig, dpi: int = 110) -> Path:
    """Save `fig` as `name`.png in a run's `directory` and record in its figure_checks.json what it breaks of the
    plot standard (`lab.figures.check`), printing each problem; `lab docs` redraws a committed run's key figure
    through here too."""
    from lab.figures.check import problems

    path = Path(directory) / f"{name}.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    checks_path = Path(directory) / "figure_checks.json"
    checks = json.loads(checks_path.read_text()) if checks_path.exists() else {}
    checks[name] = problems(fig)
    checks_path.write_text(json.dumps(checks, indent=2) + "\n")
    for line in checks[name]:
        print(f"figure {name}: {line}")
    return path


@dataclasses.dataclass
class Run:
    notebook: str
    dir: Path
    params: dict
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def save_table(self, name: str, df) -> Path:
        path = self.dir / f"{name}.csv"
        df.to_csv(path, index=False)
        return path

    def save_figure(self, name: str, fig, dpi: int = 110) -> Path:
        """Save `fig` as `name`.png in the run directory (`save_figure`); a figure pyplot does not manage (built
        as a bare `Figure`) is also shown inline, which the notebook backend does for pyplot's own at the cell's
        end, so every saved figure is in the executed notebook too (issue 35)."""
        path = save_figure(self.dir, name, fig, dpi)
        import matplotlib.pyplot as plt

        if getattr(fig, "number", None) not in plt.get_fignums():
            _show_inline(fig)
        return path

    def save_metrics(self, **metrics) -> dict:
        """Merge key numbers into metrics.json (the index shows them)."""
        path = self.dir / "metrics.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update(metrics)
        write_atomic(path, json.dumps(current, indent=2, default=float) + "\n")
        return current

    def finish(self) -> Path:
        """Record the duration (and, under `lab run`, where it went: `lab.workflow.profile`) and refresh the
        results index; returns the run directory."""
        from .profile import finish_sampling

        finish_sampling(self.dir)
        self.save_metrics(duration_s=round(time.perf_counter() - self.started, 3))
        from lab.models.loader import LOAD_LOG_ENV

        if os.environ.get(LOAD_LOG_ENV) == str(self.dir / MODELS_LOADED):  # later loads are not this run's
            del os.environ[LOAD_LOG_ENV]
        from .index import write_index

        write_index(self.dir.parents[1])
        return self.dir


def _show_inline(fig) -> None:
    """Display `fig` where an IPython kernel runs this code (papermill, Jupyter); nothing elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is not None:
        display(fig)


def start_run(notebook: str, params) -> Run:
    """Create the run directory (or use `$LAB_RUN_DIR`, set by `lab run`) and write params.json."""
    values = dataclasses.asdict(params) if dataclasses.is_dataclass(params) else dict(params)
    from lab.figures.style import use_style

    use_style()
    run_dir = Path(os.environ.get("LAB_RUN_DIR") or results_root() / notebook / new_run_id())
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "params.json").exists():
        raise FileExistsError(f"{run_dir} already holds a run; a run never overwrites another")
    record = {"notebook": notebook, "run_id": run_dir.name, **provenance(values),
              "preset_values": getattr(params, "preset_values", {})}
    (run_dir / "params.json").write_text(json.dumps(record, indent=2) + "\n")
    from lab.models.loader import LOAD_LOG_ENV

    # every model the run loads, here and in its child processes, goes on record beside its parameters (issue 51)
    os.environ[LOAD_LOG_ENV] = str(run_dir / MODELS_LOADED)
    if os.environ.get("LAB_RUN_DIR"):  # under `lab run`: where the run's time goes, by function (issue 52)
        from .profile import start_sampling

        start_sampling()
    return Run(notebook, run_dir, values)


def json_safe(obj):
    """`obj` (dicts, lists, tuples, scalars) with every NaN or infinite float replaced by None: strict JSON, so
    that one NaN from a failed check costs that value, not the whole result file."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
