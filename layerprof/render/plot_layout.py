"""Where each module goes in a hierarchical plot: spans along one axis (angle or width), by depth. No drawing.

A module's span is its inclusive value; inside it, its children's spans follow one another and the rest of the
span, the module's *self* value (own - sum of children's inclusive values), is a segment of its own. The
segments that nothing is drawn beyond (leaves, selves, "other" groups, modules at the depth limit) partition the
root's span exactly, so every plot adds up to the total of the metric.

Shared modules: a module reachable under several names is one record, placed under its first name in
``named_modules()``; its whole value counts there. If another module calls it, that caller's self value absorbs
the call, and if the children of a module add up to more than the module (a shared child, tied parameters, or
timer noise) they are scaled down to fit it and its self value is 0. A container that is never called itself
(ModuleList, ModuleDict) counts as the sum of its children, by the rule of ``record/summed.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from anytree import PostOrderIter

from ..record.records import ModuleRecord
from ..record.summed import TreeValues
from .plot_metrics import PlotMetric

__all__ = ["Segment", "Layout", "layout_tree", "exclusive_values"]

# A child holding this share of its parent continues the trunk: it gets no colour of its own, its children do.
TRUNK_SHARE = 0.75


@dataclass
class Segment:
    """One drawn piece. ``kind`` is "module", "self" (the parent's own part) or "other" (small children grouped).

    ``record`` is the module for "module" and the parent for "self"/"other". ``branch`` numbers the colour
    family (-1: the trunk, drawn neutral) and ``shade`` is the depth below the head of the branch.
    """

    kind: str
    record: ModuleRecord
    depth: int
    start: float
    extent: float
    branch: int = -1
    shade: int = 0
    terminal: bool = True
    members: int = 1

    @property
    def name(self) -> str:
        return self.record.name

    def labels(self) -> tuple[str, ...]:
        """Candidate labels, longest first; a renderer shows the first that fits. A module shows its attribute
        name (its parent is drawn beside it), a list item as ``parent.index``."""
        if self.kind == "self":
            return ("(self)",)  # parenthesized: "self" is also a module name (BERT's attention.self)
        if self.kind == "other":
            return (f"other ({self.members})", "other")
        record = self.record
        short = record.short_name or record.type
        if short.isdigit() and record.parent is not None:
            short = f"{record.parent.short_name or record.parent.type}.{short}"
        return (short,)


@dataclass
class Layout:
    """The segments of one tree for one metric; ``total`` is the root's value, the span of the whole plot."""

    total: float
    segments: list[Segment] = field(default_factory=list)
    heads: list[ModuleRecord] = field(default_factory=list)  # one per colour branch, by branch number

    @property
    def max_depth(self) -> int:
        return max(segment.depth for segment in self.segments)


def layout_tree(
    root: ModuleRecord,
    metric: PlotMetric,
    fields: tuple[str, ...],
    depth: int | None = None,
    min_share: float = 0.0,
) -> Layout:
    """Lay out ``root`` down to ``depth`` (None: all levels). Children under ``min_share`` of the total are
    grouped into one "other" segment per parent when there are at least two of them."""
    values = _values(root, metric, fields)
    total = values[id(root)]
    if total <= 0:
        raise ValueError(f"nothing to plot: the model's {metric.name} ({metric.label}) is 0 in this profile; plot "
                         "another metric")
    trunk = _trunk(root, values)
    # Colour branches are numbered before any grouping, so a module has the same colour in every plot.
    heads = [
        child
        for record in (root, *root.descendants)
        if id(record) in trunk
        for child in record.children
        if id(child) not in trunk and values[id(child)] > 0
    ]
    layout = Layout(total, heads=heads)
    top = Segment("module", root, 0, 0.0, total)
    layout.segments.append(top)
    _expand(top, values, trunk, layout, depth, min_share * total)
    return layout


def _values(root: ModuleRecord, metric: PlotMetric, fields: tuple[str, ...]) -> dict[int, float]:
    """Inclusive values by record id; a container never called itself (a ModuleList) holds the sum of its
    children (``record/summed.py``), so the tree below it is still drawn."""
    tree = TreeValues(root)
    return {id(record): max(0.0, metric.value(tree.view(record), fields)) for record in PostOrderIter(root)}


def _trunk(root: ModuleRecord, values: dict[int, float]) -> set[int]:
    trunk = {id(root)}
    node = root
    while node.children:
        biggest = max(node.children, key=lambda child: values[id(child)])
        if values[id(biggest)] < TRUNK_SHARE * values[id(node)]:
            break
        trunk.add(id(biggest))
        node = biggest
    return trunk


def _expand(
    parent: Segment, values: dict[int, float], trunk: set[int], layout: Layout, depth: int | None, threshold: float
) -> None:
    record = parent.record
    children = [(child, values[id(child)]) for child in record.children if values[id(child)] > 0]
    if not children or (depth is not None and parent.depth >= depth):
        return
    parent.terminal = False
    claimed = sum(value for _, value in children)
    scale = min(1.0, parent.extent / claimed)
    small = [(child, value * scale) for child, value in children if value * scale < threshold]
    if len(small) < 2:
        small = []
    grouped = {id(child) for child, _ in small}
    position = parent.start
    for child, value in children:
        if id(child) in grouped:
            continue
        segment = Segment("module", child, parent.depth + 1, position, value * scale)
        if id(child) in trunk:
            segment.branch, segment.shade = -1, 0
        elif parent.branch == -1:
            segment.branch, segment.shade = _index(layout.heads, child), 0
        else:
            segment.branch, segment.shade = parent.branch, parent.shade + 1
        layout.segments.append(segment)
        position += segment.extent
        _expand(segment, values, trunk, layout, depth, threshold)
    other = sum(extent for _, extent in small)
    own = max(0.0, parent.start + parent.extent - position - other)
    for kind, extent, members in (("other", other, len(small)), ("self", own, 1)):
        if extent > 1e-12 * layout.total:
            layout.segments.append(
                Segment(kind, record, parent.depth + 1, position, extent, parent.branch, parent.shade, True, members)
            )
            position += extent


def _index(records: list[ModuleRecord], record: ModuleRecord) -> int:
    return next(index for index, candidate in enumerate(records) if candidate is record)


def exclusive_values(layout: Layout) -> list[tuple[ModuleRecord, float]]:
    """Each module's exclusive share of the total: a terminal module's span, else its self span. They add up to
    ``layout.total``; lay out with ``depth=None, min_share=0`` to have every module."""
    shares: dict[int, tuple[ModuleRecord, float]] = {}
    for segment in layout.segments:
        if segment.terminal and segment.kind != "other":
            record, value = shares.get(id(segment.record), (segment.record, 0.0))
            shares[id(record)] = (record, value + segment.extent)
    return list(shares.values())
