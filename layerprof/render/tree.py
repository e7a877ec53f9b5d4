"""Terminal tree view and the nested-dict ("time pool") form of a record tree."""
from __future__ import annotations

from typing import Any

from anytree import RenderTree
from anytree.render import ContStyle

from .._check import check_int
from ..record.records import ModuleRecord
from ..record.summed import TreeValues
from .units import format_ms

__all__ = ["render_tree", "timepool"]


def render_tree(root: ModuleRecord, maxdepth: int | None = None) -> str:
    """``RenderTree`` lines: name, type, forward and backward time, calls; a container never called (a
    ModuleList) shows its children's totals, marked ``(sum)`` (``record/summed.py``)."""
    maxdepth = check_int("maxdepth", maxdepth, none=True)
    values = TreeValues(root)
    lines = []
    for prefix, _, record in RenderTree(root, style=ContStyle(), maxlevel=None if maxdepth is None else maxdepth + 1):
        label = record.short_name or record.type
        calls = f" x{record.calls}" if record.calls > 1 else " (sum)" if values.summed(record) else ""
        forward, backward = (format_ms(values.value(record, name)) for name in ("forward_ms", "backward_ms"))
        lines.append(f"{prefix}{label} ({record.type}) fwd {forward} bwd {backward}{calls}")
    return "\n".join(lines)


def timepool(record: ModuleRecord) -> dict[str, Any]:
    """``{name: {forward_ms, backward_ms, depth, children: {...}}}`` in milliseconds, keyed by attribute name
    (the root by its class name)."""

    def entry(node: ModuleRecord) -> dict[str, Any]:
        return {
            "type": node.type,
            "forward_ms": node.forward_ms,
            "backward_ms": node.backward_ms,
            "depth": node.depth,
            "calls": node.calls,
            "children": {child.short_name: entry(child) for child in node.children},
        }

    return {record.short_name or record.type: entry(record)}
