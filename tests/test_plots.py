"""lab.figures.style.error_extents: error bars from points and interval ends, never negative, refusing an interval that
misses its point; and notebook 02's pass-rate figure, which crashed on a 0/n rate (issue 33)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from lab.eval.sensitive import CATEGORIES  # noqa: E402
from lab.stats.intervals import proportion, wilson  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _pixels(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).copy()


def test_zero_of_n_gives_non_negative_extents_that_matplotlib_accepts():
    from lab.figures.style import error_extents

    points = [0 / 12, 5 / 12, 12 / 12]
    bounds = [wilson(k, 12) for k in (0, 5, 12)]
    # The rounding residue the old Wilson code left (2.8e-17 above a point of 0) is clamped, not refused.
    lows, highs = [2.775558e-17, bounds[1][0], bounds[2][0]], [b[1] for b in bounds]
    err = error_extents(points, lows, highs)
    assert err.shape == (2, 3) and (err >= 0).all() and err[0, 0] == 0.0 and err[1, 2] == 0.0
    fig, ax = plt.subplots()
    ax.errorbar(range(3), points, yerr=err, capsize=2)
    ax.bar(range(3), points, yerr=100 * err)
    ax.errorbar(points, range(3), xerr=err)
    fig.canvas.draw()


def test_scalars_series_and_a_scale():
    from lab.figures.style import error_extents

    np.testing.assert_array_equal(error_extents(2.0, 1.5, 3.0), [[0.5], [1.0]])
    s = pd.Series([0.2, 0.5], index=["a", "b"])
    np.testing.assert_allclose(error_extents(s, s - 0.1, s + 0.2, scale=100), [[10, 10], [20, 20]])


def test_an_interval_that_misses_its_point_names_the_row():
    from lab.figures.style import error_extents

    with pytest.raises(ValueError, match=r"'int4 batch 32'.*1\.5.*\[1\.6, 2"):
        error_extents([2.0, 1.5], [1.9, 1.6], [2.1, 2.0], labels=["int4 batch 1", "int4 batch 32"])
    with pytest.raises(ValueError, match="row 1"):  # no labels: its position
        error_extents([2.0, 2.5], [1.9, 2.0], [2.1, 2.4])
    # a miss within rounding of the point is not a miss
    assert (error_extents([1e6], [1e6 + 1e-4], [1e6 + 1]) >= 0).all()


def test_nan_bounds_are_no_bar():
    from lab.figures.style import error_extents

    err = error_extents([0.3, 0.6], [np.nan, 0.5], [np.nan, 0.8])
    assert np.isnan(err[:, 0]).all() and np.allclose(err[:, 1], [0.1, 0.2])
    # matplotlib draws a NaN extent as nothing: the same pixels as the point drawn without an error bar
    with_nan, without = plt.subplots()[0], plt.subplots()[0]
    with_nan.axes[0].errorbar([0, 1], [0.3, 0.6], yerr=err, fmt="o", color="k", capsize=3)
    without.axes[0].errorbar([0], [0.3], fmt="o", color="k", capsize=3)
    without.axes[0].errorbar([1], [0.6], yerr=err[:, 1:], fmt="o", color="k", capsize=3)
    for fig in (with_nan, without):
        fig.axes[0].set(xlim=(-1, 2), ylim=(0, 1))
    assert np.array_equal(_pixels(with_nan), _pixels(without))
    bars = plt.subplots()[0]
    bars.axes[0].bar([0, 1], [0.3, 0.6], yerr=err)
    bars.canvas.draw()


def _grid() -> pd.DataFrame:
    """Notebook 02's grid: an unquantized row, then a row per method and configuration, each with every
    category's pass rate and its Wilson interval; long context run by the first two rows only (NaN after)."""
    rows = []
    for method, config, passed in (("unquantized", "", 12), ("rtn", "w4 g128", 0), ("gptq", "w4 g128", 6),
                                   ("rtn", "w3 g128", 3)):
        row = {"method": method, "config": config}
        for c in CATEGORIES:
            if c == "long_context" and len(rows) > 1:
                row[f"pass_{c}"] = float("nan")
                continue
            row.update(proportion(passed, 12).columns(f"pass_{c}"))
        rows.append(row)
    return pd.DataFrame(rows)


def test_the_pass_rate_figure_draws_zero_and_full_rates():
    from lab.studies.quant_accuracy.plots import plot_pass_rates

    grid = _grid()
    assert (grid["pass_code"] == 0).any() and (grid["pass_code"] == 1).any()
    fig = plot_pass_rates(grid)  # raised "'yerr' must not contain negative values" on 0 of 12
    fig.canvas.draw()
    # a grid saved before the fix carries the residue in its low column: it draws too
    residue = grid.copy()
    residue.loc[residue["pass_code"] == 0, "pass_code_low"] = 2.775558e-17
    plot_pass_rates(residue).canvas.draw()
