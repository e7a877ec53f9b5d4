"""Profile: the result of profiling, a tree of records plus where it was measured. Live or loaded alike.

Every way of reading a profile (summary, tables, exports, plots, comparisons) hangs off this class or takes one;
none of them needs the model or the profiler that made it.
"""
from __future__ import annotations

from typing import Any, Iterable

from .records import ModuleRecord
from .reports import ProfileReports
from .render.summary import annotated_repr
from .render.tree import render_tree, timepool
from .render.units import format_ms

__all__ = ["Profile"]


class Profile(ProfileReports):
    """Records of one profiled model: ``tree`` (anytree root), ``records`` by qualified name, ``meta``.

    Queries, tables and exports (``rows``, ``top``, ``aggregate``, ``to_dataframe``, ``to_csv``, ``to_json``,
    ``to_html``, ``to_latex``, ``to_markdown``, ``to_trace``) come from ``ProfileReports`` (reports.py)."""

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

    def gather(self, dst: int = 0, group: Any = None, margin: float = 0.2, min_ms: float | None = None) -> Any:
        """Collect every rank's profile on rank ``dst`` (a collective) and compare them: a ``GatheredProfile``
        there, None on other ranks, a one-rank view without torch.distributed. See ``layerprof.distributed``."""
        from .distributed import gather_profile

        return gather_profile(self, dst=dst, group=group, margin=margin, min_ms=min_ms)

    def unknown_ops(self) -> dict[str, int]:
        """Ops that ran inside the model with no FLOP formula (so counted 0), with their call counts, most
        called first; empty when every op was priced or FLOPs were not measured (``metrics=("flops",)``).
        Register a formula with ``layerprof.register_flop_formula``."""
        return dict(getattr(self.tree, "unknown_ops", None) or {})

    def plot(self, kind: str, metric: str = "total", path: str | None = None, **kwargs: Any) -> Any:
        """Draw a ``kind`` of plot ("sunburst", "icicle" or "top") of ``metric`` and return its Axes; saves a PNG
        or SVG only when ``path`` is given. Other keywords go to ``layerprof.plot_<kind>`` (ax, depth, k, ...)."""
        from .render.plot import save_plot

        return save_plot(self, kind, metric=metric, path=path, **kwargs)

    def __repr__(self) -> str:
        root = self.tree
        return (
            f"<Profile {root.type}: {len(self.records)} modules, forward {format_ms(root.forward_ms)}, "
            f"backward {format_ms(root.backward_ms)}>"
        )
