"""The plot standard's mechanical checks (`lab.figure_check`): each rule fails a figure that breaks it and passes
one that keeps it, and `Run.save_figure` records them."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lab.figure_check import problems  # noqa: E402
from lab.plots import PALETTE, legend_outside  # noqa: E402


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
])
def test_each_rule_fails_a_figure_that_breaks_it(spoil, found):
    fig = _good()
    spoil(fig, fig.axes[0])
    assert any(found in p for p in problems(fig)), problems(fig)


def test_a_suptitle_or_a_shared_x_label_serves_every_panel():
    fig, (a, b) = plt.subplots(2, 1, sharex=True)
    a.plot([1, 2], [1, 2], color=PALETTE[0])
    b.plot([1, 2], [2, 1], color=PALETTE[1])
    a.set_ylabel("tokens/s")
    b.set(ylabel="seconds", xlabel="concurrency (requests)")
    fig.suptitle("Throughput and latency against concurrency")
    assert problems(fig) == []


def test_save_figure_records_every_figure_and_its_problems(tmp_path, monkeypatch):
    from lab.runs import start_run

    monkeypatch.setenv("LAB_RUN_DIR", str(tmp_path / "run"))
    run = start_run("figure_check_test", {"PRESET": "smoke"})
    run.save_figure("good", _good())
    bad = _good()
    bad.axes[0].set_ylabel("")
    run.save_figure("bad", bad)
    checks = json.loads((run.dir / "figure_checks.json").read_text())
    assert checks["good"] == [] and any("no y label" in p for p in checks["bad"])
