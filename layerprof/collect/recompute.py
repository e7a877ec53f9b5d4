"""Recompute time rolled up the module tree, as every other inclusive time is.

Activation checkpointing re-runs a region's forward during backward; each call re-run is timed (``recompute_ms``).
A module whose own call is not re-run while its submodules' are has no span of its own: Hugging Face's
``GradientCheckpointingLayer`` checkpoints the layer's ``forward``, not its ``__call__``, so the layer's hooks run
once while its children's run again; and a model or encoder around checkpointed layers is never re-run itself.
Its inclusive recompute is then the sum of its children's, as its forward time includes theirs. A module that
never ran (a ModuleList, iterated and not called) keeps None, like its other times, and passes its children's sum
on to its parent.
"""
from __future__ import annotations

from operator import attrgetter

from ..record.records import ModuleRecord

__all__ = ["roll_up_recompute"]

_recompute_ms = attrgetter("recompute_ms")


def roll_up_recompute(records: dict[str, ModuleRecord], root: ModuleRecord) -> None:
    """Set ``recompute_ms`` of every module that ran and was not re-run itself, but had submodules re-run, to
    their sum (an own span, where there is one, already covers its children's)."""
    if not any(map(_recompute_ms, records.values())):
        return
    _rolled(root)


def _rolled(record: ModuleRecord) -> float | None:
    """The record's inclusive recompute: its own span, else the sum of its children's (None where none ran)."""
    own = record.recompute_ms
    total: float | None = None
    for child in record.children:
        value = _rolled(child)
        if value is not None:
            total = (total or 0.0) + value
    if own is not None:
        return own
    if total is not None and record.calls:
        record.recompute_ms = total
    return total
