"""The step's storage tables and memory timeline: what a live profile's root record keeps beside its numbers for the
checkpoint planner, and their saved form.

The memory meter keeps, on the root record of a profile it made, one *storage table* per forward (the calls, their
parents, and each storage saved for backward or taken as input: its size, its savers, its takers; with the reader on
the step's device also each call's four boundaries on the step's memory log) and the *timeline* (the log's levels
and interval peaks). The planner replays the tables to know exactly what a set of wrapped modules frees, plans runs
of a ``Sequential``'s children, and predicts a plan's step peak from the timeline. They are lists of numbers, so a
saved profile carries them (``"step_tables"`` in the JSON document, beside ``records``) and a loaded one plans as
the live one did. Read back, they are checked whole before any is kept: a damaged table is a ValueError naming it,
not an IndexError in a later plan.
"""
from __future__ import annotations

from typing import Any, Collection

from .checks import shown

__all__ = ["STORAGES_ATTRIBUTE", "TIMELINE_ATTRIBUTE", "step_tables", "restore_step_tables"]

# The root record's private attributes: ``storage_table`` of each forward, and the step's memory log.
STORAGES_ATTRIBUTE = "_checkpoint_storages"
TIMELINE_ATTRIBUTE = "_memory_timeline"

_TABLE_KEYS = ("names", "parents", "sizes", "savers", "inputs")


def step_tables(root: Any) -> dict[str, Any] | None:
    """The root's tables as the saved document holds them, or None where it keeps none."""
    storages = root.__dict__.get(STORAGES_ATTRIBUTE)
    if not storages:
        return None
    found: dict[str, Any] = {"storages": storages}
    timeline = root.__dict__.get(TIMELINE_ATTRIBUTE)
    if timeline is not None:
        found["timeline"] = timeline
    return found


def restore_step_tables(root: Any, saved: Any, names: Collection[str]) -> None:
    """Keep a saved document's ``step_tables`` on ``root`` (whose tree holds the modules ``names``), once every
    part is checked; a ValueError naming the first thing wrong."""
    if saved is None:
        return
    if not isinstance(saved, dict) or not isinstance(saved.get("storages"), list) or not saved["storages"]:
        raise ValueError(f"'step_tables' must be an object with a non-empty list 'storages', got {shown(saved)}")
    timeline = saved.get("timeline")
    levels = None if timeline is None else _timeline(timeline)
    for index, table in enumerate(saved["storages"]):
        _table(f"step_tables.storages[{index}]", table, names, levels)
    root.__dict__[STORAGES_ATTRIBUTE] = saved["storages"]
    if timeline is not None:
        root.__dict__[TIMELINE_ATTRIBUTE] = timeline


def _timeline(timeline: Any) -> int:
    """The number of levels of a checked timeline."""
    where = "step_tables.timeline"
    if not isinstance(timeline, dict) or not isinstance(timeline.get("device"), str):
        raise ValueError(f"'{where}' must be an object with a 'device' string, got {shown(timeline)}")
    for key in ("levels", "peaks"):
        _ints(f"{where}.{key}", timeline.get(key), 0, None)
    if len(timeline["peaks"]) != len(timeline["levels"]):
        raise ValueError(f"'{where}': {len(timeline['peaks'])} peaks for {len(timeline['levels'])} levels; the file "
                         "is damaged")
    return len(timeline["levels"])


def _table(where: str, table: Any, names: Collection[str], levels: int | None) -> None:
    if not isinstance(table, dict) or any(key not in table for key in _TABLE_KEYS):
        raise ValueError(f"'{where}' must be an object with {', '.join(_TABLE_KEYS)}, got {shown(table)}")
    calls = table["names"]
    if not isinstance(calls, list) or any(not isinstance(name, str) or name not in names for name in calls):
        raise ValueError(f"'{where}.names' must list modules of the profile; the file is damaged")
    parents = table["parents"]
    _ints(f"{where}.parents", parents, -1, None)
    if len(parents) != len(calls) or any(parent >= i for i, parent in enumerate(parents)):
        raise ValueError(f"'{where}.parents' must give each call's parent call before it (-1 for none); the file "
                         "is damaged")
    _ints(f"{where}.sizes", table["sizes"], 0, None)
    for key in ("savers", "inputs"):
        lists = table[key]
        if not isinstance(lists, list) or len(lists) != len(table["sizes"]):
            raise ValueError(f"'{where}.{key}' must be a list per storage ({len(table['sizes'])}); the file is "
                             "damaged")
        for i, calls_of in enumerate(lists):
            _ints(f"{where}.{key}[{i}]", calls_of, 0, len(calls) - 1)
    if "held_elsewhere" in table:
        _ints(f"{where}.held_elsewhere", table["held_elsewhere"], 0, len(table["sizes"]) - 1)
    if "bounds" in table:  # the planner reads the key's presence: a null is as damaged as a wrong list
        bounds = table["bounds"]
        if not isinstance(bounds, list) or len(bounds) != len(calls):
            raise ValueError(f"'{where}.bounds' must hold four marks per call; the file is damaged")
        for i, marks in enumerate(bounds):
            _ints(f"{where}.bounds[{i}]", marks, 0, None if levels is None else levels - 1)
            if len(marks) != 4:
                raise ValueError(f"'{where}.bounds[{i}]' must hold four marks; the file is damaged")


_INT64_MAX = 2**63 - 1  # the planner reads the tables into int64 arrays


def _ints(where: str, values: Any, least: int, most: int | None) -> None:
    """A list of integers from ``least`` to ``most`` (inclusive; None: up to what an int64 holds)."""
    top = _INT64_MAX if most is None else most
    if not isinstance(values, list) or any(type(v) is not int or v < least or v > top for v in values):
        bound = f"from {least}" + ("" if most is None else f" to {most}")
        raise ValueError(f"'{where}' must be a list of integers {bound}; the file is damaged")
