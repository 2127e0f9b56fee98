"""Widget panels for the study notebooks: controls and an output that redraws, with a self-check.

A panel is ipywidgets' `interactive_output` around one of the study's plain functions, so the widget and a
papermill rerun call the same code. Every redraw's output (printed text, displayed tables, matplotlib figures)
is captured, fingerprinted and shown, which gives a headless test something to compare: with
`$LAB_WIDGET_CHECK` set (the notebook tests set it), building a panel moves each control once through the
ipywidgets API (assigning `.value` or `.index` fires the same observers a slider drag does in a browser) to a
value other than its default, and records in the run directory's `widget_checks.json` whether the output
changed and whether the callback raised.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHECK_ENV = "LAB_WIDGET_CHECK"
CHECKS_FILE = "widget_checks.json"


def _fingerprint(captured, images: list[bytes]) -> str:
    """A digest of what one redraw showed: its text, every rich output and every figure's pixels."""
    h = hashlib.sha256(captured.stdout.encode())
    for out in captured.outputs:
        for mime in sorted(out.data):
            h.update(mime.encode() + str(out.data[mime]).encode())
    for png in images:
        h.update(png)
    return h.hexdigest()


def _render(show, renders: list, **values) -> None:
    """Call `show`, capture and fingerprint what it shows, then show it (inside the panel's Output)."""
    import io

    import matplotlib.pyplot as plt
    from IPython.display import display
    from IPython.utils.capture import capture_output

    error = None
    with capture_output() as captured:
        try:
            show(**values)
        except Exception as e:  # recorded for the check, then re-raised into the Output widget
            error = e
    figures = [plt.figure(n) for n in plt.get_fignums()]
    images = []
    for fig in figures:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        images.append(buf.getvalue())
    renders.append({"digest": _fingerprint(captured, images), "error": None if error is None else repr(error)})
    captured.show()
    for fig in figures:
        display(fig)
        plt.close(fig)
    if error is not None:
        raise error


def other_value(control):
    """A value of `control` other than its current one: the next option, the other end of a slider's range,
    the other state of a checkbox."""
    if hasattr(control, "options"):
        n = len(control.options)
        if isinstance(control.value, tuple):  # a multiple selection: a set of options it does not hold
            return {"index": (0,) if control.index != (0,) else ((1,) if n > 1 else ())}
        if n < 2:
            raise ValueError(f"control {control.description!r} has {n} option(s): nothing to move it to")
        return {"index": (control.index + 1) % n}
    if hasattr(control, "min") and hasattr(control, "max"):
        return {"value": control.min if control.value != control.min else control.max}
    if isinstance(control.value, bool):
        return {"value": not control.value}
    raise TypeError(f"no rule to move a {type(control).__name__} widget")


def self_check(controls: dict, renders: list) -> list[dict]:
    """Move each control once and record whether the output changed (controls stay where they were moved)."""
    results = []
    for name, control in controls.items():
        before, count = renders[-1]["digest"] if renders else None, len(renders)
        old, error = control.value, None
        try:
            for attr, value in other_value(control).items():
                setattr(control, attr, value)
        except Exception as e:  # an unmovable control or a callback that raised (outside a kernel, the Output
            error = repr(e)     # widget does not swallow it): a failed check, not a crash
        new = renders[count:]
        results.append({"control": name, "widget": type(control).__name__, "from": repr(old),
                        "to": repr(control.value), "redraws": len(new),
                        "changed": bool(new) and new[-1]["digest"] != before,
                        "error": error or next((r["error"] for r in new if r["error"]), None)})
    return results


def _record(checks: list[dict], title: str) -> None:
    path = Path(os.environ.get("LAB_RUN_DIR") or ".") / CHECKS_FILE
    existing = json.loads(path.read_text()) if path.exists() else []
    existing.append({"panel": title, "controls": checks})
    path.write_text(json.dumps(existing, indent=2) + "\n")


def panel(show, controls: dict, title: str = ""):
    """`show(**values)` redrawn whenever one of `controls` (name -> widget) changes; returns the VBox to
    display. Under `$LAB_WIDGET_CHECK` the panel checks itself once it is built (see the module docstring)."""
    import ipywidgets as w

    renders: list[dict] = []
    for name, control in controls.items():
        if not control.description:
            control.description = name
    out = w.interactive_output(lambda **values: _render(show, renders, **values), controls)
    box = w.VBox([*controls.values(), out])
    if os.environ.get(CHECK_ENV):
        _record(self_check(controls, renders), title or getattr(show, "__name__", "panel"))
    return box
