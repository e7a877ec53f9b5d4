"""The column vocabulary shared by the summary and the tables: one registry, validated at the boundary."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..record.records import ModuleRecord
from .units import field_label, format_count, format_field, format_ms, format_percent

__all__ = [
    "Column", "ShareColumn", "COLUMNS", "register_column", "resolve_columns", "field_column",
    "DEFAULT_SUMMARY_COLUMNS",
]


@dataclass(frozen=True)
class Column:
    """A named quantity of a record: how to read it, how to print it, and (optionally) what it is a share of."""

    name: str
    label: str
    value: Callable[[ModuleRecord], float | None]
    format: Callable[[float | None], str]
    share_of: Callable[[ModuleRecord], float | None] | None = None  # given the root, the whole for a percentage

    def text(self, record: ModuleRecord, root: ModuleRecord) -> str:
        value = self.value(record)
        shown = self.format(value)
        if self.share_of is not None and value is not None:
            percent = format_percent(value, self.share_of(root))
            if percent != "—":
                shown += f" ({percent})"
        return f"{self.label}: {shown}"


COLUMNS: dict[str, Column] = {}


def register_column(column: Column) -> Column:
    """Add a column to the vocabulary (metrics call this for the fields they fill)."""
    COLUMNS[column.name] = column
    return column


def _step_ms(root: ModuleRecord) -> float | None:
    return root.total_ms


for _name, _label, _field in (
    ("forward", "Forward Time", "forward_ms"),
    ("backward", "Backward Time", "backward_ms"),
    ("self_forward", "Self Forward", "self_forward_ms"),
    ("self_backward", "Self Backward", "self_backward_ms"),
    ("recompute", "Recompute", "recompute_ms"),
):
    register_column(Column(_name, _label, lambda r, f=_field: getattr(r, f), format_ms, _step_ms))
register_column(Column("total", "Total Time", lambda r: r.total_ms, format_ms, _step_ms))
register_column(Column("calls", "Calls", lambda r: float(r.calls), format_count))


def _self_total_ms(record: ModuleRecord) -> float | None:
    if record.self_forward_ms is None and record.self_backward_ms is None:
        return None
    return (record.self_forward_ms or 0.0) + (record.self_backward_ms or 0.0)


def _mean_forward_ms(record: ModuleRecord) -> float | None:
    return None if record.forward_ms is None or not record.calls else record.forward_ms / record.calls


@dataclass(frozen=True)
class ShareColumn(Column):
    """A column that shows only the percentage of the whole (e.g. a module's share of the step's time)."""

    def text(self, record: ModuleRecord, root: ModuleRecord) -> str:
        whole = self.share_of(root) if self.share_of is not None else None
        return f"{self.label}: {format_percent(self.value(record), whole)}"


register_column(Column("self_total", "Self Time", _self_total_ms, format_ms, _step_ms))
register_column(Column("mean_forward", "Forward/Call", _mean_forward_ms, format_ms))
register_column(ShareColumn("time_percent", "Time", lambda r: r.total_ms, format_ms, _step_ms))
register_column(ShareColumn("self_percent", "Self Time", _self_total_ms, format_ms, _step_ms))
register_column(ShareColumn("forward_percent", "Forward", lambda r: r.forward_ms, format_ms, lambda t: t.forward_ms))
register_column(
    ShareColumn("backward_percent", "Backward", lambda r: r.backward_ms, format_ms, lambda t: t.backward_ms)
)


def field_column(field: str) -> Column:
    """A column for any numeric record field without a registered column (``params``, ``activation_bytes``...),
    printed in the unit its name states (see ``units.format_field``)."""
    return Column(field, field_label(field), lambda r: getattr(r, field, None), lambda v: format_field(field, v))

DEFAULT_SUMMARY_COLUMNS = ("forward", "backward")


def _record_has(root: ModuleRecord | None, field: str) -> bool:
    if root is None:
        return False
    return any(getattr(record, field, None) is not None for record in (root, *root.descendants))


def resolve_columns(names: Iterable[str] | None, default: tuple[str, ...] = DEFAULT_SUMMARY_COLUMNS,
                    root: ModuleRecord | None = None) -> list[Column]:
    """Columns by name; given the tree's ``root``, a record field without a registered column is shown as is.
    An unknown name is a ValueError that lists the known ones."""
    chosen = []
    for name in default if names is None else names:
        if name not in COLUMNS and _record_has(root, name) and not name.startswith("_"):
            chosen.append(field_column(name))
            continue
        if name not in COLUMNS:
            known = ", ".join(sorted(COLUMNS))
            raise ValueError(f"unknown column {name!r}; choose from: {known}")
        chosen.append(COLUMNS[name])
    return chosen
