"""Notebook 09's measured tables made up at about the reference run's figures, so its claims table builds without an
engine or fresh processes; each can be bent (a slower warm-up run, a faster disk) to see a verdict move."""

import pandas as pd

from lab.studies.ttft_claims import measure as study

WEIGHTS_BYTES = 538e6
RUN_DRIFT = (1.0, 1.08, 0.95)  # three runs, the machine a little faster or slower in each


def sweep_raw(p: study.TTFTParams, fixed: float = 0.03, prefill: float = 0.66, drift=RUN_DRIFT) -> pd.DataFrame:
    """`ttft_runs`' rows for the hit-rate sweep: TTFT = (fixed + prefill x the uncached share) x the run's drift."""
    return pd.DataFrame([{"label": h, "repeat": r, "cached": int(p.SWEEP_TOKENS * h / 100),
                          "ttft_s": d * (fixed + prefill * (1 - h / 100)), "hit_tokens": int(p.SWEEP_TOKENS * h / 100)}
                         for r, d in enumerate(drift) for h in p.HIT_RATES])


# one value per case and quantity, about the reference run's; a repeat scales them by RUN_DRIFT
COLD = {"python -c pass": {"process_wall_s": 0.022},
        "read the weights file": {"cold_read_s": 1.16, "warm_read_s": 0.029},
        "cold file, no warm-up": {"load_s": 3.31, "resident_before": 0.0, "import_s": 1.14, "first_ttft_s": 0.075,
                                  "to_first_token_s": 4.63, "second_ttft_s": 0.071},
        "warm file, no warm-up": {"load_s": 2.75, "resident_before": 1.0, "import_s": 1.06, "first_ttft_s": 0.079,
                                  "to_first_token_s": 3.93, "second_ttft_s": 0.070},
        "warm file, warm-up request": {"load_s": 2.72, "resident_before": 1.0, "import_s": 1.06,
                                       "first_ttft_s": 0.0788, "to_first_token_s": 3.82, "second_ttft_s": 0.066}}


def cold_raw(override: dict | None = None, drift=RUN_DRIFT) -> pd.DataFrame:
    """`cold_start`'s rows, one per case and repeat; `override` maps (case, quantity) to one value per repeat."""
    override = override or {}
    rows = []
    for r, d in enumerate(drift):
        for case, q in COLD.items():
            values = {k: v * d for k, v in q.items()}
            values.update({k: vs[r] for (c, k), vs in override.items() if c == case})
            rows.append({"case": case, "repeat": r, **values})
    return pd.DataFrame(rows)


def claims(p: study.TTFTParams | None = None, sweep: pd.DataFrame | None = None,
           cold: pd.DataFrame | None = None) -> pd.DataFrame:
    """Notebook 09's claims table from the made-up tables (or the ones given)."""
    from lab.studies.ttft_claims.table import claims_table

    p = p or study.TTFTParams()
    first = pd.DataFrame({"ttft median s": [0.25, 0.05, 0.024], "hit tokens": [0, 448, 496]})
    sweep = study.sweep_table(p, sweep_raw(p)) if sweep is None else sweep
    cold = cold_raw() if cold is None else cold
    return claims_table(p, study.flops_table(p), first, study.int8_table(p), sweep, study.cold_summary(cold), cold,
                        WEIGHTS_BYTES)
