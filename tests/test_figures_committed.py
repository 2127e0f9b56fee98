"""Every figure of every committed reference run, redrawn from the run's own files (`lab.studies.findings.figures`)
and put through the plot standard's checks (`lab.figures.check`), so that a figure a reader opens in results/ or
the report keeps the standard, not only the smoke runs' figures. A committed figure that cannot be redrawn is named
here with the reason (its run predates the tables it needs); the entry fails once that run is superseded."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lab.figures.check import problems  # noqa: E402
from lab.claims.gather import latest_reference_runs  # noqa: E402
from lab.studies.findings import MODULES, RunFiles, figures  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
RUNS = latest_reference_runs(RESULTS)

# (notebook, run) -> {figure: why it cannot be redrawn}; the figure as committed is what its run drew
NOT_REDRAWABLE: dict[tuple[str, str], dict[str, str]] = {}  # none since 06's run 16660b kept its load tables

CASES = [(nb, png.stem) for nb in MODULES for png in sorted(RUNS[nb].glob("*.png"))]


def test_every_exemption_names_a_current_reference_run():
    assert all(RUNS[nb].name == run for nb, run in NOT_REDRAWABLE), "a superseded run: drop its entry"


@pytest.mark.parametrize("notebook, stem", CASES, ids=[f"{nb[:2]}-{stem}" for nb, stem in CASES])
def test_a_committed_figure_redrawn_from_its_run_keeps_the_plot_standard(notebook, stem):
    exempt = NOT_REDRAWABLE.get((notebook, RUNS[notebook].name), {})
    if stem in exempt:
        with pytest.raises(FileNotFoundError):  # the reason still holds
            figures(notebook)[stem](RunFiles(RUNS[notebook]))
        return
    assert stem in figures(notebook), f"{notebook}: no way to redraw {stem}.png from its run's files"
    fig = figures(notebook)[stem](RunFiles(RUNS[notebook]))
    try:
        assert problems(fig) == []
    finally:
        plt.close(fig)
