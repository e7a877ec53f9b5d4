"""Summary columns: a column is a catalogue field (``record.fields``) shown as ``Label: value (share)``.

Columns are validated here, once, at the boundary: a name must be a declared field (or one of its short
spellings, ``forward`` for ``forward_ms``), or a field some record of this profile holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..record.fields import ALIASES, FIELDS, Field, canonical
from ..record.records import ModuleRecord
from .units import field_label, format_percent, format_value

__all__ = ["Column", "resolve_columns", "column_names", "counted_columns", "DEFAULT_SUMMARY_COLUMNS",
           "COUNTED_SUMMARY_COLUMNS"]

DEFAULT_SUMMARY_COLUMNS = ("forward_ms", "backward_ms")
# The default of a profile without times (a step on the meta device): of these, the ones it holds; calls if none.
COUNTED_SUMMARY_COLUMNS = ("flops", "params", "saved_bytes")


@dataclass(frozen=True)
class Column:
    """One field as the summary shows it."""

    field: Field

    @property
    def name(self) -> str:
        return self.field.name

    def text(self, record: ModuleRecord, root: ModuleRecord) -> str:
        field = self.field
        value = field.value(record, root)
        if field.of is not None:  # a share: the percentage is the value
            return f"{field.label}: {format_value(field.unit, value)}"
        shown = format_value(field.unit, value)
        if field.share_of is not None and value is not None:
            percent = format_percent(value, FIELDS[field.share_of].value(root))
            if percent != "—":
                shown += f" ({percent})"
        return f"{field.label}: {shown}"


def _records(root: ModuleRecord | None) -> list[ModuleRecord]:
    return [] if root is None else [root, *root.descendants]


def _undeclared(name: str, records: list[ModuleRecord]) -> Field | None:
    # A field a record holds but no meter declared (a loaded file's): shown as a count, text as is.
    if name.startswith("_") or not any(getattr(record, name, None) is not None for record in records):
        return None
    return Field(name, "count", field_label(name))


def column_names(records: list[ModuleRecord] | None = None) -> list[str]:
    """What a summary of these records can show: the short names, then every field some record has a value of
    (all declared fields when no records are given)."""
    shown = [f.name for f in FIELDS.values() if f.unit not in ("data", "text") and not f.detail
             and (not records or any(f.value(r, records[0]) is not None for r in records))]
    return [alias for alias, targets in ALIASES.items() if targets[0] in shown] + shown


def counted_columns(root: ModuleRecord) -> tuple[str, ...]:
    """``COUNTED_SUMMARY_COLUMNS`` that some record of ``root``'s tree holds (``("calls",)`` where none is)."""
    records = _records(root)
    held = tuple(name for name in COUNTED_SUMMARY_COLUMNS
                 if any(FIELDS[name].value(record) is not None for record in records))
    return held or ("calls",)


def resolve_columns(names: Iterable[str] | None, default: tuple[str, ...] = DEFAULT_SUMMARY_COLUMNS,
                    root: ModuleRecord | None = None) -> list[Column]:
    """Columns by name (canonical or short). A string is refused (``columns="forward"`` would otherwise read as
    its letters); an unknown name is a ValueError that lists the known ones."""
    if isinstance(names, str):
        raise TypeError(f"columns must be a list of field names, e.g. columns=({names!r},), not a string")
    records = _records(root)
    chosen: list[Column] = []
    for name in default if names is None else names:
        if not isinstance(name, str):
            raise TypeError(f"columns must be field names (strings), got {name!r}")
        resolved = canonical(name, present=lambda f: any(getattr(r, f, None) is not None for r in records))
        field = FIELDS.get(resolved) if resolved is not None else _undeclared(name, records)
        if field is None:
            raise ValueError(f"unknown column {name!r}; choose from: {', '.join(column_names(records))}")
        if all(column.field.name != field.name for column in chosen):
            chosen.append(Column(field))
    return chosen

