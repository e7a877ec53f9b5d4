"""The column vocabulary shared by the summary and the tables: one registry, validated at the boundary."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..records import ModuleRecord
from .units import format_count, format_ms, format_percent

__all__ = ["Column", "COLUMNS", "register_column", "resolve_columns", "DEFAULT_SUMMARY_COLUMNS"]


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

DEFAULT_SUMMARY_COLUMNS = ("forward", "backward")


def resolve_columns(names: Iterable[str] | None, default: tuple[str, ...] = DEFAULT_SUMMARY_COLUMNS) -> list[Column]:
    """Columns by name; an unknown name is a ValueError that lists the known ones."""
    chosen = []
    for name in default if names is None else names:
        if name not in COLUMNS:
            known = ", ".join(sorted(COLUMNS))
            raise ValueError(f"unknown column {name!r}; choose from: {known}")
        chosen.append(COLUMNS[name])
    return chosen
