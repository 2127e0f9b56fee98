"""The plot standard (docs/plotting.md), checked where a machine can: `problems(fig)` lists what a figure breaks.

Checked per panel (an axes that draws data): a title (its own or the figure's), an x and a y label (either may
sit on another panel that shares the axis, as in a row or column of small multiples), at most `MAX_SERIES` labelled
series, no colour repeated among them (greys and black are left out: reference lines may share them, told apart by
line style), no legend over the panel's data (a data point, bar or line vertex inside the legend's box), and no
two tick labels on one axis that overlap. What needs reading (that a label names its unit, that the order of
categories means something, that an interval is drawn wherever the table has one) is left to the reader.
`lab.runs.Run.save_figure` records the problems of every figure it saves in the run's `figure_checks.json`, and the
smoke test of every notebook fails on any.
"""

from __future__ import annotations

import numpy as np

MAX_SERIES = 8


def _has_data(ax) -> bool:
    return bool(ax.lines or ax.collections or ax.patches or ax.images) and ax.get_visible()


def _is_grey(colour) -> bool:
    r, g, b = colour[:3]
    return abs(r - g) < 0.02 and abs(g - b) < 0.02


def _series(ax) -> list[tuple[str, tuple]]:
    """(label, RGB) of each labelled series the panel draws: lines, collections (scatter, fill) and bar groups."""
    from matplotlib.colors import to_rgb

    out = []
    for artist in list(ax.lines) + list(ax.collections) + list(ax.containers):
        label = artist.get_label() if hasattr(artist, "get_label") else ""
        if not label or label.startswith("_"):
            continue
        if hasattr(artist, "patches") and artist.patches:  # a bar container
            colour = artist.patches[0].get_facecolor()
        elif hasattr(artist, "get_color") and not hasattr(artist, "get_facecolor"):
            colour = artist.get_color()
        elif hasattr(artist, "lines"):  # an errorbar container: its marker line
            colour = artist.lines[0].get_color()
        else:
            faces = artist.get_facecolor()
            colour = faces[0] if len(faces) else artist.get_edgecolor()[0]
        out.append((label, tuple(round(c, 3) for c in to_rgb(colour))))
    return out


def _data_points(ax) -> np.ndarray:
    """The panel's data in display coordinates: line vertices, collection offsets, bar corners."""
    pts = []
    for line in ax.lines:
        xy = np.asarray(line.get_xydata(), dtype=float)
        if xy.size and line.get_label() and not _is_reference(line, ax):
            pts.append(line.get_transform().transform(xy))
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), dtype=float)
        if offsets.size:
            pts.append(coll.get_offset_transform().transform(offsets))
    for patch in ax.patches:
        ext = patch.get_window_extent()
        if np.isfinite(ext.bounds).all() and ext.width > 0:
            pts.append(np.array([[ext.x0, ext.y1], [ext.x1, ext.y1], [(ext.x0 + ext.x1) / 2, ext.y1]]))
    pts = [p[np.isfinite(p).all(axis=1)] for p in pts]
    return np.concatenate(pts) if pts else np.zeros((0, 2))


def _is_reference(line, ax) -> bool:
    """An axhline / axvline (a line spanning the panel in axes coordinates): a reference, not data."""
    return line.get_transform() != ax.transData and len(line.get_xydata()) == 2


def _ticks_collide(ax, renderer, axis: str) -> bool:
    """Whether two neighbouring tick labels overlap, each taken as its text's rectangle turned by the label's
    rotation about the centre of its drawn box (matplotlib's default rotation mode): two parallel rectangles
    overlap when their centres are closer than half their summed sizes both along the text and across it."""
    labels = [t for t in (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())
              if t.get_visible() and t.get_text()]
    rects = []
    for t in labels:
        box, angle = t.get_window_extent(renderer), t.get_rotation()
        t.set_rotation(0)
        flat = t.get_window_extent(renderer)
        t.set_rotation(angle)
        rects.append(((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2, flat.width, flat.height, np.radians(angle)))
    rects.sort(key=lambda r: r[0] if axis == "x" else r[1])
    for (x1, y1, w1, h1, a), (x2, y2, w2, h2, _) in zip(rects, rects[1:]):
        along = abs((x2 - x1) * np.cos(a) + (y2 - y1) * np.sin(a))
        across = abs(-(x2 - x1) * np.sin(a) + (y2 - y1) * np.cos(a))
        if along < (w1 + w2) / 2 - 1 and across < (h1 + h2) / 2 - 1:
            return True
    return False


def _panel_problems(fig, ax, renderer, where: str) -> list[str]:
    out = []
    if not ax.get_title() and not ax.get_title(loc="left") and not (fig._suptitle and fig._suptitle.get_text()):
        out.append(f"{where}: no title")
    if not any(a.get_ylabel() for a in ax.get_shared_y_axes().get_siblings(ax)):
        out.append(f"{where}: no y label")
    if not any(a.get_xlabel() for a in ax.get_shared_x_axes().get_siblings(ax)):
        out.append(f"{where}: no x label")
    series = _series(ax)
    if len(series) > MAX_SERIES:
        out.append(f"{where}: {len(series)} series in one panel (at most {MAX_SERIES})")
    seen: dict[tuple, str] = {}
    for label, colour in series:
        if _is_grey(colour):
            continue
        if colour in seen:
            out.append(f"{where}: {label!r} repeats the colour of {seen[colour]!r}")
        seen.setdefault(colour, label)
    legend = ax.get_legend()
    if legend is not None and legend.get_visible():
        box, pts = legend.get_window_extent(renderer), _data_points(ax)
        inside = (pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)
        if inside.any():
            out.append(f"{where}: the legend covers {int(inside.sum())} data point(s)")
    for axis in ("x", "y"):
        if _ticks_collide(ax, renderer, axis):
            out.append(f"{where}: {axis} tick labels overlap")
    return out


def problems(fig) -> list[str]:
    """What `fig` breaks of the plot standard's mechanical rules, one line each ("panel 2 (KL per domain): no x
    label"); empty when it keeps them all."""
    if not hasattr(fig.canvas, "get_renderer"):  # a bare `Figure` has no drawing canvas until given one
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for i, ax in enumerate([a for a in fig.axes if _has_data(a)], 1):
        out += _panel_problems(fig, ax, renderer, f"panel {i} ({ax.get_title() or 'untitled'})")
    return out
