"""The roofline plot: every module's own ops against the machine's two roofs, log-log.

x is arithmetic intensity (FLOPs per byte), y achieved FLOP/s, both of the module's own ops over its self time
(in the steps that ran it, as its FLOPs are of one); the roofs are ``min(peak FLOP/s, intensity * peak
bandwidth)`` from the profile's peaks. A point's area is its self time per step, its colour its bound; the modules
that take the most time are labelled. Modules whose own ops count no FLOPs (norms, elementwise, pooling: FLOPs
count matmul-like work only) have no place on a FLOP/s axis: they are drawn on the bottom-left edge and summed in
the legend. A star marks the whole model (inclusive).
Collections carry gids ``roofline:<bound>``, the roofs ``roof:compute`` and ``roof:memory``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..record.fields import FIELDS
from ..record.records import ModuleRecord, preorder
from ..record.roofs import no_roofs_for, peaks_of
from ..record.summed import counted_only
from ..record.untimed import untimed_note
from ..record.work_time import step_ms, work_ms
from .plot_metrics import root_of
from .plot_save import finish_plot, plot_suffix
from .plot_style import new_axes, plain_text
from .units import format_bytes, format_counted, format_flops, format_ms

__all__ = ["plot_roofline", "roofline_points", "BOUND_COLOURS"]

BOUND_COLOURS = {"compute": "tab:blue", "memory": "tab:orange", "overhead": "tab:red"}
FONT_SIZE = 7.0


def roofline_points(root: ModuleRecord) -> list[dict[str, Any]]:
    """One point per module with own work measured: name, flops, bytes, ms (its own work's in a step that ran it:
    ``work_ms``), step_ms (the same per recorded step: what it takes of a step), intensity, flop_per_s, bound."""
    points = []
    for record in preorder(root):
        flops, moved = getattr(record, "self_flops", None), getattr(record, "self_bytes", None)
        ms = work_ms(record)
        if flops is None or moved is None or not ms or not (flops or moved):
            continue
        points.append({
            "name": record.name or "(model)", "type": record.type, "flops": flops, "bytes": moved, "ms": ms,
            "step_ms": step_ms(record, ms), "intensity": flops / moved if moved else None,
            "flop_per_s": flops / (ms / 1000.0),
            "bound": FIELDS["bound"].value(record),
        })
    return points


def _label_largest(ax: Any, points: list[dict[str, Any]], count: int, avoid: list[Any]) -> None:
    """Name the ``count`` most time-consuming points. A label goes right of its point, else left of it, where it
    lies inside the Axes and clear of the labels placed before it and of ``avoid`` (display boxes, such as the
    legend's); a point with room on neither side goes unnamed. Call once the limits are final: the boxes are
    measured in display units, as drawn."""
    frame = ax.get_window_extent()
    taken = list(avoid)
    named = 0
    for point in sorted(points, key=lambda p: -p["step_ms"]):
        if named >= count:
            break
        short = ".".join(point["name"].split(".")[-4:])
        text = f"{plain_text(short)} ({format_ms(point['step_ms'])})"
        for offset, align in (((5, 3), "left"), ((-5, 3), "right")):
            label = ax.annotate(text, (point["x"], point["y"]), fontsize=FONT_SIZE, xytext=offset,
                                textcoords="offset points", ha=align)
            box = label.get_window_extent()
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                named += 1
                break
            label.remove()


def _meta_of(profile: Any) -> dict[str, Any]:
    """The ``meta`` of a Profile or a LayerProf; empty for a bare tree, or a LayerProf whose profile is not made."""
    try:
        return getattr(profile, "meta", None) or {}
    except RuntimeError:
        return {}


def plot_roofline(profile: Any, metric: str = "total", ax: Any = None, labels: int = 8,
                  path: str | Path | None = None) -> Any:
    """Draw the roofline of ``profile`` (needs ``metrics=("flops",)``; peaks measured on first use, or the ones
    given to ``LayerProf(model, peaks=...)``) and return the Axes. ``labels``: how many of the most
    time-consuming modules are named. ``metric`` is accepted for ``Profile.plot`` and must be ``"total"``.
    ``path``: a .png, .svg or .pdf file to write the figure to (see ``plot_sunburst``).

    >>> import torch, layerprof
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    >>> with layerprof.LayerProf(net, metrics=("flops",), peaks={"flops": 1e11, "bandwidth": 1e10}) as prof:
    ...     for _ in range(2):
    ...         net(torch.randn(32, 64)).sum().backward()
    ...         prof.step()
    >>> ax = layerprof.plot_roofline(prof)
    >>> ax.get_xscale(), ax.get_yscale(), ax.collections[-1].get_gid()
    ('log', 'log', 'roofline:model')
    """
    if metric not in ("total", "total_ms"):
        raise ValueError(f"the roofline plots self time, FLOPs and bytes; metric must be 'total', got {metric!r}")
    plot_suffix(path)
    root = root_of(profile)
    untimed = untimed_note(_meta_of(profile))
    if untimed is not None:
        raise ValueError(f"the roofline plots the FLOP/s each module achieved, which needs times: {untimed}. "
                         "Given the roofs of a machine (LayerProf(model, peaks=...)), prof.roofline() lists each "
                         "module's attainable time there and whether compute or memory bounds it")
    points = roofline_points(root)
    if not points:
        only_counted = [record for record in preorder(root) if counted_only(record) and (
            getattr(record, "self_flops", None) or getattr(record, "self_bytes", None))]
        if only_counted:  # (generate()'s encoder, profiled with prof.step() per token: counted, never timed)
            raise ValueError(f"nothing to plot on a roofline: the modules with counted work ("
                             f"{format_counted(len(only_counted), 'module')}, such as {only_counted[0].name!r}) ran "
                             "only in the step the FLOP meter counts (the first profiled one), which the times "
                             "leave out, and the modules timed did not run in it: make the first profiled step one "
                             "that runs the modules to plot")
        if any(getattr(record, "flops_forward", None) is not None for record in preorder(root)):
            raise ValueError("nothing to plot on a roofline: no module did work of its own that the FLOP meter "
                             "counts (FLOPs or bytes) with a time to set it against; the model's modules only "
                             "reshape or pass their inputs on")
        raise ValueError("nothing to plot on a roofline: profile with LayerProf(model, metrics=('flops',)) and "
                         "run at least two steps (prof.step() after each), so that FLOPs, bytes and times are known")
    peaks = peaks_of(root)
    if not peaks:
        raise ValueError(no_roofs_for(_meta_of(profile)))
    import numpy as np

    created, ax = ax is None, new_axes(ax, (8.5, 5.5))
    ranked = [p for p in points if p["flops"] and p["bytes"]]
    ridge = peaks["flops"] / peaks["bandwidth"]
    intensities = [p["intensity"] for p in ranked] + [ridge]
    x_edge = min(intensities) / 30  # where modules with no FLOPs stand, at their achieved bandwidth
    x_low, x_high = x_edge / 2, max(intensities) * 8
    for point in points:
        point["x"], point["y"] = (
            (point["intensity"], point["flop_per_s"]) if point in ranked
            else (x_edge, x_edge * point["bytes"] / (point["ms"] / 1000.0))
        )
    y_low, y_high = min(p["y"] for p in points) / 3, peaks["flops"] * 3
    grid = np.geomspace(x_low, ridge, 100)
    ax.plot(grid, grid * peaks["bandwidth"], color="0.25", linestyle="--", gid="roof:memory",
            label=f"memory roof {format_bytes(peaks['bandwidth'])}/s")
    ax.plot([ridge, x_high], [peaks["flops"], peaks["flops"]], color="0.25", linestyle="-", gid="roof:compute",
            label=f"compute roof {format_flops(peaks['flops'], 'FLOP/s')}")
    ax.axvline(x_edge * 2.2, color="0.7", linewidth=0.6, linestyle=":")
    ax.text(x_edge * 1.15, y_high / 1.6, "no FLOPs:\nat achieved\nbandwidth", fontsize=FONT_SIZE - 0.5,
            va="top", ha="left", color="0.4")
    largest = max(p["step_ms"] for p in points)  # (areas, labels and the legend's sums: time per step)
    for bound, colour in BOUND_COLOURS.items():
        chosen = [p for p in points if p["bound"] == bound]
        if not chosen:
            continue
        ax.scatter([p["x"] for p in chosen], [p["y"] for p in chosen],
                   s=[15 + 600 * p["step_ms"] / largest for p in chosen], color=colour, alpha=0.55,
                   edgecolors="black", linewidths=0.4, gid=f"roofline:{bound}",
                   label=f"{bound}-bound: {format_counted(len(chosen), 'module')}, "
                         f"{format_ms(sum(p['step_ms'] for p in chosen))}")
    whole_flops, whole_bytes = FIELDS["flops"].value(root), FIELDS["bytes"].value(root)
    whole_ms = FIELDS["total_ms"].value(root)
    if whole_flops and whole_bytes and whole_ms:
        ax.scatter([whole_flops / whole_bytes], [whole_flops / (whole_ms / 1000.0)], marker="*", s=160,
                   color="black", gid="roofline:model", label="whole model (inclusive)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_low, x_high)
    ax.set_ylim(y_low, y_high)
    ax.set_xlabel("arithmetic intensity of own ops (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s (own ops over self time)")
    source = peaks.get("source", "measured")
    model = plain_text(root.type)
    ax.set_title(f"{model}: roofline per module ({source} peaks, {peaks.get('device', '?')}, "
                 f"threads: {peaks.get('threads', '?')})" if source == "measured" else
                 f"{model}: roofline per module ({source} peaks)", fontsize=FONT_SIZE + 3)
    legend = ax.legend(fontsize=FONT_SIZE + 0.5, loc="lower right", frameon=False)
    for handle in legend.legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([40.0])  # a marker per bound, not the first point's area, which may dwarf the rest
    ax.grid(True, which="major", color="0.9", linewidth=0.6)
    _label_largest(ax, points, labels, avoid=[legend.get_window_extent()])
    return finish_plot(ax, path, created)
