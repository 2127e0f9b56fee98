"""The plot standard's mechanical checks (`lab.figures.check`): each rule fails a figure that breaks it and passes
one that keeps it, and `Run.save_figure` records them."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lab.figures.check import problems  # noqa: E402
from lab.figures.style import PALETTE, legend_outside  # noqa: E402


def _good():
    fig, ax = plt.subplots()
    for i, colour in enumerate(PALETTE[:3]):
        ax.plot([1, 2, 4], [i, i + 1, i + 3], "o", color=colour, label=f"series {i}")
    ax.axhline(1.0, color="black", ls="--", label="claim")
    ax.set(title="A against B", xlabel="batch (sequences)", ylabel="time (ms)")
    legend_outside(ax)
    return fig


def test_a_figure_that_keeps_the_standard_has_no_problems():
    assert problems(_good()) == []


@pytest.mark.parametrize("spoil, found", [
    (lambda f, ax: ax.set_title(""), "no title"),
    (lambda f, ax: ax.set_xlabel(""), "no x label"),
    (lambda f, ax: ax.set_ylabel(""), "no y label"),
    (lambda f, ax: ax.plot([1, 4], [0, 3], color=PALETTE[0], label="again"), "repeats the colour"),
    (lambda f, ax: [ax.plot([1], [i], "o", color=f"C{i % 10}", label=f"s{i}") for i in range(9)], "series in one"),
    (lambda f, ax: ax.legend(loc="center", bbox_to_anchor=(0.5, 0.5), fontsize=30), "legend covers"),
    (lambda f, ax: ax.set_xticks([1, 1.05, 1.1], ["a long label", "another long one", "and a third"]),
     "tick labels overlap"),
    # issue 49: minor tick labels count (04's crossover.png), an unlabelled series among labelled ones (05's
    # speedup_vs_k.png), one series under another (06's ramp.png: goodput equal to throughput), a numeric axis
    # without a unit, a claim line without a label, a figure title over a panel
    (lambda f, ax: ax.set_xticks([2.0, 2.05], ["a long minor label", "and another"], minor=True),
     "x tick labels overlap"),
    (lambda f, ax: ax.plot([1, 4], [2, 2.5], color=PALETTE[5]), "series without a label"),
    (lambda f, ax: ax.plot([1, 2, 4], [0, 1, 3], "o", color=PALETTE[5], label="same as series 0"),
     "is drawn exactly over 'series 0'"),
    (lambda f, ax: ax.set_ylabel("time"), "the y axis is numeric and its label names no unit"),
    (lambda f, ax: ax.axhline(2.0, color="black", ls=":"), "claim line(s) or band(s) without a label"),
    (lambda f, ax: ax.axhspan(0.5, 1.5, color="0.9"), "claim line(s) or band(s) without a label"),
    (lambda f, ax: f.suptitle("A finding that sits on the data", y=0.6), "title is drawn over a panel"),
])
def test_each_rule_fails_a_figure_that_breaks_it(spoil, found):
    fig = _good()
    spoil(fig, fig.axes[0])
    assert any(found in p for p in problems(fig)), problems(fig)


def test_a_panels_labels_over_its_neighbour_are_found():
    """03's end_to_end.png: long category names on the second of three close panels ran over the first."""
    fig, axes = plt.subplots(1, 2, figsize=(6, 3), gridspec_kw={"wspace": 0.05})
    for i, ax in enumerate(axes):
        ax.barh(["a very long category name", "another long category name"], [1, 2], color=PALETTE[i])
        ax.set(title=f"panel {i}", xlabel="value (%)", ylabel="category")
    assert any("is drawn over panel 1" in p for p in problems(fig)), problems(fig)


def test_a_prediction_in_its_series_colour_and_a_solid_zero_line_need_no_label():
    fig = _good()
    ax = fig.axes[0]
    ax.plot([1, 2, 4], [0.2, 1.2, 3.2], "--", color=PALETTE[0])  # series 0's model, its style told in a key
    ax.axhline(0, color="0.5", lw=0.8)
    assert problems(fig) == []


def test_a_categorical_axis_needs_no_unit():
    fig, ax = plt.subplots()
    ax.barh(["fp8", "int8"], [1.0, 0.1], color=PALETTE[0])
    ax.set(title="perplexity change by format", xlabel="perplexity change (%)", ylabel="KV cache format")
    assert problems(fig) == []


def test_a_suptitle_or_a_shared_x_label_serves_every_panel():
    fig, (a, b) = plt.subplots(2, 1, sharex=True)
    a.plot([1, 2], [1, 2], color=PALETTE[0])
    b.plot([1, 2], [2, 1], color=PALETTE[1])
    a.set_ylabel("tokens/s")
    b.set(ylabel="seconds", xlabel="concurrency (requests)")
    fig.suptitle("Throughput and latency against concurrency")
    assert problems(fig) == []


def test_save_figure_records_every_figure_and_its_problems(tmp_path, monkeypatch):
    from lab.workflow.run import start_run

    monkeypatch.setenv("LAB_RUN_DIR", str(tmp_path / "run"))
    run = start_run("figure_check_test", {"PRESET": "smoke"})
    run.save_figure("good", _good())
    bad = _good()
    bad.axes[0].set_ylabel("")
    run.save_figure("bad", bad)
    checks = json.loads((run.dir / "figure_checks.json").read_text())
    assert checks["good"] == [] and any("no y label" in p for p in checks["bad"])
