"""The saved form of a profile: a JSON document of the rows in ``named_modules()`` order plus ``meta``.

The file is the canonical rows form with a header::

    {"format": "layerprof.profile", "version": 1, "layerprof": "0.1.0", "meta": {...}, "records": [row, ...]}

Reading rebuilds the same tree (parents come before children in the rows), every field of every row, and the
call timings, so everything that reads a profile (summary, tables, trace, compare) works on a loaded one. This
module knows records only; ``layerprof.profile`` wraps the tree it returns in a Profile (``load``/``save``).
"""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from anytree import PreOrderIter

from .._version import __version__
from .fields import FIELDS, catalogue_version
from .records import CallTiming, ModuleRecord

__all__ = ["FORMAT", "FORMAT_VERSION", "document", "dumps", "read_document", "parse"]

FORMAT = "layerprof.profile"
FORMAT_VERSION = 1

# Row keys that the tree itself answers (depth, parent) or that the constructor takes.
_REBUILT = {"name", "type", "extra_repr", "depth", "parent", "aliases", "call_times"}
_CALL_FIELDS = {f.name for f in fields(CallTiming)}


def document(tree: ModuleRecord, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready document of a record tree and its meta."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "layerprof": __version__,
        "meta": meta,
        "records": [record.to_dict() for record in PreOrderIter(tree)],
    }


def dumps(tree: ModuleRecord, meta: dict[str, Any], indent: int | None = 1) -> str:
    """The document as JSON text. Values ``json`` cannot encode in ``meta`` are written as their ``str``.

    With an ``indent``, the header and ``meta`` are indented and each record is one line: readable, diffable
    line by line, and written by json's C encoder (an indented encoding is pure Python, several times slower).
    ``indent=None`` gives one line."""
    doc = document(tree, meta)
    if indent is None:
        return json.dumps(doc, default=str, ensure_ascii=False)
    rows = doc.pop("records")
    head = json.dumps({**doc, "records": []}, indent=indent, default=str, ensure_ascii=False)
    encode = json.JSONEncoder(default=str, ensure_ascii=False).encode
    body = ",\n".join(" " * (2 * indent) + encode(row) for row in rows)
    return head[: head.rindex("[]")] + "[\n" + body + "\n" + " " * indent + "]\n}"


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


_NUMBER_UNITS = ("ms", "bytes", "flops", "flop/s", "macs", "count", "percent")
# Fields of unit "data" whose shape renderers rely on.
_CONTAINER_FIELDS = {
    "param_dtypes": "dict", "shared_with": "dict", "unknown_ops": "dict",
    **{f"{side}_{what}": "list" for side in ("input", "output") for what in ("dtypes", "paths")},
}
# What the entries of the known object fields hold: counts by name, or lists of qualified names.
_ENTRY_KINDS = {"param_dtypes": "number!", "unknown_ops": "number!", "shared_with": "list!"}
# Every CallTiming field, and what it holds (a kind ending in ``!`` refuses null).
_CALL_KINDS = {"forward_start_ms": "number!", "forward_ms": "number!", "backward_start_ms": "number",
               "backward_ms": "number", "recompute": "bool", "step": "int", "recursive": "bool"}


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return (text if len(text) <= 40 else text[:37] + "...") + f" ({_JSON_NAMES.get(type(value), type(value).__name__)})"


_JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "a boolean", list: "a list",
               dict: "an object", type(None): "null"}


_NUMBERS = (int, float)  # by exact type: a bool is an int to isinstance, and not a number here
_ACCEPTS: dict[str, Any] = {
    "number": lambda value: value is None or type(value) in _NUMBERS or (
        isinstance(value, _NUMBERS) and not isinstance(value, bool)),
    "number!": lambda value: type(value) in _NUMBERS or (isinstance(value, _NUMBERS) and not isinstance(value, bool)),
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "bool": lambda value: isinstance(value, bool),
    "list": lambda value: value is None or isinstance(value, list),
    "list!": lambda value: isinstance(value, list),
    "dict": lambda value: value is None or isinstance(value, dict),
    "text": lambda value: isinstance(value, str),
    "any": lambda value: True,
}


def _check_value(where: str, kind: str, value: Any) -> None:
    if not _ACCEPTS[kind](value):
        wanted = {"number": "a number or null", "number!": "a number", "int": "an integer", "bool": "true or false",
                  "list": "a list or null", "list!": "a list", "dict": "an object or null", "text": "a string"}[kind]
        raise ValueError(f"{where} must be {wanted}, got {_shown(value)}")


_CACHES: dict[str, Any] = {"version": -1, "kinds": {}, "settable": {}}


def _cached(name: str) -> dict[str, Any]:
    """A per-key cache of what the catalogue says, emptied when a field is declared."""
    if _CACHES["version"] != catalogue_version():
        _CACHES.update(version=catalogue_version(), kinds={}, settable={})
    return _CACHES[name]


def _field_kinds() -> dict[str, str]:
    return _cached("kinds")


def _settable_keys() -> dict[str, bool]:
    return _cached("settable")


def _settable(key: str) -> bool:
    # Keys that would overwrite the tree's own machinery (parent, children, private state) are not row fields;
    # a stored field of the catalogue is one, even where the class gives it a default.
    if key.startswith("_"):
        return False
    declared = FIELDS.get(key)
    return (declared is not None and not declared.derived) or not hasattr(ModuleRecord, key)


def _check_header(doc: Any) -> list[Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"not a layerprof profile: the JSON holds {_shown(doc)}, not an object")
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a layerprof profile: 'format' is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"'version' must be an integer, got {_shown(version)}; the file is damaged")
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
        raise ValueError(f"'records' must be a list, got {_shown(records)}")
    if not records:
        raise ValueError("the profile holds no records")
    meta = doc.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"'meta' must be an object, got {_shown(meta)}")
    return records


def _read_row(index: int, row: Any, by_name: dict[str, ModuleRecord]) -> ModuleRecord:
    if not isinstance(row, dict):
        raise ValueError(f"record {index} must be an object, got {_shown(row)}")
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
        parent = None
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
        parent = by_name[parent_name]
    extra = row.get("extra_repr", "")
    _check_value(f"{where}: 'extra_repr'", "text", extra)
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
        for key, kind in _CALL_KINDS.items():
            if key in timing or kind.endswith("!"):
                _check_value(f"{where}: call_times {key!r}", kind, timing.get(key))
    kinds = _field_kinds()
    for key, value in row.items():
        if key in _REBUILT:
            continue
        kind = kinds.get(key) or kinds.setdefault(key, _kind(key))
        if not _ACCEPTS[kind](value):  # the message (and its text) only for a value that is wrong
            _check_value(f"{where}: field {key!r}", kind, value)
        if key in _ENTRY_KINDS and value:
            for entry_key, entry in value.items():
                _check_value(f"{where}: field {key!r} entry {entry_key!r}", _ENTRY_KINDS[key], entry)
                for item in entry if isinstance(entry, list) else ():
                    _check_value(f"{where}: field {key!r} entry {entry_key!r}", "text", item)
        if key == "calls" and (value is None or value < 0):
            raise ValueError(f"{where}: field 'calls' must be a number >= 0, got {_shown(value)}")
    record = ModuleRecord(name, row["type"], extra, parent)
    record.aliases = list(aliases or ())
    record.call_times = [CallTiming(**{k: v for k, v in t.items() if k in _CALL_FIELDS}) for t in timings or ()]
    settable = _settable_keys()
    own = record.__dict__
    for key, value in row.items():
        # Fields added by meters come back as attributes, whatever their names.
        if key in _REBUILT:
            continue
        allowed = settable.get(key)
        if allowed is None:
            allowed = settable[key] = _settable(key)
        if allowed or (key in own and not key.startswith("_")):
            own[key] = value
    return record


def read_document(doc: Any) -> tuple[ModuleRecord, dict[str, Any]]:
    """The record tree and meta of a parsed document (see ``document``). Anything that is not a profile this
    version reads is a ValueError naming the first thing wrong, before any record is used."""
    records = _check_header(doc)
    by_name: dict[str, ModuleRecord] = {}
    for index, row in enumerate(records):
        record = _read_row(index, row, by_name)
        by_name[record.name] = record
    return next(iter(by_name.values())), doc.get("meta") or {}


def parse(text: str) -> tuple[ModuleRecord, dict[str, Any]]:
    """The record tree and meta of JSON text written by ``dumps``; a ValueError when it is not one."""
    if not text.strip():
        raise ValueError("the file is empty, not a layerprof profile")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not a layerprof profile: invalid JSON ({error})") from None
    except RecursionError:
        raise ValueError("not a layerprof profile: JSON nested too deeply") from None
    return read_document(doc)
