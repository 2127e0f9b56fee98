"""`lab.workflow.widgets`: the panel's self-check moves every kind of control and tells a redraw that changed the
output from one that did not (the notebook tests rely on it to check every widget callback)."""

import json

import ipywidgets as w
import pytest

from lab.workflow.widgets import CHECK_ENV, CHECKS_FILE, other_value, panel


@pytest.mark.parametrize("control, attr", [
    (w.IntSlider(value=5, min=1, max=9), "value"),
    (w.IntSlider(value=1, min=1, max=9), "value"),
    (w.FloatSlider(value=0.5, min=0.0, max=1.0), "value"),
    (w.Dropdown(options=["a", "b", "c"], value="c"), "index"),
    (w.SelectionSlider(options=[16, 64, 256], value=256), "index"),
    (w.SelectMultiple(options=["x", "y"]), "index"),
    (w.SelectMultiple(options=["x", "y"], value=("x",)), "index"),
    (w.Checkbox(value=False), "value"),
])
def test_other_value_moves_every_control_kind(control, attr):
    before = control.value
    setattr(control, attr, other_value(control)[attr])
    assert control.value != before


def test_a_control_with_one_option_cannot_be_moved():
    with pytest.raises(ValueError, match="1 option"):
        other_value(w.Dropdown(options=["only"]))


def _checks(tmp_path, show, controls):
    panel(show, controls, "t")
    return json.loads((tmp_path / CHECKS_FILE).read_text())[-1]["controls"]


def test_self_check_records_changed_unchanged_and_failing_callbacks(tmp_path, monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "1")
    monkeypatch.setenv("LAB_RUN_DIR", str(tmp_path))
    checks = _checks(tmp_path, lambda n, kind: print(f"{kind}: {n * n}"),
                     {"n": w.IntSlider(value=3, min=1, max=5), "kind": w.Dropdown(options=["square", "area"])})
    assert [(c["control"], c["changed"], c["error"]) for c in checks] == [("n", True, None), ("kind", True, None)]
    assert checks[0]["from"] == "3" and checks[0]["to"] == "1"

    ignored = _checks(tmp_path, lambda n: print("the same text whatever n is"), {"n": w.IntSlider(value=3, max=5)})
    assert ignored[0]["redraws"] == 1 and ignored[0]["changed"] is False

    def fails_off_default(n):
        if n != 3:
            raise RuntimeError("boom")
        print(n)

    failing = _checks(tmp_path, fails_off_default, {"n": w.IntSlider(value=3, max=5)})
    assert "boom" in failing[0]["error"]


def test_without_the_check_variable_a_panel_only_builds(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    monkeypatch.setenv("LAB_RUN_DIR", str(tmp_path))
    calls = []
    box = panel(lambda n: calls.append(n), {"n": w.IntSlider(value=2)})
    assert isinstance(box, w.VBox) and calls == [2] and not (tmp_path / CHECKS_FILE).exists()
