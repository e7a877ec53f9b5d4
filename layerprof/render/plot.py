"""Plots of a profile with matplotlib: a sunburst, an icicle of per-depth bars, and top-k bars.

Each takes ``ax=None`` and returns the Axes, and writes a PNG or SVG only when given ``path=`` (``plot_save``).
Every drawn patch carries a gid ``"<kind>:<module name>"`` (kind: module, self, other, carried, top) so a test or
a caller can read the plot back.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .._check import check_int, check_real
from ..record.records import ModuleRecord
from .plot_layout import Layout, Segment, exclusive_values, layout_tree
from .plot_metrics import PlotMetric, resolve_metric, root_of
from .plot_roofline import plot_roofline
from .plot_save import finish_plot, plot_suffix
from .plot_style import (
    SELF_HATCH, fit_label, new_axes, palette_colour, plain_text, points_per_unit, segment_colour, shortened,
    shortened_apart, text_width_pt, wrap_label,
)
from .checkpoint import plot_checkpoint
from .units import format_counted, format_percent

__all__ = ["plot_sunburst", "plot_icicle", "plot_top", "save_plot", "PLOT_KINDS"]

FONT_SIZE = 7.0
LEGEND_ENTRIES = 12


def _check_min_share(min_share: Any) -> float:
    """``min_share`` as a share of the total in [0, 1): at 1 or more every module would be grouped as "other"."""
    return check_real("min_share", min_share, "a share of the total, at least 0 and below 1 (such as 0.004)",
                      lambda share: 0 <= share < 1)


def _prepare(profile: Any, metric: str, depth: int | None, min_share: float) -> tuple[ModuleRecord, PlotMetric, Layout]:
    depth = check_int("depth", depth, none=True)  # -1 was drawn without a word; "2" failed deep in the layout
    min_share = _check_min_share(min_share)
    root = root_of(profile)
    chosen, fields = resolve_metric(metric, root)
    return root, chosen, layout_tree(root, chosen, fields, depth=depth, min_share=min_share)


def _title(root: ModuleRecord, metric: PlotMetric, total: float, what: str = "") -> str:
    return f"{plain_text(root.type)}: {what}{metric.label}, total {metric.format(total)}"


def _legend(ax: Any, layout: Layout) -> None:
    from matplotlib.patches import Patch

    values = {id(segment.record): segment.extent for segment in layout.segments if segment.kind == "module"}
    drawn = [(branch, head) for branch, head in enumerate(layout.heads) if id(head) in values]
    heads = sorted(drawn, key=lambda item: -values[id(item[1])])[:LEGEND_ENTRIES]
    names = shortened_apart([head.name for _, head in heads])
    handles = [
        Patch(facecolor=palette_colour(branch),
              label=f"{plain_text(name)}  {format_percent(values[id(head)], layout.total)}")
        for (branch, head), name in zip(heads, names)
    ]
    handles.append(Patch(facecolor="white", edgecolor="0.4", hatch=SELF_HATCH, label="self (own - children)"))
    handles.append(Patch(facecolor=segment_colour(Segment("other", layout.segments[0].record, 0, 0, 0)),
                         edgecolor="0.6", label="other (small modules)"))
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=FONT_SIZE + 1, frameon=False)


def _patch_style(segment: Segment) -> dict[str, Any]:
    style: dict[str, Any] = {"facecolor": segment_colour(segment), "edgecolor": "white", "linewidth": 0.6}
    if segment.kind == "self":
        style["hatch"] = SELF_HATCH
    return style


def plot_sunburst(
    profile: Any, metric: str = "total", depth: int | None = None, ax: Any = None, min_share: float = 0.004,
    path: str | Path | None = None,
) -> Any:
    """A sunburst: the model in the centre, one ring per depth, each module's angle proportional to its inclusive
    ``metric``, its self part (own - children, see ``plot_layout``) a hatched wedge after its children. A
    module reachable under several names counts once, under its first name; children that add up to more than
    their parent are scaled to fit it, so every ring adds up to the total.

    Args:
        profile: a Profile (or finished LayerProf, or root ModuleRecord).
        metric: one of ``PLOT_METRICS``: forward, backward, total, flops, params, memory.
        depth: deepest ring drawn (None: all).
        ax: the Axes to draw on; None: a new figure.
        min_share: siblings below this share of the total are grouped into one grey "other" wedge.
        path: a .png, .svg or .pdf file to write the figure to (all it drew kept; a figure made here is then
            closed).

    >>> import torch, layerprof
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> with layerprof.LayerProf(net) as prof:
    ...     net(torch.randn(2, 4)).sum().backward()
    >>> ax = layerprof.plot_sunburst(prof, metric="forward")
    >>> sorted(patch.get_gid() for patch in ax.patches if patch.get_gid().startswith("module:"))
    ['module:', 'module:0', 'module:1']
    >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
    """
    from matplotlib.patches import Wedge

    plot_suffix(path)
    root, chosen, layout = _prepare(profile, metric, depth, min_share)
    created, ax = ax is None, new_axes(ax, (10.0, 8.0))
    rings = layout.max_depth + 1
    ax.set_xlim(-rings - 0.2, rings + 0.2)
    ax.set_ylim(-rings - 0.2, rings + 0.2)
    ax.set_aspect("equal")
    ax.set_axis_off()
    unit_x, _ = points_per_unit(ax)
    for segment in layout.segments:
        theta1 = 90.0 - 360.0 * (segment.start + segment.extent) / layout.total
        theta2 = 90.0 - 360.0 * segment.start / layout.total
        wedge = Wedge((0.0, 0.0), segment.depth + 1.0, theta1, theta2, width=1.0, **_patch_style(segment))
        wedge.set_gid(f"{segment.kind}:{segment.name}")
        ax.add_patch(wedge)
        if segment.depth > 0:
            _wedge_label(ax, segment, theta1, theta2, unit_x)
    name = wrap_label(root.type, 1.7 * unit_x, FONT_SIZE + 1)
    lines = name.count("\n") + 1 if name else 0
    if name and (lines + 1) * 1.3 * (FONT_SIZE + 1) <= 1.6 * unit_x:
        ax.text(0, 0.1, plain_text(name), ha="center", va="bottom", fontsize=FONT_SIZE + 1, weight="bold",
                linespacing=1.1)
    ax.text(0, -0.05, chosen.format(layout.total), ha="center", va="top", fontsize=FONT_SIZE + 1)
    ax.set_title(_title(root, chosen, layout.total))
    _legend(ax, layout)
    return finish_plot(ax, path, created)


def _wedge_label(ax: Any, segment: Segment, theta1: float, theta2: float, unit: float) -> None:
    middle = math.radians((theta1 + theta2) / 2)
    radius = segment.depth + 0.5
    arc = radius * math.radians(theta2 - theta1) * unit
    text = fit_label(segment.labels(), arc * 0.92, unit, FONT_SIZE)  # along the ring
    angle = math.degrees(middle) - 90.0
    if text is None:
        text = fit_label(segment.labels(), unit * 0.92, arc, FONT_SIZE)  # along the radius
        angle = math.degrees(middle)
    if text is None:
        return
    angle = (angle + 180.0) % 360.0 - 180.0
    if angle > 90.0 or angle < -90.0:
        angle += 180.0  # keep text upright
    ax.text(radius * math.cos(middle), radius * math.sin(middle), plain_text(text), rotation=angle,
            rotation_mode="anchor",
            ha="center", va="center", fontsize=FONT_SIZE)


def plot_icicle(
    profile: Any, metric: str = "total", depth: int | None = None, ax: Any = None, min_share: float = 0.002,
    path: str | Path | None = None,
) -> Any:
    """Stacked bars, one per depth level (the model on top): each module is a bar segment as wide as its
    inclusive ``metric`` under its parent, the parent's self part hatched in the parent's colour. What ended at a
    shallower level (a leaf, a self part, an "other" group) is carried down, faded, in the same colour, so every
    level's bar spans the whole total. Args as ``plot_sunburst``.
    """
    from matplotlib.patches import Rectangle

    plot_suffix(path)
    root, chosen, layout = _prepare(profile, metric, depth, min_share)
    levels = layout.max_depth + 1
    created, ax = ax is None, new_axes(ax, (12.0, 1.0 + 0.55 * levels))
    ax.set_xlim(0, layout.total)
    ax.set_ylim(levels - 0.5, -0.5)
    unit_x, unit_y = points_per_unit(ax)
    for level in range(levels):
        for segment in layout.segments:
            carried = segment.depth < level and segment.terminal
            if segment.depth != level and not carried:
                continue
            # (a Rectangle added as it is: what barh makes, without its work per call, a millisecond each, which
            # a deep model's thousands of carried bars added up to seconds; the limits are set above)
            bar = Rectangle((segment.start, level - 0.43), segment.extent, 0.86, alpha=0.3 if carried else 1.0,
                            **_patch_style(segment))
            ax.add_artist(bar)
            bar.set_gid(f"{'carried' if carried else segment.kind}:{segment.name}")
            if not carried:
                _bar_label(ax, segment, level, unit_x * segment.extent, unit_y * 0.86)
    ax.set_yticks(range(levels), ["model"] + [f"depth {level}" for level in range(1, levels)])
    _value_axis(ax.xaxis, chosen)
    ax.set_title(_title(root, chosen, layout.total))
    ax.spines[["top", "right"]].set_visible(False)
    _legend(ax, layout)
    return finish_plot(ax, path, created)


def _bar_label(ax: Any, segment: Segment, level: int, width_pt: float, height_pt: float) -> None:
    center = segment.start + segment.extent / 2
    text = fit_label(segment.labels(), width_pt, height_pt, FONT_SIZE)
    rotation = 0.0
    if text is None:
        text, rotation = fit_label(segment.labels(), height_pt, width_pt, FONT_SIZE), 90.0
    if text is not None:
        ax.text(center, level, plain_text(text), ha="center", va="center", rotation=rotation, fontsize=FONT_SIZE,
                clip_on=True)


def _value_axis(axis: Any, metric: PlotMetric) -> None:
    """Ticks of the horizontal value axis in ``metric``'s units, as many as fit side by side without touching:
    a label such as "800 MFLOPs" is five times as wide as a plain number, so matplotlib's default count
    (chosen for plain numbers) overlaps them on a wide axis."""
    import matplotlib
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_formatter(FuncFormatter(lambda value, _: metric.format(value)))
    axis.set_label_text(metric.label)
    low, high = axis.get_view_interval()
    size = FontProperties(size=matplotlib.rcParams["xtick.labelsize"]).get_size_in_points()
    widest = max(text_width_pt(metric.format(low + (high - low) * step / 8), size) for step in range(9))
    length = points_per_unit(axis.axes)[0] * abs(high - low)
    axis.set_major_locator(MaxNLocator(nbins=max(1, int(length // (widest + 2.0 * size))), steps=[1, 2, 2.5, 5, 10]))


def plot_top(profile: Any, k: int = 10, metric: str = "total", by_type: bool = False, ax: Any = None,
             path: str | Path | None = None) -> Any:
    """Horizontal bars of the ``k`` modules (or module types, ``by_type=True``) with the largest exclusive share
    of ``metric`` (self part; a leaf's whole value), and one bar for all the rest: the bars add up to the total.
    Bars are coloured by module type. A shared module is one bar, under its first name. ``ax`` and ``path`` as
    for ``plot_sunburst``.
    """
    k = check_int("k", k, minimum=1)
    plot_suffix(path)
    root, chosen, layout = _prepare(profile, metric, None, 0.0)
    rows: dict[str, float] = defaultdict(float)
    kinds: dict[str, str] = {}
    counts: dict[str, int] = defaultdict(int)
    model = "" if by_type else f"{root.type} (model)"  # the root's own share: its key names its type already
    for record, value in exclusive_values(layout):
        key = record.type if by_type else record.name or model
        rows[key] += value
        kinds[key] = record.type
        counts[key] += 1
    ranked = sorted(rows.items(), key=lambda item: -item[1])
    shown, rest = ranked[:k], ranked[k:]
    keys = shortened_apart([key for key, _ in shown])
    labels = [plain_text(f"{short} ×{counts[key]}" if by_type else short if key == model
                         else f"{short} ({shortened(kinds[key])})")
              for (key, _), short in zip(shown, keys)]
    widths = [value for _, value in shown]
    types = list(dict.fromkeys(kinds[key] for key, _ in shown))
    colours = [palette_colour(types.index(kinds[key])) for key, _ in shown]
    if rest:
        labels.append(f"other ({format_counted(len(rest), 'type' if by_type else 'module')})")
        widths.append(sum(value for _, value in rest))
        colours.append((0.85, 0.85, 0.85))
    created, ax = ax is None, new_axes(ax, (9.0, 1.2 + 0.32 * len(labels)))
    bars = ax.barh(range(len(labels)), widths, color=colours, height=0.75)
    for index, (bar, key) in enumerate(zip(bars, [key for key, _ in shown] + ["other"] * bool(rest))):
        bar.set_gid(f"top:{key}")
        text = f" {chosen.format(widths[index])}  {format_percent(widths[index], layout.total)}"
        ax.text(widths[index], index, text, va="center", fontsize=FONT_SIZE + 1)
    ax.set_yticks(range(len(labels)), labels, fontsize=FONT_SIZE + 1)
    ax.invert_yaxis()
    ax.set_xlim(0, max(widths) * 1.3)
    _value_axis(ax.xaxis, chosen)
    ax.spines[["top", "right"]].set_visible(False)
    what = f"top {format_counted(len(shown), 'module type' if by_type else 'module')} by self "
    ax.set_title(_title(root, chosen, layout.total, what))
    return finish_plot(ax, path, created)


PLOT_KINDS = {"sunburst": plot_sunburst, "icicle": plot_icicle, "top": plot_top, "roofline": plot_roofline,
              "checkpoint": plot_checkpoint}


def save_plot(profile: Any, kind: str, metric: str = "total", path: str | Path | None = None, **kwargs: Any) -> Any:
    """Draw ``kind`` (sunburst, icicle, top, roofline, checkpoint) and, when ``path`` is given, save it as PNG or
    SVG (by suffix). A figure created here is closed after saving; the Axes is returned either way."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a plot kind's name, one of: {', '.join(PLOT_KINDS)}; got {kind!r}")
    if kind not in PLOT_KINDS:
        raise ValueError(f"unknown plot kind {kind!r}; choose from: {', '.join(PLOT_KINDS)}")
    return PLOT_KINDS[kind](profile, metric=metric, path=path, **kwargs)
