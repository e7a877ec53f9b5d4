"""The interactive report: one self-contained HTML file (inline JS and CSS, nothing fetched, opens from file://).

An icicle of the module tree (click to zoom, hover for details, a metric switch), a sortable, filterable table
of the records and the forward/backward timeline of one step. Python lays out nothing: it hands the page the
numbers, and the strings they print as (``units.format_value``, so the page formats no number itself), and the
page's script (``report_assets/report.js``, written for layerprof, no library) draws them as SVG.
"""
from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from anytree import PreOrderIter

from ..record.fields import FIELDS, canonical
from ..record.records import ModuleRecord
from .checkpoint import frontier_svg, plan_text
from .trace import call_slices
from .units import format_value

__all__ = ["METRICS", "report_data", "report_html"]

# The metric switch, in this order, each where the profile holds it ("memory": saved or activation bytes).
METRICS = ("forward_ms", "backward_ms", "total_ms", "flops", "params", "memory")
_TABLE = ("calls", "forward_ms", "backward_ms", "self_forward_ms", "self_backward_ms", "total_ms", "time_percent")


def _value(record: ModuleRecord, name: str, root: ModuleRecord) -> Any:
    value = FIELDS[name].value(record, root)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _present(records: list[ModuleRecord], root: ModuleRecord, names: tuple[str, ...]) -> list[str]:
    fields = []
    for name in names:
        resolved = canonical(name, lambda n: any(getattr(r, n, None) is not None for r in records))
        if resolved not in FIELDS or resolved in fields:
            continue
        if any(_value(r, resolved, root) is not None for r in records):
            fields.append(resolved)
    return fields


def _timeline(records: list[ModuleRecord]) -> dict[str, Any]:
    """The forward and backward slices of the last profiled step, in ms from the step's first slice."""
    slices = [s for s in call_slices(records) if s.phase in ("forward", "backward")]
    if not slices:
        return {"step": None, "slices": []}
    step = max(s.step for s in slices)
    slices = [s for s in slices if s.step == step]
    origin = min(s.start_ns for s in slices)
    return {"step": step, "slices": [
        {"name": s.name, "type": s.type, "phase": s.phase, "depth": s.depth, "start": (s.start_ns - origin) / 1e6,
         "duration": s.duration_ns / 1e6, "shown": format_value("ms", s.duration_ns / 1e6)}
        for s in sorted(slices, key=lambda s: (s.start_ns, -s.duration_ns))
    ]}


def report_data(root: ModuleRecord, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the page draws: metrics and columns (name, label, unit), one node per module with its values and
    their printed forms, and a step's timeline."""
    records = list(PreOrderIter(root))
    metrics = _present(records, root, METRICS)
    columns = [c for c in _present(records, root, _TABLE + tuple(METRICS)) if c != "time_percent"] + (
        ["time_percent"] if "time_percent" in _present(records, root, ("time_percent",)) else [])
    shown_fields = list(dict.fromkeys(metrics + columns))
    index = {record.name: i for i, record in enumerate(records)}
    nodes = []
    for record in records:
        values = {name: _value(record, name, root) for name in shown_fields}
        nodes.append({
            "name": record.name, "label": record.short_name or record.type, "type": record.type,
            "depth": record.depth, "parent": None if record.parent is None else index[record.parent.name],
            "values": values,
            "shown": {name: format_value(FIELDS[name].unit, value) for name, value in values.items()},
        })
    steps = (meta or {}).get("steps")
    return {
        "title": f"layerprof: {root.type}",
        "subtitle": f"{len(records)} modules" + (f", {steps} profiled step{'s' * (steps != 1)}" if steps else ""),
        "metrics": [{"name": m, "label": FIELDS[m].label} for m in metrics],
        "columns": [{"name": c, "label": FIELDS[c].label, "numeric": True} for c in columns],
        "nodes": nodes,
        "timeline": _timeline(records),
    }


def _checkpoint_section(plan: Any) -> str:
    if plan is None:
        return ""
    return (f'<section id="checkpoint-section">\n  <h2>Checkpoint plans</h2>\n  {frontier_svg(plan)}\n'
            f"  <pre>{html.escape(plan_text(plan))}</pre>\n</section>\n")


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("report_assets", name).read_text(encoding="utf-8")


def report_html(root: ModuleRecord, meta: dict[str, Any] | None = None, checkpoint: Any = None) -> str:
    """The report page as HTML text; ``checkpoint``, a CheckpointPlan, adds a panel with its frontier."""
    data = report_data(root, meta)
    # "</" inside a script element would end it; JSON allows "<\/".
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
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
<section id="tree-section">
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
{_checkpoint_section(checkpoint)}<section id="table-section">
  <h2>Modules</h2>
  <div class="controls">
    <input id="filter" type="search" placeholder="filter by name or type"> <span id="count"></span>
  </div>
  <table id="records"><thead></thead><tbody></tbody></table>
</section>
<div id="tooltip" hidden></div>
<script type="application/json" id="layerprof-data">{payload}</script>
<script>
{_asset("report.js")}
</script>
</body>
</html>
"""
