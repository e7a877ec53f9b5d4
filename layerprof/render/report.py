"""The interactive report: one self-contained HTML file (inline JS and CSS, nothing fetched, opens from file://).

An icicle of the module tree (click to zoom, hover for details, a metric switch), a sortable, filterable table
of the records, the forward/backward timeline of one step and, for a profile with FLOPs and bytes, the roofline
plot (inline SVG drawn by matplotlib). Python lays out nothing: it hands the page the
numbers, and the strings they print as (``units.format_value``, so the page formats no number itself), and the
page's script (``report_assets/report.js``, written for layerprof, no library) draws them as SVG.
"""
from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

from anytree import PreOrderIter

from ..record.fields import FIELDS, canonical
from ..record.records import ModuleRecord
from ..record.summed import TreeValues
from ..record.untimed import untimed_note
from ..record.roofs import peaks_of
from .plot_roofline import plot_roofline, roofline_points
from .checkpoint import frontier_svg, plan_text
from .summary import COUNTED_ONLY_NOTE, partial_note, run_note
from .trace import call_slices
from .units import format_bytes, format_counted, format_value

__all__ = ["METRICS", "report_data", "report_html", "script_json"]

# The metric switch, in this order, each where the profile holds it ("memory": saved or activation bytes).
METRICS = ("forward_ms", "backward_ms", "total_ms", "flops", "params", "memory")
# recompute_ms only where some module ran under activation checkpointing; it is inside backward_ms, where a
# reader would otherwise find it unexplained (in the backward of the region's first node: docs/timing.md).
_TABLE = ("calls", "forward_ms", "backward_ms", "self_forward_ms", "self_backward_ms", "recompute_ms", "total_ms",
          "time_percent", "intensity", "efficiency", "lost_ms")


def _value(values: TreeValues, record: ModuleRecord, name: str) -> Any:
    value = values.value(record, name)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _present(records: list[ModuleRecord], values: TreeValues, names: tuple[str, ...]) -> list[str]:
    fields = []
    for name in names:
        resolved = canonical(name, lambda n: any(getattr(r, n, None) is not None for r in records))
        if resolved not in FIELDS or resolved in fields:
            continue
        if any(_value(values, r, resolved) is not None for r in records):
            fields.append(resolved)
    return fields


def _timeline(records: list[ModuleRecord], values: TreeValues) -> dict[str, Any]:
    """The forward and backward slices of the last profiled step, in ms from the step's first slice; a row per
    depth as a reader counts it (a ModuleList, never called, has no slices and takes no row)."""
    slices = [s for s in call_slices(records) if s.phase in ("forward", "backward")]
    if not slices:
        return {"step": None, "slices": []}
    step = max(s.step for s in slices)
    slices = [s for s in slices if s.step == step]
    origin = min(s.start_ns for s in slices)
    depths = {record.name: values.shown_depth(record) for record in records}
    top = min(depths[s.module] for s in slices)  # a root that was not called has no row either
    depths = {name: depth - top for name, depth in depths.items()}
    return {"step": step, "slices": [
        {"name": s.name, "type": s.type, "phase": s.phase, "depth": depths[s.module], "start": (s.start_ns - origin) / 1e6,
         "duration": s.duration_ns / 1e6, "shown": format_value("ms", s.duration_ns / 1e6)}
        for s in sorted(slices, key=lambda s: (s.start_ns, -s.duration_ns))
    ]}


def report_data(root: ModuleRecord, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the page draws: metrics and columns (name, label, unit), one node per module with its values and
    their printed forms (a container never called, ``summed``, with its children's totals: ``record/summed.py``),
    and a step's timeline."""
    records = list(PreOrderIter(root))
    tree = TreeValues(root)
    metrics = _present(records, tree, METRICS)
    columns = [c for c in _present(records, tree, _TABLE + tuple(METRICS)) if c != "time_percent"] + (
        ["time_percent"] if "time_percent" in _present(records, tree, ("time_percent",)) else [])
    shown_fields = list(dict.fromkeys(metrics + columns))
    # How a module ran where its figures alone mislead (0 calls beside FLOPs: it ran in the counted step only).
    notes = [run_note(record, tree) for record in records]
    index = {record.name: i for i, record in enumerate(records)}
    nodes = []
    for record, note in zip(records, notes):
        values = {name: _value(tree, record, name) for name in shown_fields}
        nodes.append({
            "name": record.name, "label": record.short_name or record.type, "type": record.type,
            "depth": record.depth, "parent": None if record.parent is None else index[record.parent.name],
            "summed": tree.summed(record),
            "values": values,
            "shown": {name: format_value(FIELDS[name].unit, value) for name, value in values.items()},
            "note": note or "",  # (the tooltip's and the cell's title; the cell shows it short, to fit the page)
            "note_short": "counted step only" if note == COUNTED_ONLY_NOTE else note or "",
        })
    steps = (meta or {}).get("steps")
    return {
        "title": f"layerprof: {root.type}",
        "subtitle": format_counted(len(records), "module")
        + (f", {format_counted(steps, 'profiled step')}" if steps else ""),
        "untimed": untimed_note(meta),  # (the timeline's caption: why it is empty)
        "notice": partial_note(meta or {}),  # a run that ended early says so above everything it drew
        "metrics": [{"name": m, "label": FIELDS[m].label} for m in metrics],
        "columns": [{"name": c, "label": FIELDS[c].label, "numeric": True} for c in columns]
        + ([{"name": "note", "label": "Note", "numeric": False}] if any(notes) else []),
        "nodes": nodes,
        "timeline": _timeline(records, tree),
    }


def roofline_svg(root: ModuleRecord) -> str:
    """The roofline plot as inline SVG, or "" for a profile without FLOPs and bytes (``metrics=("flops",)``)
    or without peaks for its device. Reading the peaks measures them if the profile has none yet."""
    if not roofline_points(root) or not peaks_of(root):
        return ""
    from io import StringIO

    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.5, 5.5))
    plot_roofline(root, ax=figure.subplots())
    text = StringIO()
    figure.savefig(text, format="svg", bbox_inches="tight")
    svg = text.getvalue()
    svg = svg[svg.index("<svg"):]
    # Inline SVG in HTML needs no namespace declarations (the HTML parser knows xlink:href) and no metadata:
    # the page names no URL at all.
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    return re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)


def _roofline_section(root: ModuleRecord) -> str:
    svg = roofline_svg(root)
    if not svg:
        return ""
    return f"""<section id="roofline-section">
  <h2>Roofline <span class="caption">each module's own ops against the machine's peaks; see prof.roofline()</span></h2>
  {svg}
</section>
"""
def _checkpoint_section(plan: Any) -> str:
    if plan is None:
        return ""
    if isinstance(plan, str):  # why no plan could be made on this profile
        return (f'<section id="checkpoint-section">\n  <h2>Checkpoint plans</h2>\n  <p>No plan: '
                f"{html.escape(plan)}</p>\n</section>\n")
    caption = ""
    if getattr(plan, "predicted_peak_bytes", None) is not None:
        caption = (f' <span class="caption">(step peak {format_bytes(plan.profiled_peak_bytes)} profiled, '
                   f"{format_bytes(plan.predicted_peak_bytes)} predicted with the plan)</span>")
    return (f'<section id="checkpoint-section">\n  <h2>Checkpoint plans{caption}</h2>\n  {frontier_svg(plan)}\n'
            f"  <pre>{html.escape(plan_text(plan))}</pre>\n</section>\n")


def _notice(notice: str | None) -> str:
    return f'<p id="notice" role="note">{html.escape(notice)}</p>\n' if notice else ""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("report_assets", name).read_text(encoding="utf-8")


# Inside <script>, "</script" ends the element and "<!--" followed by "<script" makes the tokenizer look for a
# second "</script>" that never comes (the page goes blank); JSON may spell any character as \uXXXX, so none of
# <, > or & reaches the HTML parser, and U+2028/U+2029 (line breaks to older JavaScript) are spelled out too.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def script_json(data: Any) -> str:
    """``data`` as JSON text that is safe inside an HTML ``<script>`` element, whatever strings it holds.

    >>> script_json({"name": "</script><!--<script>&"})
    '{"name": "\\\\u003c/script\\\\u003e\\\\u003c!--\\\\u003cscript\\\\u003e\\\\u0026"}'
    """
    return json.dumps(data, ensure_ascii=False, allow_nan=False).translate(_SCRIPT_SAFE)


def report_html(root: ModuleRecord, meta: dict[str, Any] | None = None, checkpoint: Any = None) -> str:
    """The report page as HTML text; ``checkpoint``, a CheckpointPlan, adds a panel with its frontier (a text: why
    no plan could be made, shown in its place)."""
    data = report_data(root, meta)
    payload = script_json(data)
    title = html.escape(data["title"])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{_asset("report.css")}
</style>
</head>
<body>
<header><h1>{title}</h1><span id="subtitle"></span></header>
{_notice(data["notice"])}<section id="tree-section">
  <div class="controls">
    <label>metric <select id="metric"></select></label>
    <button id="zoom-out" type="button">zoom out</button>
    <span id="crumbs"></span>
  </div>
  <svg id="icicle" role="img" aria-label="icicle of the module tree"></svg>
</section>
<section id="timeline-section">
  <h2>Timeline <span id="timeline-caption"></span></h2>
  <svg id="timeline" role="img" aria-label="forward and backward timeline"></svg>
</section>
{_roofline_section(root)}{_checkpoint_section(checkpoint)}<section id="table-section">
  <h2>Modules</h2>
  <div class="controls">
    <input id="filter" type="search" placeholder="filter by name or type"> <span id="count"></span>
  </div>
  <table id="records"><thead></thead><tbody></tbody></table>
  <button id="more" type="button" hidden></button>
</section>
<div id="tooltip" hidden></div>
<script type="application/json" id="layerprof-data">{payload}</script>
<script>
{_asset("report.js")}
</script>
</body>
</html>
"""
