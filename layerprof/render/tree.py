"""Terminal tree view and the nested-dict ("time pool") form of a record tree."""
from __future__ import annotations

from typing import Any

from anytree import RenderTree
from anytree.render import ContStyle

from .._check import check_int
from ..record.records import ModuleRecord
from .units import format_ms

__all__ = ["render_tree", "timepool"]


def render_tree(root: ModuleRecord, maxdepth: int | None = None) -> str:
    """``RenderTree`` lines: name, type, forward and backward time, calls."""
    maxdepth = check_int("maxdepth", maxdepth, none=True)
    lines = []
    for prefix, _, record in RenderTree(root, style=ContStyle(), maxlevel=None if maxdepth is None else maxdepth + 1):
        label = record.short_name or record.type
        calls = f" x{record.calls}" if record.calls > 1 else ""
        lines.append(
            f"{prefix}{label} ({record.type}) fwd {format_ms(record.forward_ms)} bwd {format_ms(record.backward_ms)}{calls}"
        )
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
