"""The machine's roofs a record tree is held against: attached to the root, read from any record.

The roofline fields (``metrics/roofline.py``) and the roofline plot read a module's peaks here. The source is a
dict ``{"flops": FLOP/s, "bandwidth": bytes/s, ...}`` or a callable returning one (or None), so that the peaks
are measured only when a roofline figure is first read. It is private to the tree: never part of a row.
"""
from __future__ import annotations

from typing import Any, Callable, Union

__all__ = ["attach_peaks", "peaks_of"]

PeaksSource = Union[dict, Callable[[], "dict | None"], None]


def _root(record: Any) -> Any:
    while True:  # record.root, without anytree's property and generator
        parent = record.__dict__.get("_NodeMixin__parent")
        if parent is None:
            return record
        record = parent


def attach_peaks(root: Any, source: PeaksSource) -> None:
    """Hold the tree under ``root`` against ``source``'s peaks."""
    root.__dict__["_roofline_peaks"] = source


def peaks_of(record: Any) -> dict[str, Any] | None:
    """The peaks of the tree ``record`` belongs to, None where none are attached or known."""
    source = _root(record).__dict__.get("_roofline_peaks")
    return source() if callable(source) else source
