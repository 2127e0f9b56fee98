"""The README's studies table and each study doc's opening are generated from the latest reference runs
(`lab.publish.study_docs`, `lab.publish.headlines`): a number there that no longer matches its run fails here."""

import shutil

import pytest

from lab.publish.headlines import STUDIES, headline
from lab.claims.gather import latest_reference_runs
from lab.publish.study_docs import BEGIN, END, ROOT, doc_path, sync


def test_the_committed_readme_and_docs_match_the_latest_reference_runs():
    assert sync(check=True) == [], "run `lab docs` to regenerate them from the latest reference runs"


def test_every_study_doc_opens_with_its_question_answer_and_plot_and_names_no_file_hash():
    runs = latest_reference_runs(ROOT / "results")
    for nb in STUDIES:
        text = doc_path(nb).read_text()
        head, _, rest = text.partition("\n")
        assert head.startswith("# ") and rest.lstrip().startswith(BEGIN), nb  # the answer comes first
        block = rest.split(END)[0]
        assert "**Question.**" in block and "**Finding.**" in block and runs[nb].name in block, nb
        assert "![" in block, f"{nb}: no key plot in the opening"
        assert not any(h in text for h in ("6360c6a068e5cdc2", "2e53536036edbb4f", "1a250c76ca76c1c9")), nb


def test_a_stale_number_fails_the_check(tmp_path):
    """Copy the README and docs, change one number in a generated block: the check names that file."""
    (tmp_path / "docs" / "studies").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for nb in STUDIES:
        shutil.copy(doc_path(nb), doc_path(nb, tmp_path))
    (tmp_path / "results").symlink_to(ROOT / "results")  # the docs link their plots by relative path
    assert sync(tmp_path, check=True) == []
    doc = doc_path("04_replay_break_even", tmp_path)
    text = doc.read_text()
    h = headline("04_replay_break_even", latest_reference_runs(ROOT / "results")["04_replay_break_even"])
    first = h.finding.sentence
    doc.write_text(text.replace(first, first.replace(" of ", " of 1", 1)))
    assert sync(tmp_path, check=True) == [doc]


def test_a_newer_quick_run_changes_neither_the_readme_nor_a_doc(tmp_path):
    """`make run` leaves quick runs in results/; the README and the docs quote reference runs only, so `make test`
    after `make run` passes (issue 49: it failed twice)."""
    (tmp_path / "docs" / "studies").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for nb in STUDIES:
        shutil.copy(doc_path(nb), doc_path(nb, tmp_path))
    results = tmp_path / "results"
    results.mkdir()
    for entry in (ROOT / "results").iterdir():
        (results / entry.name).symlink_to(entry)
    nb = "09_ttft_claims"
    (results / nb).unlink()
    (results / nb).mkdir()
    ref = latest_reference_runs(ROOT / "results")[nb]
    (results / nb / ref.name).symlink_to(ref)
    quick = results / nb / "20991231T000000.000000Z-abcdef"  # newer than any reference run
    shutil.copytree(ref, quick, ignore=shutil.ignore_patterns("*.ipynb", "*.png"))
    params = (quick / "params.json").read_text().replace('"PRESET": "reference"', '"PRESET": "quick"')
    (quick / "params.json").write_text(params)
    (quick / "metrics.json").write_text((quick / "metrics.json").read_text().replace("0.", "0.9", 1))
    assert sync(tmp_path, results, check=True) == []


def test_a_key_claim_missing_from_its_run_is_named(tmp_path):
    run = latest_reference_runs(ROOT / "results")["08_parallelism"]
    copy = tmp_path / "results" / "08_parallelism" / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*.ipynb", "*.png"))
    claims = (copy / "claims.csv").read_text().splitlines()
    (copy / "claims.csv").write_text("\n".join(line for line in claims if "all-reduce takes up to 40%" not in line))
    with pytest.raises(ValueError, match="all-reduce takes up to 40%"):
        headline("08_parallelism", copy)
