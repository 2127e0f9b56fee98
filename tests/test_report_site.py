"""`lab report` (lab.publish.report.build) outside the browser: a rebuilt site keeps only the rendered notebooks of the runs
it shows (the browser test, tests/browser/test_report.py, checks what a reader sees)."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_a_rebuilt_report_drops_the_notebooks_of_superseded_runs(tmp_path):
    from lab.publish.report import build
    from lab.workflow.index import list_runs

    out = tmp_path / "report"
    old = out / "notebooks" / "00_engine_tour__20200101T000000.000000Z-000000.html"
    old.parent.mkdir(parents=True)
    old.write_text("<html>an earlier run</html>")
    build(RESULTS, out)
    latest = {r["notebook"]: r["dir"] for r in list_runs(RESULTS) if r["preset"] == "reference"}
    assert not old.exists()
    assert {p.name for p in (out / "notebooks").glob("*.html")} == {
        f"{nb}__{run.name}.html" for nb, run in latest.items() if any(run.glob("*.ipynb"))}


def test_the_committed_report_is_what_lab_report_builds_now():
    """The committed site's pages against what `lab report` would write from the committed runs: a report built
    before a rerun (issue 49: it showed 1.42x where the docs said 1.20x) fails here."""
    from lab.publish.report import page, summary

    out = RESULTS / "report"
    assert (out / "index.html").read_text() == page(RESULTS, out), "run `lab report` and commit results/report"
    assert (out / "summary.html").read_text() == summary(RESULTS, out), "run `lab report` and commit results/report"


def test_a_report_of_other_runs_differs(tmp_path):
    """The check above can fail: a results tree whose 00 run says otherwise gives another page."""
    import shutil

    from lab.claims.gather import latest_reference_runs
    from lab.publish.report import page

    results = tmp_path / "results"
    results.mkdir()
    for entry in RESULTS.iterdir():
        (results / entry.name).symlink_to(entry)
    assert page(results, results / "report") == (RESULTS / "report" / "index.html").read_text()  # the same runs
    run = latest_reference_runs(RESULTS)["00_engine_tour"]
    (results / "00_engine_tour").unlink()
    copy = results / "00_engine_tour" / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*.ipynb"))
    table = (copy / "ttft_hit_vs_miss.csv").read_text().replace(",miss,", ",miss,1", 1)
    (copy / "ttft_hit_vs_miss.csv").write_text(table)
    assert page(results, results / "report") != (RESULTS / "report" / "index.html").read_text()


def test_the_report_opens_with_every_finding_and_its_key_figure():
    from lab.publish.headlines import STUDIES
    from lab.publish.report import page

    text = page(RESULTS)
    opening = text[text.index('id="findings"'):text.index('<h2 id="00_engine_tour"')]
    assert opening.count('class="finding"') == len(STUDIES) and opening.count("finding.png") == len(STUDIES)
