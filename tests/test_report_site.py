"""`lab report` (lab.report.build) outside the browser: a rebuilt site keeps only the rendered notebooks of the runs
it shows (the browser test, tests/browser/test_report.py, checks what a reader sees)."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_a_rebuilt_report_drops_the_notebooks_of_superseded_runs(tmp_path):
    from lab.report import build
    from lab.results_index import list_runs

    out = tmp_path / "report"
    old = out / "notebooks" / "00_engine_tour__20200101T000000.000000Z-000000.html"
    old.parent.mkdir(parents=True)
    old.write_text("<html>an earlier run</html>")
    build(RESULTS, out)
    latest = {r["notebook"]: r["dir"] for r in list_runs(RESULTS) if r["preset"] == "reference"}
    assert not old.exists()
    assert {p.name for p in (out / "notebooks").glob("*.html")} == {
        f"{nb}__{run.name}.html" for nb, run in latest.items() if any(run.glob("*.ipynb"))}
