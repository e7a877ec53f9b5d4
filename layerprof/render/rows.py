"""Queries over the canonical rows (``ModuleRecord.to_dict()``): select, aggregate by type, top-k.

Rows are treated generically: any key whose values are numbers is a numeric field, so fields that meters add
(``params``, ``flops_forward``, ``activation_bytes``, ...) are queried, summed and ranked like the times.
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Iterable

from .._check import check_bool, check_int, check_names
from ..record.fields import FIELDS, derived_fields, detail_fields
from ..record.records import ModuleRecord
from ..record.summed import TreeValues, ran

__all__ = ["is_number", "numeric_fields", "derived_names", "FILTERS", "select", "record_rows", "value_of",
           "RowView", "with_fields", "aggregate_by_type", "AGGREGATE_COLUMNS", "top_records"]


def is_number(value: Any) -> bool:
    """True for ints and floats, False for bools, None, text and lists."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def derived_names() -> list[str]:
    """Fields computed from a record but not stored in its row (``total_ms``, ``flops``...)."""
    return [field.name for field in derived_fields()]


def numeric_fields(rows: Iterable[dict[str, Any]], skip: Iterable[str] = ("depth",)) -> list[str]:
    """Keys holding a number in at least one row, in the order they first appear. Detail fields (statistics
    over steps, ``steps``) sit beside the means in every row but are left out: shown only when asked by name."""
    skipped = set(skip) | set(detail_fields())
    seen: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key not in skipped and key not in seen and is_number(value):
                seen[key] = None
    return list(seen)


def value_of(record: ModuleRecord, field: str, row: dict[str, Any] | None = None, root: Any = None) -> Any:
    """A field of a record: from its row, else computed by its catalogue entry (derived fields, shares of ``root``:
    the record's root, or what ``whole_of`` gives for it), else None."""
    if row is not None and field in row:
        return row[field]
    declared = FIELDS.get(field)
    if declared is not None:
        return declared.value(record, record.root if root is None else root)
    return getattr(record, field, None)


def whole_of(root: ModuleRecord) -> Any:
    """What shares of ``root``'s tree are of: the root, or for a root never called itself (a trainer's step calls
    ``model.net(x)``) a view of it that reads its top-level modules' sums, as the summary's total does."""
    if ran(root):
        return root
    return TreeValues(root).view(root)


class RowView:
    """A row read as a record (``view.flops_forward`` is ``row.get("flops_forward")``), so that a catalogue field
    computes over rows that have no record behind them: an aggregate's, a hand-made table's. A share of the model
    or a roofline figure needs the tree, and is None here."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row

    def __getattr__(self, name: str) -> Any:
        return self.row.get(name)


def with_fields(rows: list[dict[str, Any]], names: Iterable[str],
                records: list[ModuleRecord] | None = None) -> list[dict[str, Any]]:
    """``rows`` with the catalogue fields ``names`` computed into each (new dicts; the rows are left as they are),
    from ``records`` (one per row) where the rows are of records, else from the rows themselves."""
    names = list(names)
    if not names:
        return rows
    if records is None:
        return [{**row, **{name: value_of(RowView(row), name, row) for name in names}} for row in rows]
    wholes: dict[int, Any] = {}  # id(root) -> whole_of(root), once per tree
    done = []
    for row, record in zip(rows, records):
        root = record.root
        whole = wholes.get(id(root))
        if whole is None:
            whole = wholes[id(root)] = whole_of(root)
        done.append({**row, **{name: value_of(record, name, row, whole) for name in names}})
    return done


# The keyword filters of ``select`` (and of every Profile table method).
FILTERS = ("depth", "max_depth", "type", "name", "leaves", "called")


def _as_set(value: str | Iterable[str] | None) -> set[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if "," in value:  # no class name holds a comma: several names in one string
            parts = tuple(part.strip() for part in value.split(",") if part.strip())
            raise ValueError(f"type= takes a class name or several in a tuple: write type={parts!r}, not {value!r}")
        return {value}
    if isinstance(value, type):
        raise TypeError(f"type= takes class names, e.g. type={value.__name__!r}, not the class {value.__name__}")
    names = check_names("type", value, "('Linear', 'Conv2d')")
    return set(names)


def select(
    records: Iterable[ModuleRecord],
    *,
    depth: int | None = None,
    max_depth: int | None = None,
    type: str | Iterable[str] | None = None,
    name: str | None = None,
    leaves: bool = False,
    called: bool = False,
) -> list[ModuleRecord]:
    """Records that pass every filter given.

    Args:
        depth: exactly this depth (the root is 0). max_depth: at most this depth.
        type: a class name (``"Conv2d"``) or several. name: a glob on the qualified name (``"layer1.*"``).
        leaves: only modules without children. called: only modules that ran at least once.
    """
    depth = check_int("depth", depth, none=True)
    max_depth = check_int("max_depth", max_depth, none=True)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a glob on qualified names such as 'layer1.*', got {name!r}")
    leaves, called = check_bool("leaves", leaves), check_bool("called", called)
    types = _as_set(type)
    chosen = []
    for record in records:
        if depth is not None and record.depth != depth:
            continue
        if max_depth is not None and record.depth > max_depth:
            continue
        if types is not None and record.type not in types:
            continue
        if name is not None and not fnmatchcase(record.name, name):
            continue
        if leaves and record.children:
            continue
        if called and record.calls == 0:
            continue
        chosen.append(record)
    return chosen


def record_rows(records: Iterable[ModuleRecord]) -> list[dict[str, Any]]:
    """The canonical row of each record."""
    return [record.to_dict() for record in records]


def _combine(field: str, values: list[float]) -> float | None:
    # A peak of several modules is the largest of them, not their sum; every other cost adds up.
    declared = FIELDS.get(field)
    how = "sum" if declared is None else declared.combine
    if how == "none":
        return None
    return max(values) if how == "max" else sum(values)


# What every aggregate row holds, whatever its modules measured: the columns of an aggregate of no module.
AGGREGATE_COLUMNS = ("type", "modules", "calls", "total_ms")


def aggregate_by_type(records: Iterable[ModuleRecord]) -> list[dict[str, Any]]:
    """One row per module type: ``type``, ``modules`` (how many), ``calls`` and every numeric field summed
    (``*peak*`` fields take the maximum), plus ``total_ms``. Rows are in order of first appearance.

    Inclusive times of a type that nests in itself (a Sequential inside a Sequential) are counted twice; use
    ``self_*`` fields, or leaves only, for a breakdown that adds up to the step.
    """
    grouped: dict[str, list[tuple[ModuleRecord, dict[str, Any]]]] = {}
    for record in records:
        grouped.setdefault(record.type, []).append((record, record.to_dict()))
    result = []
    for type_name, members in grouped.items():
        rows = [row for _, row in members]
        fields = [f for f in numeric_fields(rows, skip=("depth", "calls")) if f not in derived_names()]
        out: dict[str, Any] = {"type": type_name, "modules": len(members), "calls": sum(r["calls"] for r in rows)}
        for field in [*fields, "total_ms"]:
            values = [value_of(record, field, row) for record, row in members]
            present = [v for v in values if is_number(v)]
            out[field] = _combine(field, present) if present else None
        result.append(out)
    return result


def top_records(records: Iterable[ModuleRecord], k: int, by: str) -> list[ModuleRecord]:
    """The ``k`` records with the largest ``by`` (a row field or ``total_ms``); records without it are left out."""
    k = check_int("k", k)
    scored = []
    for record in records:
        value = value_of(record, by)
        if is_number(value):
            scored.append((value, record))
    if not scored:
        return []
    scored.sort(key=lambda pair: pair[0], reverse=True)  # stable: ties keep named_modules() order
    return [record for _, record in scored[:k]]
