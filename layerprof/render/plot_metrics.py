"""What a plot can show: one small table from metric names to the record fields that hold them, with units.

Every field is an inclusive value (the module with its children); self values are derived over the tree by the
layout (``plot_layout.py``), never read from the records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..record.records import ModuleRecord
from .units import format_bytes, format_count, format_flops, format_ms

__all__ = ["PlotMetric", "PLOT_METRICS", "resolve_metric", "root_of"]


@dataclass(frozen=True)
class PlotMetric:
    """A plottable quantity: the record fields summed into it, how to print it, and how to get it recorded.

    ``fields`` are summed; ``alternatives`` are tried in order when a metric can be recorded under one of
    several fields (memory: the first field that some record holds is used).
    """

    name: str
    label: str
    fields: tuple[str, ...]
    format: Callable[[float | None], str]
    hint: str
    alternatives: tuple[tuple[str, ...], ...] = ()

    def value(self, record: ModuleRecord, fields: tuple[str, ...] | None = None) -> float:
        """The record's inclusive value; a field that was not measured on this record counts as 0."""
        total = 0.0
        for field in fields or self.fields:
            value = getattr(record, field, None)
            if value is not None:
                total += float(value)
        return total


_TIME_HINT = "call the model (and .backward() for backward time) inside the `with LayerProf(model)` block"

PLOT_METRICS: dict[str, PlotMetric] = {
    metric.name: metric
    for metric in (
        PlotMetric("forward", "forward time", ("forward_ms",), format_ms, _TIME_HINT),
        PlotMetric("backward", "backward time", ("backward_ms",), format_ms, _TIME_HINT),
        PlotMetric("total", "forward + backward time", ("forward_ms", "backward_ms"), format_ms, _TIME_HINT),
        PlotMetric(
            "flops", "FLOPs (forward + backward)", ("flops_forward", "flops_backward"), format_flops,
            "run with LayerProf(model, metrics=('flops',))",
        ),
        PlotMetric("params", "parameters", ("params",), format_count, "run with LayerProf(model, metrics=('params',))"),
        PlotMetric(
            "memory", "memory", ("saved_bytes",), format_bytes, "run with LayerProf(model, metrics=('memory',))",
            alternatives=(("saved_bytes",), ("activation_bytes",)),
        ),
    )
}


def root_of(profile: object) -> ModuleRecord:
    """The root record of a Profile, a finished LayerProf, or a ModuleRecord itself."""
    if isinstance(profile, ModuleRecord):
        return profile.root
    tree = getattr(profile, "tree", None)
    if isinstance(tree, ModuleRecord):
        return tree
    raise TypeError(
        f"expected a Profile, a finished LayerProf or a ModuleRecord, got {type(profile).__name__}; "
        "plot after the `with LayerProf(model) as prof:` block has exited"
    )


def _recorded(records: Iterable[ModuleRecord], field: str) -> bool:
    return any(getattr(record, field, None) is not None for record in records)


def resolve_metric(name: str, root: ModuleRecord) -> tuple[PlotMetric, tuple[str, ...]]:
    """The metric called ``name`` and the fields it reads on this tree.

    Raises ValueError for an unknown name (listing the known ones) and for a metric that this profile did not
    record (naming the missing field and how to record it).
    """
    metric = PLOT_METRICS.get(name)
    if metric is None:
        raise ValueError(f"unknown plot metric {name!r}; choose from: {', '.join(PLOT_METRICS)}")
    records = list(root.descendants) + [root]
    for fields in metric.alternatives or (metric.fields,):
        present = tuple(field for field in fields if _recorded(records, field))
        if present:
            return metric, present
    missing = " or ".join(repr(fields[0]) for fields in metric.alternatives) or repr(metric.fields[0])
    raise ValueError(
        f"cannot plot metric {name!r}: no record of this profile holds the field {missing}; {metric.hint}"
    )
