"""Saving a profile as JSON and loading it back: the rows in ``named_modules()`` order plus ``meta``.

The file is the canonical rows form with a header::

    {"format": "layerprof.profile", "version": 1, "layerprof": "0.1.0", "meta": {...}, "records": [row, ...]}

Loading rebuilds the same tree (parents come before children in the rows), every field of every row, and the
call timings, so everything that reads a profile (summary, tables, trace, compare) works on a loaded one.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

from .profile import Profile
from .records import CallTiming, ModuleRecord

__all__ = [
    "FORMAT", "FORMAT_VERSION", "profile_document", "dumps", "save", "loads", "load", "from_document", "as_profile",
]

FORMAT = "layerprof.profile"
FORMAT_VERSION = 1

# Row keys that the tree itself answers (depth, parent) or that the constructor takes.
_REBUILT = {"name", "type", "extra_repr", "depth", "parent", "aliases", "call_times"}
_CALL_FIELDS = {f.name for f in fields(CallTiming)}


def as_profile(value: Any) -> Profile:
    """A Profile from a Profile, a LayerProf after its ``with`` block, or the path of a saved profile."""
    if isinstance(value, Profile):
        return value
    if isinstance(value, (str, Path)):
        return load(value)
    profile = getattr(value, "profile", None)  # LayerProf: raises a clear error before its block has exited
    if isinstance(profile, Profile):
        return profile
    raise TypeError(f"expected a Profile, a LayerProf or a saved profile's path, got {type(value).__name__}")


def profile_document(profile: Profile) -> dict[str, Any]:
    """The JSON-ready document for ``profile`` (a Profile or a finished LayerProf)."""
    from . import __version__

    profile = as_profile(profile)
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "layerprof": __version__,
        "meta": profile.meta,
        "records": list(profile.to_dict().values()),
    }


def dumps(profile: Profile, indent: int | None = 1) -> str:
    """The profile as JSON text. Values ``json`` cannot encode in ``meta`` are written as their ``str``."""
    return json.dumps(profile_document(profile), indent=indent, default=str, ensure_ascii=False)


def save(profile: Any, path: str | Path) -> str:
    """Write the profile's JSON to ``path`` and return the text. ``layerprof.load(path)`` reads it back."""
    text = dumps(profile) + "\n"
    Path(path).write_text(text, encoding="utf-8")
    return text


def _settable(record: ModuleRecord, key: str) -> bool:
    attribute = getattr(type(record), key, None)
    return not (isinstance(attribute, property) and attribute.fset is None)


def from_document(document: dict[str, Any]) -> Profile:
    """A Profile from a parsed document (see ``profile_document``)."""
    if document.get("format") != FORMAT:
        raise ValueError(f"not a layerprof profile: 'format' is {document.get('format')!r}, expected {FORMAT!r}")
    version = document.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"profile format version {version!r} is newer than this layerprof reads ({FORMAT_VERSION}); "
            "upgrade layerprof to load it"
        )
    by_name: dict[str, ModuleRecord] = {}
    root: ModuleRecord | None = None
    for row in document["records"]:
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
    return Profile(root, meta=document.get("meta") or {})


def loads(text: str) -> Profile:
    """A Profile from JSON text written by ``dumps``/``save``/``Profile.to_json``."""
    return from_document(json.loads(text))


def load(source: str | Path | IO[str]) -> Profile:
    """Load a profile saved with ``prof.to_json(path)`` or ``layerprof.save(prof, path)``.

    >>> import torch, tempfile, os, layerprof
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> with layerprof.LayerProf(net) as prof:
    ...     net(torch.randn(2, 4)).sum().backward()
    >>> path = os.path.join(tempfile.mkdtemp(), "net.json")
    >>> _ = prof.to_json(path)
    >>> layerprof.load(path).layerwise_summary() == prof.layerwise_summary()
    True
    """
    if hasattr(source, "read"):
        return loads(source.read())  # type: ignore[union-attr]
    return loads(Path(source).read_text(encoding="utf-8"))  # type: ignore[arg-type]
