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


def _settable(record: ModuleRecord, key: str) -> bool:
    attribute = getattr(type(record), key, None)
    return not (isinstance(attribute, property) and attribute.fset is None)


def read_document(doc: dict[str, Any]) -> tuple[ModuleRecord, dict[str, Any]]:
    """The record tree and meta of a parsed document (see ``document``)."""
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a layerprof profile: 'format' is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"profile format version {version!r} is newer than this layerprof reads ({FORMAT_VERSION}); "
            "upgrade layerprof to load it"
        )
    by_name: dict[str, ModuleRecord] = {}
    root: ModuleRecord | None = None
    for row in doc["records"]:
        parent_name = row.get("parent")
        if parent_name is not None and parent_name not in by_name:
            raise ValueError(f"record {row['name']!r} comes before its parent {parent_name!r}; the file is damaged")
        parent = None if parent_name is None else by_name[parent_name]
        record = ModuleRecord(row["name"], row["type"], row.get("extra_repr", ""), parent)
        record.aliases = list(row.get("aliases", ()))
        record.call_times = [
            CallTiming(**{k: v for k, v in timing.items() if k in _CALL_FIELDS}) for timing in row.get("call_times", ())
        ]
        for key, value in row.items():
            # Fields added by meters come back as attributes, whatever their names.
            if key not in _REBUILT and _settable(record, key):
                setattr(record, key, value)
        by_name[record.name] = record
        if parent is None:
            if root is not None:
                raise ValueError(f"two roots in one profile: {root.name!r} and {record.name!r}")
            root = record
    if root is None:
        raise ValueError("the profile holds no records")
    return root, doc.get("meta") or {}


def parse(text: str) -> tuple[ModuleRecord, dict[str, Any]]:
    """The record tree and meta of JSON text written by ``dumps``."""
    return read_document(json.loads(text))
