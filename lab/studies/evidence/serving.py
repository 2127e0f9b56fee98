"""Notebook 06's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`).

The notebook calls `serving_claims.claims_table(prefix, shapes, params.SYSTEM_PROMPT, where, serving)` with
`serving = [timestamp_row(dynamic)] + serving_rows(chunked, ramp, params.KNEE_GAIN, served, op, budgets)`:

- prefix, shapes, dynamic, chunked: prefix_caching.csv, length_shapes.csv, dynamic_prefix.csv and
  chunked_prefill.csv as saved;
- ramp: the ramp's passes, ramp.csv without its last row (the notebook saves the ramp with the operating point's
  run appended, `repeat` empty and `operating point` True; `serving_rows` is given the ramp without it);
- op: the operating concurrency (metrics.json's `operating_concurrency`), and the device in words: the notebook
  prints `resolve_device(DEVICE)`, which is DEVICE itself unless it is "auto", then "cuda" where the run had a
  GPU (params.json's `gpu`) and "cpu" where it did not;
- dynamic's `cached_share_of_system_prompt_%` is the study's 100 min(cached_tokens, SYSTEM_PROMPT) / SYSTEM_PROMPT
  (`serving.dynamic_prefix`), recomputed here from the cached tokens the engine reported, so the share moves with
  the count it is computed from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.studies.serving import measure as study, claims as claims_mod

SHARE = "cached_share_of_system_prompt_%"


def _params(run_dir: Path) -> study.ServingParams:
    return run_parameters(run_dir, study.ServingParams)


def _device(run_dir: Path) -> str:
    """What `resolve_device(DEVICE)` printed in the run: DEVICE, or for "auto" the device it found."""
    record = json.loads((run_dir / "params.json").read_text())
    device = record["parameters"].get("DEVICE", "auto")
    return device if device != "auto" else ("cuda" if record.get("gpu") else "cpu")


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    ramp = pd.read_csv(run_dir / "ramp.csv")
    passes = ramp[ramp["repeat"].notna()].drop(columns=["operating point"], errors="ignore").reset_index(drop=True)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"params": _params(run_dir), "device": _device(run_dir), "op": int(metrics["operating_concurrency"]),
            "prefix": pd.read_csv(run_dir / "prefix_caching.csv"),
            "shapes": pd.read_csv(run_dir / "length_shapes.csv"),
            "dynamic": pd.read_csv(run_dir / "dynamic_prefix.csv").drop(columns=[SHARE]),
            "chunked": pd.read_csv(run_dir / "chunked_prefill.csv"),
            "ramp": passes}


def with_share(dynamic: pd.DataFrame) -> pd.DataFrame:
    """`dynamic` with the cached share of the system prompt, as `serving.dynamic_prefix` computes it."""
    spt = dynamic["system_prompt_tokens"]
    return dynamic.assign(**{SHARE: 100 * dynamic["cached_tokens"].clip(upper=spt) / spt})


def table(inputs: Inputs) -> pd.DataFrame:
    p, op = inputs["params"], inputs["op"]
    served = f"{p.MODEL} on {inputs['device']}"
    rows = claims_mod.serving_rows(inputs["chunked"], inputs["ramp"], p.KNEE_GAIN, served, op,
                                   (p.CHUNK_TOKENS, p.MAX_MODEL_LEN))
    return claims_mod.claims_table(inputs["prefix"], inputs["shapes"], p.SYSTEM_PROMPT, f"{served}, {op} in flight",
                                   [claims_mod.timestamp_row(with_share(inputs["dynamic"]))] + rows)


REBUILD = Rebuild(
    notebook="06_serving_ttft",
    load=load,
    table=table,
    # Settings: each run's index (repeat), the load's shape (concurrency, requests, the system prompt's tokens,
    # the lengths' P50s, the batched-token budget), and where the timestamp went (inserted_at_token, the prompt's
    # tokens). Measured and perturbed: every latency, throughput, goodput, SLO share and hit rate, the ok /
    # failed / cancelled counts, and the tokens the prefix cache served with the timestamp in (cached_tokens).
    settings={"prefix": ("repeat", "system_prompt_tokens", "requests"),
              "shapes": ("repeat", "input_p50", "output_p50", "requests"),
              "chunked": ("repeat", "max_num_batched_tokens", "requests"),
              "ramp": ("repeat", "concurrency", "requests"),
              "dynamic": ("inserted_at_token", "system_prompt_tokens", "prompt_tokens")},
    # The parameters (the model, KNEE_GAIN, the budgets) and the device's name are not evidence; the operating
    # concurrency (`op`, an int) is a setting of the load, which no perturbation touches.
    fixed=("params", "device", "op"),
)
