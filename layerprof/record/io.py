"""The saved form of a profile: a JSON document of the rows in ``named_modules()`` order plus ``meta``.

The file is the canonical rows form with a header::

    {"format": "layerprof.profile", "version": 1, "layerprof": "0.1.0", "meta": {...}, "records": [row, ...],
     "step_tables": {...}}

``step_tables``, on a profile the memory meter kept them on (``layerprof.record.step_tables``), lets a loaded
profile plan checkpoints as the live one did; a reader that does not know it ignores it.

Reading rebuilds the same tree (parents come before children in the rows), every field of every row, and the
call timings, so everything that reads a profile (summary, tables, trace, compare) works on a loaded one. This
module knows records only; ``layerprof.profile`` wraps the tree it returns in a Profile (``load``/``save``).
"""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Iterable

from .._check import check_int
from .._gc import gc_paused
from .._version import __version__
from .checks import REBUILT, check_row, shown
from .fields import FIELDS, catalogue_version
from .records import CallTiming, ModuleRecord, attach, tree_rows
from .step_tables import restore_step_tables, step_tables

__all__ = ["FORMAT", "FORMAT_VERSION", "document", "dumps", "read_document", "parse"]

FORMAT = "layerprof.profile"
FORMAT_VERSION = 1

# ModuleRecord's own attributes: a row key of one of them is set even where the catalogue does not declare it.
_CONSTRUCTED = frozenset(key for key in vars(ModuleRecord("", "")) if not key.startswith("_"))
_CALL_FIELDS = tuple(f.name for f in fields(CallTiming))


def document(tree: ModuleRecord, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready document of a record tree and its meta."""
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "layerprof": __version__,
        "meta": meta,
        "records": tree_rows(tree),
    }
    tables = step_tables(tree)
    if tables is not None:
        doc["step_tables"] = tables
    return doc


def dumps(tree: ModuleRecord, meta: dict[str, Any], indent: int | None = 1) -> str:
    """The document as JSON text. Values ``json`` cannot encode in ``meta`` are written as their ``str``.

    With an ``indent``, the header and ``meta`` are indented and each record is one line: readable, diffable
    line by line, and written by json's C encoder (an indented encoding is pure Python, several times slower).
    ``indent=None`` gives one line."""
    # Checked here, before any encoding: a string or a float indent (which ``json.dumps`` would take) failed
    # with "can't multiply sequence by non-int".
    indent = check_int("indent", indent, none=True)
    with gc_paused():
        return _dumps(tree, meta, indent)


def _dumps(tree: ModuleRecord, meta: dict[str, Any], indent: int | None) -> str:
    doc = document(tree, meta)
    if indent is None:
        return json.dumps(doc, default=str, ensure_ascii=False)
    rows = doc.pop("records")
    tables = doc.pop("step_tables", None)
    head = json.dumps({**doc, "records": []}, indent=indent, default=str, ensure_ascii=False)
    encode = json.JSONEncoder(default=str, ensure_ascii=False).encode
    body = ",\n".join(" " * (2 * indent) + encode(row) for row in rows)
    # The step's tables (numbers only, often more than the rows) on one line, by the C encoder.
    tail = "" if tables is None else ",\n" + " " * indent + '"step_tables": ' + encode(tables)
    return head[: head.rindex("[]")] + "[\n" + body + "\n" + " " * indent + "]" + tail + "\n}"


def _check_header(doc: Any) -> list[Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"not a layerprof profile: the JSON holds {shown(doc)}, not an object")
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a layerprof profile: 'format' is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"'version' must be an integer, got {shown(version)}; the file is damaged")
    if version < 1:
        raise ValueError(f"unsupported version {version}: profile versions start at 1; the file is damaged")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"unsupported version {version}: this layerprof ({__version__}) reads profile versions up to "
            f"{FORMAT_VERSION}; upgrade layerprof to load it"
        )
    if "records" not in doc:
        raise ValueError("the profile has no 'records'; the file is damaged")
    records = doc["records"]
    if not isinstance(records, list):
        raise ValueError(f"'records' must be a list, got {shown(records)}")
    if not records:
        raise ValueError("the profile holds no records")
    meta = doc.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"'meta' must be an object, got {shown(meta)}")
    if meta:
        _check_meta(meta)
    return records


def _real(value: Any) -> bool:
    """A finite number (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
            and abs(value) != float("inf"))


def _check_meta(meta: dict[str, Any]) -> None:
    """The meta entries layerprof itself reads, checked as the records are (a damaged or hand-edited file is named
    at load, not met as a crash in a reader later): the steps' times, the shapes, the counts of steps (the roofs:
    ``profile._parsed``, with ``check_peaks``, where none are given at load)."""
    for key in ("steps", "steps_seen", "warmup"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise ValueError(f"meta[{key!r}] must be a count (an integer >= 0), got {shown(value)}; the file is "
                             "damaged")
    for key in ("shapes", "step_ms"):  # (an environment that is no object names no machine: environment_in)
        value = meta.get(key)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"meta[{key!r}] must be an object, got {shown(value)}; the file is damaged")
    for passes, times in (meta.get("step_ms") or {}).items():
        if times is not None and not (isinstance(times, list) and all(map(_real, times))):
            raise ValueError(f"meta['step_ms'][{passes!r}] must be a list of numbers (ms per step), got "
                             f"{shown(times)}; the file is damaged")



# Per shape of row (its keys in order), those set as attributes; "version" is the catalogue's it was worked out for.
_SETTABLE: dict[Any, Any] = {"version": -1}


def _settable_keys(keys: tuple[str, ...]) -> tuple[str, ...]:
    """Of a row's keys, those set as attributes of its record (in the row's order): every field of the catalogue
    and every key a meter of another program wrote, but none that would overwrite the tree's own machinery
    (``parent``, ``children``, private state) or a derived field; worked out once per shape of row."""
    cache = _SETTABLE
    if cache["version"] != catalogue_version() or len(cache) > 256:
        cache.clear()
        cache["version"] = catalogue_version()
    settable = cache.get(keys)
    if settable is None:
        settable = cache[keys] = tuple(key for key in keys if key not in REBUILT and _settable(key))
    return settable


def _settable(key: str) -> bool:
    # A stored field of the catalogue is one, even where the class gives it a default.
    if key.startswith("_"):
        return False
    declared = FIELDS.get(key)
    return (declared is not None and not declared.derived) or not hasattr(ModuleRecord, key) or key in _CONSTRUCTED


def _record(row: dict[str, Any], parent: ModuleRecord | None) -> ModuleRecord:
    """The record of a row found good, attached to its parent."""
    record = ModuleRecord(row["name"], row["type"], row.get("extra_repr", ""))
    if parent is not None:
        attach(record, parent)  # the checks made sure it is a new child, no loop
    aliases = row.get("aliases")
    if aliases:
        record.aliases = list(aliases)
    timings = row.get("call_times")
    if timings:
        record.call_times = [
            CallTiming(*timing.values()) if tuple(timing) == _CALL_FIELDS
            else CallTiming(**{k: v for k, v in timing.items() if k in _CALL_FIELDS}) for timing in timings
        ]
    settable = _settable_keys(tuple(row))
    # Fields added by meters come back as attributes, whatever their names.
    record.__dict__.update(zip(settable, map(row.__getitem__, settable)))
    return record


def _steps_run_of_old(records: Iterable[ModuleRecord]) -> None:
    """``steps_run`` of a file saved before it existed (its rows have none), which read as 0, "ran in no step",
    for every module, in every table and export. Such a file's figures are over the steps a module ran: a module
    called in it reads as run in every recorded step, one never called in none."""
    for record in records:
        record.steps_run = record.steps if record.calls else 0


def read_document(doc: Any, non_finite: bool = False) -> tuple[ModuleRecord, dict[str, Any]]:
    """The record tree and meta of a parsed document (see ``document``). Anything that is not a profile this
    version reads is a ValueError naming the first thing wrong, before any record is used. ``non_finite``: the
    text held a NaN or an Infinity, which layerprof never writes: every value of every row is checked, so that one
    in a record's figures is named (the renderers read those; a meter of another program may keep one in a field
    of its own, or in the meta, which are its business)."""
    records = _check_header(doc)
    by_name: dict[str, ModuleRecord] = {}
    with gc_paused():
        for index, row in enumerate(records):
            by_name[row["name"]] = _record(row, check_row(index, row, by_name, each=non_finite))
    if "steps_run" not in records[0]:
        _steps_run_of_old(by_name.values())
    root = next(iter(by_name.values()))
    restore_step_tables(root, doc.get("step_tables"), by_name)
    return root, doc.get("meta") or {}


def parse(text: str) -> tuple[ModuleRecord, dict[str, Any]]:
    """The record tree and meta of JSON text written by ``dumps``; a ValueError when it is not one."""
    if not text.strip():
        raise ValueError("the file is empty, not a layerprof profile")
    constants: list[str] = []  # NaN, Infinity and -Infinity, which Python's json reads and a profile never holds

    def constant(token: str) -> float:
        constants.append(token)
        return float(token)

    with gc_paused():  # the parsed rows are thousands of new objects, as are the records made from them
        try:
            doc = json.loads(text, parse_constant=constant)
        except json.JSONDecodeError as error:
            raise ValueError(f"not a layerprof profile: invalid JSON ({error})") from None
        except RecursionError:
            raise ValueError("not a layerprof profile: JSON nested too deeply") from None
        return read_document(doc, non_finite=bool(constants))
