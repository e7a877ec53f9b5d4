"""What each row of a saved profile must hold, checked before any record is made from it.

Every value is checked against what the field catalogue says its field holds, and the first wrong one is a
ValueError that says which record, which field and what it holds instead. Checking value by value costs more than
reading the file, so a row is first compared with the rows already found good: whether a value is of the right
kind depends on its key and its type alone, so a row with the same keys holding values of the same types as a good
row passes those checks too, and only what depends on the values themselves (names, parents, entries of lists and
objects, ``calls >= 0``) is looked at. Anything else, and anything unusual, goes through the checks one by one,
which name what is wrong.
"""
from __future__ import annotations

import math

import json
from typing import Any

from .fields import FIELDS, catalogue_version
from .records import ModuleRecord

__all__ = ["REBUILT", "CALL_KINDS", "shown", "check_row"]

# Row keys that the tree itself answers (depth, parent) or that the constructor takes.
REBUILT = frozenset({"name", "type", "extra_repr", "depth", "parent", "aliases", "call_times"})

_NUMBER_UNITS = ("ms", "bytes", "flops", "flop/s", "macs", "count", "percent")
# Fields of unit "data" whose shape renderers rely on.
_CONTAINER_FIELDS = {
    "param_dtypes": "dict", "shared_with": "dict", "unknown_ops": "dict",
    **{f"{side}_{what}": "list" for side in ("input", "output") for what in ("dtypes", "paths")},
}
# What the entries of the known object fields hold: counts by name, or lists of qualified names.
_ENTRY_KINDS = {"param_dtypes": "number!", "unknown_ops": "number!", "shared_with": "list!"}
# Every CallTiming field, and what it holds (a kind ending in ``!`` refuses null).
CALL_KINDS = {"forward_start_ms": "number!", "forward_ms": "number!", "backward_start_ms": "number",
              "backward_ms": "number", "recompute": "bool", "step": "int", "recursive": "bool"}


def _kind(key: str) -> str:
    """What a row field must hold, from its unit in the catalogue: "number" (or null), "list", "dict", or "any"
    for fields this version does not declare (a meter of another program)."""
    declared = FIELDS.get(key)
    if declared is None:
        return "any"
    if declared.unit in _NUMBER_UNITS:
        return "number"
    if declared.unit == "shapes":
        return "list"
    return _CONTAINER_FIELDS.get(key, "any")


def shown(value: Any) -> str:
    """A value as the file has it, cut to 40 characters, and what JSON calls its type."""
    text = json.dumps(value, default=str)
    return (text if len(text) <= 40 else text[:37] + "...") + f" ({_JSON_NAMES.get(type(value), type(value).__name__)})"


_JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "a boolean", list: "a list",
               dict: "an object", type(None): "null"}


_NUMBERS = (int, float)  # by exact type: a bool is an int to isinstance, and not a number here


def _finite_number(value: Any) -> bool:
    """An int or a finite float (JSON's NaN and Infinity, which Python reads and writes, are no figure here)."""
    return (type(value) in _NUMBERS or (isinstance(value, _NUMBERS) and not isinstance(value, bool))) and (
        type(value) is int or math.isfinite(value))


_ACCEPTS: dict[str, Any] = {
    "number": lambda value: value is None or _finite_number(value),
    "number!": _finite_number,
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "bool": lambda value: isinstance(value, bool),
    "list": lambda value: value is None or isinstance(value, list),
    "list!": lambda value: isinstance(value, list),
    "dict": lambda value: value is None or isinstance(value, dict),
    "text": lambda value: isinstance(value, str),
    "any": lambda value: True,
}
_WANTED = {"number": "a finite number or null", "number!": "a finite number", "int": "an integer", "bool": "true or false",
           "list": "a list or null", "list!": "a list", "dict": "an object or null", "text": "a string"}


def _check_value(where: str, kind: str, value: Any) -> None:
    if not _ACCEPTS[kind](value):
        raise ValueError(f"{where} must be {_WANTED[kind]}, got {shown(value)}")


# Per state of the catalogue: each field's kind, and the (keys, value types) of rows found good.
_CACHES: dict[str, Any] = {"version": -1, "kinds": {}, "good_rows": set()}
# (keys, value types) of call timings found good: these do not depend on the catalogue.
_GOOD_TIMINGS: set[tuple[tuple[Any, ...], tuple[type, ...]]] = set()
_MOST_SHAPES = 4096  # a bound on what the caches of shapes hold, whatever files a process reads


def _cached(name: str) -> Any:
    """A cache of what the catalogue says, emptied when a field is declared."""
    if _CACHES["version"] != catalogue_version():
        _CACHES.update(version=catalogue_version(), kinds={}, good_rows=set())
    return _CACHES[name]


def check_row(index: int, row: Any, by_name: dict[str, ModuleRecord], each: bool = False) -> ModuleRecord | None:
    """The parent record of row ``index`` (None for the root) once the row is found good; a ValueError naming
    the first thing wrong with it otherwise. ``by_name`` holds the records of the rows before it. ``each``: check
    every value, even in a row shaped as a good one (the document holds a value its shape does not tell from a good
    one: a NaN)."""
    shape = (tuple(row), tuple(map(type, row.values()))) if type(row) is dict else None
    if each or shape is None or shape not in _cached("good_rows") or not _values_good(index, row, by_name):
        _check_each_value(index, row, by_name)
        if shape is not None:
            _remember(_cached("good_rows"), shape)
            for timing in row.get("call_times") or ():
                if type(timing) is dict:
                    _remember(_GOOD_TIMINGS, (tuple(timing), tuple(map(type, timing.values()))))
    return by_name[row["parent"]] if index else None


def _remember(shapes: set[Any], shape: Any) -> None:
    if len(shapes) >= _MOST_SHAPES:
        shapes.clear()
    shapes.add(shape)


_TEXT = {str}
_NUMBER_TYPES = {int, float}
_COUNTS = tuple(key for key, kind in _ENTRY_KINDS.items() if kind == "number!")
_NAME_LISTS = tuple(key for key, kind in _ENTRY_KINDS.items() if kind == "list!")


def _values_good(index: int, row: dict[str, Any], by_name: dict[str, ModuleRecord]) -> bool:
    """For a row whose keys and value types are those of a good row: whether what depends on the values is good
    too. False sends the row through the checks one by one, which say what is wrong (or find it good)."""
    name = row["name"]
    if name in by_name:
        return False
    parent_name = row.get("parent")
    if index:
        if type(parent_name) is not str or parent_name not in by_name:
            return False
        head, dot, short = name.rpartition(".")  # the parent's name, a dot (none under the root), one part
        if not short or head != parent_name or (dot and not parent_name):
            return False
    elif parent_name is not None:
        return False
    aliases = row.get("aliases")
    if aliases and not set(map(type, aliases)) <= _TEXT:
        return False
    timings = row.get("call_times")
    if timings:
        good_timings = _GOOD_TIMINGS
        for timing in timings:
            if type(timing) is not dict or (tuple(timing), tuple(map(type, timing.values()))) not in good_timings:
                return False
    for key in _COUNTS:
        entries = row.get(key)
        if entries and (type(entries) is not dict or not set(map(type, entries.values())) <= _NUMBER_TYPES):
            return False
    for key in _NAME_LISTS:
        entries = row.get(key)
        if entries and (type(entries) is not dict or any(
                type(entry) is not list or not set(map(type, entry)) <= _TEXT for entry in entries.values())):
            return False
    for key in _COUNTERS:
        value = row.get(key, 0)
        if type(value) not in _NUMBERS or value < 0:
            return False
    return True


# Counts every record has (0 where nothing ran): a null one is a damaged file, not "not measured".
_COUNTERS = ("calls", "steps", "steps_run")


def _check_each_value(index: int, row: Any, by_name: dict[str, ModuleRecord]) -> None:
    """Every check of a row, one value at a time; the first that fails is the ValueError."""
    if not isinstance(row, dict):
        raise ValueError(f"record {index} must be an object, got {shown(row)}")
    for key in ("name", "type"):
        if key not in row:
            raise ValueError(f"record {index} has no {key!r}")
        _check_value(f"record {index}: {key!r}", "text", row[key])
    name = row["name"]
    where = f"record {name!r}"
    if name in by_name:
        raise ValueError(f"{where} appears twice")
    parent_name = row.get("parent")
    if index == 0:
        if parent_name is not None:
            raise ValueError(f"the first record must be the root (parent null), got {where} with parent {parent_name!r}")
    else:
        if parent_name is None:
            raise ValueError(f"two roots in one profile: {next(iter(by_name))!r} and {name!r}")
        _check_value(f"{where}: 'parent'", "text", parent_name)
        if parent_name not in by_name:
            raise ValueError(f"{where} comes before its parent {parent_name!r}; the file is damaged")
        prefix = f"{parent_name}." if parent_name else ""
        short = name[len(prefix):]
        if not name.startswith(prefix) or not short or "." in short:
            raise ValueError(f"{where} cannot be a child of {parent_name!r}: names are the parent's plus one part")
    _check_value(f"{where}: 'extra_repr'", "text", row.get("extra_repr", ""))
    aliases = row.get("aliases", [])
    _check_value(f"{where}: 'aliases'", "list", aliases)
    for alias in aliases or ():
        _check_value(f"{where}: an alias", "text", alias)
    timings = row.get("call_times", [])
    _check_value(f"{where}: 'call_times'", "list", timings)
    for timing in timings or ():
        _check_value(f"{where}: a call_times entry", "dict", timing)
        if timing is None:
            raise ValueError(f"{where}: a call_times entry must be an object, got null")
        for key, kind in CALL_KINDS.items():
            if key in timing or kind.endswith("!"):
                _check_value(f"{where}: call_times {key!r}", kind, timing.get(key))
    kinds = _cached("kinds")
    for key, value in row.items():
        if key in REBUILT:
            continue
        kind = kinds.get(key) or kinds.setdefault(key, _kind(key))
        _check_value(f"{where}: field {key!r}", kind, value)
        if key in _ENTRY_KINDS and value:
            for entry_key, entry in value.items():
                _check_value(f"{where}: field {key!r} entry {entry_key!r}", _ENTRY_KINDS[key], entry)
                for item in entry if isinstance(entry, list) else ():
                    _check_value(f"{where}: field {key!r} entry {entry_key!r}", "text", item)
        if key in _COUNTERS and (value is None or value < 0):
            raise ValueError(f"{where}: field {key!r} must be a number >= 0, got {shown(value)}")
