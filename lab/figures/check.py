"""The plot standard (docs/plotting.md), checked where a machine can: `problems(fig)` lists what a figure breaks.

Checked per panel (an axes that draws data): a title (its own or the figure's), an x and a y label (either may
sit on another panel that shares the axis, as in a row or column of small multiples), a unit in the label of every
numeric axis (in parentheses, or a unit word), at most `MAX_SERIES` labelled series, every series labelled where a
panel draws more than one (or drawn in a labelled series' colour: its prediction or fit, whose style the legend
explains once), no series drawn exactly over another (a reader sees one where there are two), no colour
repeated among them (greys and black are left out: reference lines may share them, told apart by line style), no
claim line (a dashed or dotted reference line) or band without a label, no legend over the panel's data (a data
point, bar or line vertex inside the legend's box), no two tick labels on one axis that overlap, major and minor
together, no figure title over a panel, and no panel's axis or tick labels over another panel. What needs reading (that the order of categories means something,
that an interval is drawn wherever the table has one, that the title states the finding) is left to the reader.
`lab.workflow.run.save_figure` records the problems of every figure a run saves in its `figure_checks.json`; the smoke
test of every notebook fails on any, and tests/test_figures_committed.py redraws every figure of every committed
reference run from its files and fails on any.
"""

from __future__ import annotations

import numpy as np

MAX_SERIES = 8


def _has_data(ax) -> bool:
    return bool(ax.lines or ax.collections or ax.patches or ax.images) and ax.get_visible()


def _is_grey(colour) -> bool:
    r, g, b = colour[:3]
    return abs(r - g) < 0.02 and abs(g - b) < 0.02


def _colour(artist) -> tuple | None:
    """A series' RGB (rounded): a bar group's first bar, a line's colour, an errorbar's marker line, or a
    collection's first face (else edge) colour; None where it has none to read."""
    from matplotlib.colors import to_rgb

    try:
        if hasattr(artist, "patches") and artist.patches:  # a bar container
            c = artist.patches[0].get_facecolor()
        elif hasattr(artist, "get_color") and not hasattr(artist, "get_facecolor"):
            c = artist.get_color()
        elif hasattr(artist, "lines"):  # an errorbar container: its marker line
            c = artist.lines[0].get_color()
        else:
            faces = artist.get_facecolor()
            c = faces[0] if len(faces) else artist.get_edgecolor()[0]
        return tuple(round(x, 3) for x in to_rgb(c))
    except (ValueError, IndexError, TypeError):
        return None


def _series(ax) -> list[tuple[str, tuple]]:
    """(label, RGB) of each labelled series the panel draws: lines, collections (scatter, fill) and bar groups."""
    out = []
    for artist in list(ax.lines) + list(ax.collections) + list(ax.containers):
        label = artist.get_label() if hasattr(artist, "get_label") else ""
        if label and not label.startswith("_"):
            out.append((label, _colour(artist)))
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
    """Whether two neighbouring tick labels overlap, major and minor together (a log axis labels both), each taken
    as its text's rectangle turned by the label's rotation about the centre of its drawn box (matplotlib's default
    rotation mode): two parallel rectangles overlap when their centres are closer than half their summed sizes
    both along the text and across it."""
    get = ax.get_xticklabels if axis == "x" else ax.get_yticklabels
    labels = [t for t in [*get(), *get(minor=True)] if t.get_visible() and t.get_text()]
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


# a unit in an axis label: in parentheses ("time (ms)"), or one of these words or signs
UNIT_WORDS = ("%", " x", "tokens", "requests", "sequences", "runs", "bytes", "seconds", "layers", "steps", "batch",
              "count", "per ", "share", "ratio", "rate", "prompts", "rank", "position", "concurrency", "blocks")


def _numeric(labels) -> bool:
    """Whether an axis's tick labels are numbers (a log axis's "$\\mathdefault{10^{2}}$" included)."""
    texts = [t.get_text() for t in labels if t.get_text()]
    for drop in ("$", "\\mathdefault", "{", "}", ",", "\\times"):
        texts = [t.replace(drop, "") for t in texts]
    texts = [t.replace("\u2212", "-").replace("^", "e") for t in texts]
    try:
        [float(t) for t in texts]
    except ValueError:
        return False
    return bool(texts)


def _without_unit(ax, axis: str) -> bool:
    """A numeric axis whose label (its own, or a sharing panel's) names no unit."""
    get = ax.get_xticklabels if axis == "x" else ax.get_yticklabels
    if not _numeric(get()):
        return False
    group = (ax.get_shared_x_axes() if axis == "x" else ax.get_shared_y_axes()).get_siblings(ax)
    label = " ".join(a.get_xlabel() if axis == "x" else a.get_ylabel() for a in group)
    return bool(label) and "(" not in label and not any(w in f" {label}" for w in UNIT_WORDS)


def _in_containers(ax) -> set:
    """The artists an errorbar or bar container owns (the container is the series and carries its label)."""
    owned = set()
    for c in ax.containers:
        children = list(c.get_children())
        if getattr(c, "errorbar", None) is not None:  # a bar's error bars: its own errorbar container
            children += c.errorbar.get_children()
        owned.update(children)
    return owned


def _data_series(ax) -> list:
    """The panel's data series: containers, and lines and collections no container owns, leaving out reference
    lines and bands (spans across the panel) and shaded intervals (a fill between two curves)."""
    from matplotlib.collections import PolyCollection

    owned = _in_containers(ax)
    bars_own = {id(c.errorbar) for c in ax.containers if getattr(c, "errorbar", None) is not None}
    out = [c for c in ax.containers if id(c) not in bars_own]
    out += [ln for ln in ax.lines if ln not in owned and not _is_reference(ln, ax)]
    out += [c for c in ax.collections if c not in owned and not isinstance(c, PolyCollection)]
    return out


def _style(artist) -> tuple:
    """What tells two coincident series apart besides colour: line style and marker."""
    line = artist.lines[0] if hasattr(artist, "lines") and artist.lines and artist.lines[0] is not None else artist
    if hasattr(line, "get_linestyle") and hasattr(line, "get_marker"):
        return (str(line.get_linestyle()), str(line.get_marker()))
    return ("collection", str(getattr(artist, "get_paths", lambda: "")()[:1]))


def _hidden(ax) -> list[tuple[str, str]]:
    """Pairs of labelled series of one style (line style and marker) drawn on the same display points (within half
    a pixel): one hides the other. A dashed line over a solid one, or crosses over circles, still shows both."""
    drawn = []
    for s in _data_series(ax):
        label = s.get_label() if hasattr(s, "get_label") else ""
        if not label or label.startswith("_"):
            continue
        line = s.lines[0] if hasattr(s, "lines") and s.lines and s.lines[0] is not None else s  # an errorbar's data
        if hasattr(line, "get_xydata"):
            pts = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        elif hasattr(s, "get_offsets") and len(s.get_offsets()):
            pts = s.get_offset_transform().transform(np.asarray(s.get_offsets(), dtype=float))
        else:
            continue
        drawn.append((label, pts[np.isfinite(pts).all(axis=1)], _style(s)))
    out = []
    for i, (a, pa, sa) in enumerate(drawn):
        for b, pb, sb in drawn[i + 1:]:
            if sa == sb and len(pa) > 1 and pa.shape == pb.shape and np.abs(pa - pb).max() < 0.5:
                out.append((a, b))
    return out


def _unlabelled_claims(ax) -> int:
    """Dashed or dotted reference lines, and bands across the panel, without a label: a claim or bound a reader
    cannot name (a solid thin line, such as zero, needs none)."""
    from matplotlib.patches import Polygon, Rectangle

    n = 0
    for ln in ax.lines:
        if _is_reference(ln, ax) and ln.get_linestyle() not in ("-", "solid", "None", " ", "") \
                and ln.get_label().startswith("_"):
            n += 1
    frame, owned = ax.get_window_extent(), _in_containers(ax)
    for p in ax.patches:
        if not isinstance(p, (Polygon, Rectangle)) or p in owned:
            continue
        box = p.get_window_extent()  # a band spans the panel's whole width (axhspan) or height (axvspan)
        spans = abs(box.width - frame.width) < 1 or abs(box.height - frame.height) < 1
        if spans and (not p.get_label() or p.get_label().startswith("_")):
            n += 1
    return n


def _labels_over_other_panels(fig, renderer) -> list[str]:
    """A panel's axis label or tick labels drawn over another panel's area (small multiples set too close)."""
    panels = [a for a in fig.axes if a.get_visible() and _has_data(a)]
    out = []
    for a in panels:
        texts = [a.xaxis.label, a.yaxis.label, *a.get_yticklabels(), *a.get_xticklabels()]
        boxes = [t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()]
        for b in panels:
            if b is a:
                continue
            frame = b.get_window_extent(renderer)
            if any(box.overlaps(frame) and min(box.x1, frame.x1) - max(box.x0, frame.x0) > 1
                   and min(box.y1, frame.y1) - max(box.y0, frame.y0) > 1 for box in boxes):
                out.append(f"a label of panel {panels.index(a) + 1} ({a.get_title() or 'untitled'}) is drawn over "
                           f"panel {panels.index(b) + 1}")
                break
    return out


def _title_over_panel(fig, renderer) -> bool:
    """The figure's title drawn over a panel or a panel's title."""
    if not (fig._suptitle and fig._suptitle.get_text()):
        return False
    box = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for other in (ax.get_window_extent(renderer), ax.title.get_window_extent(renderer)
                      if ax.get_title() else None):
            if other is not None and box.overlaps(other) and box.y0 < other.y1 - 1:
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
    for axis in ("x", "y"):
        if _without_unit(ax, axis):
            out.append(f"{where}: the {axis} axis is numeric and its label names no unit")
    data = _data_series(ax)
    named_colours = {c for _, c in _series(ax)}
    # unlabelled and in no labelled series' colour: a series a reader cannot name (one in a labelled series'
    # colour is its companion, a model's prediction or a fit, its style explained once in the legend)
    unnamed = [s for s in data if (not s.get_label() or s.get_label().startswith("_"))
               and _colour(s) not in named_colours]
    if len(data) > 1 and unnamed:
        out.append(f"{where}: {len(unnamed)} of {len(data)} series without a label")
    for a, b in _hidden(ax):
        out.append(f"{where}: {b!r} is drawn exactly over {a!r}")
    if (n := _unlabelled_claims(ax)):
        out.append(f"{where}: {n} claim line(s) or band(s) without a label")
    series = _series(ax)
    # reference lines (claims, bounds) and legend-only keys are not data series
    counted = [s for s in data if s.get_label() and not s.get_label().startswith("_")
               and not (hasattr(s, "get_xydata") and len(s.get_xydata()) == 0)]
    if len(counted) > MAX_SERIES:
        out.append(f"{where}: {len(counted)} series in one panel (at most {MAX_SERIES})")
    seen: dict[tuple, str] = {}
    for label, colour in series:
        if colour is None or _is_grey(colour):  # no colour to read, or a grey reference
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
    out = ["the figure's title is drawn over a panel"] if _title_over_panel(fig, renderer) else []
    out += _labels_over_other_panels(fig, renderer)
    for i, ax in enumerate([a for a in fig.axes if _has_data(a)], 1):
        out += _panel_problems(fig, ax, renderer, f"panel {i} ({ax.get_title() or 'untitled'})")
    return out
