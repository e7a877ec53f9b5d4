"""Profile: the result of profiling, a tree of records plus where it was measured. Live or loaded alike.

Every way of reading a profile (summary, tables, exports, plots, comparisons) hangs off this class or takes one;
none of them needs the model or the profiler that made it.
"""
from __future__ import annotations

from typing import Any, Iterable

from .records import ModuleRecord
from .render.summary import annotated_repr
from .render.tree import render_tree, timepool

__all__ = ["Profile"]


class Profile:
    """Records of one profiled model: ``tree`` (anytree root), ``records`` by qualified name, ``meta``."""

    def __init__(self, tree: ModuleRecord, meta: dict[str, Any] | None = None) -> None:
        self.tree = tree
        self.records: dict[str, ModuleRecord] = {record.name: record for record in (tree, *tree.descendants)}
        self.meta: dict[str, Any] = dict(meta or {})

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{qualified name: row}`` in ``named_modules()`` order; the root's name is ``""``."""
        return {name: record.to_dict() for name, record in self.records.items()}

    def layerwise_summary(self, columns: Iterable[str] | None = None, depth: int | None = None,
                          footer: bool = False) -> str:
        """The model's repr, each module annotated with its costs and share of the step; ``footer=True`` adds
        the totals (model size, activation and saved memory, the largest modules)."""
        return annotated_repr(self.tree, columns=columns, depth=depth, footer=footer)

    def layerwise_timepool(self) -> dict[str, Any]:
        """The nested-dict form: ``{name: {forward_cost, backward_cost, depth, calls, children}}``."""
        return timepool(self.tree)

    def render_tree(self, maxdepth: int | None = None) -> str:
        """An anytree ``RenderTree`` view for terminals."""
        return render_tree(self.tree, maxdepth=maxdepth)

    def __repr__(self) -> str:
        root = self.tree
        return (
            f"<Profile {root.type}: {len(self.records)} modules, forward {root.forward_ms} ms, "
            f"backward {root.backward_ms} ms>"
        )
