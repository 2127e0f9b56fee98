"""Each study's finding (`lab.studies.findings`): one plain sentence from its template, filled by its latest
reference run, under 200 characters, one verdict word, intervals said for what they are and ranges printed as
ranges; its key figure's title is that sentence and it draws the claim's line or band, labelled."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from lab.claims.gather import latest_reference_runs  # noqa: E402
from lab.studies.findings import FIGURE, MAX_CHARS, MODULES, finding_of, key_figure, sentence, stated  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
RUNS = latest_reference_runs(RESULTS)
VERDICTS = {"holds", "wrong", "wrong by rounding", "wrong by argument", "not distinguishable", "not checkable here",
            "not yet checked"}


@pytest.mark.parametrize("notebook", list(MODULES))
def test_the_finding_is_one_plain_sentence_with_one_verdict_word(notebook):
    s = stated(notebook, RUNS[notebook], pd.read_csv(RESULTS / "CLAIMS.csv", dtype=str).fillna(""))
    assert len(s.sentence) <= MAX_CHARS, s.sentence
    assert s.sentence.endswith(".") and s.sentence.count(". ") == 0, s.sentence  # one sentence
    assert "[" not in s.sentence, s.sentence  # an interval is said ("95% over 25 prompts: 1.30-1.59"), not bracketed
    assert "{" not in s.sentence and "nan" not in s.sentence.lower(), s.sentence  # every slot filled
    assert "ledger" not in s.sentence and "in this setting;" not in s.sentence  # no stacked verdicts
    assert (s.verdict in VERDICTS) if finding_of(notebook).claim else s.verdict == ""


@pytest.mark.parametrize("notebook", list(MODULES))
def test_the_key_figure_is_titled_with_the_finding_and_draws_the_claim_labelled(notebook):
    fig = key_figure(notebook, RUNS[notebook])
    try:
        assert fig._suptitle.get_text().replace("\n", " ") == sentence(notebook, RUNS[notebook])
        labels = [a.get_label() for ax in fig.axes for a in [*ax.lines, *ax.patches, *ax.collections]]
        assert any(label.startswith(("article", "folklore", "half the miss", "'safe'")) for label in labels), labels
        assert (RUNS[notebook] / f"{FIGURE}.png").exists(), "run `lab docs` to draw the committed run's key figure"
    finally:
        plt.close(fig)


def test_a_sentence_over_the_limit_is_refused_by_name(monkeypatch):
    from lab.studies import findings
    from lab.studies.findings import engine_tour

    long = engine_tour.FINDING.__class__(**{**engine_tour.FINDING.__dict__, "template": "x" * (MAX_CHARS + 1)})
    monkeypatch.setattr(engine_tour, "FINDING", long)
    with pytest.raises(ValueError, match=f"00_engine_tour: the finding is {MAX_CHARS + 1} characters"):
        findings.sentence("00_engine_tour", RUNS["00_engine_tour"])


def test_where_a_measurement_lies_against_the_article_is_computed():
    from lab.studies.findings.words import against

    assert against(1.76, 1.79, 2.0, 2.5) == "under"
    assert against(50.3, 60.5, 30, 50) == "over"
    assert against(0.48, 1.46, 0, 1) == "overlapping"
    assert against(1.4, 57.9, 20, 30) == "spanning"
    assert against(31, 35, 30, 50) == "inside"
