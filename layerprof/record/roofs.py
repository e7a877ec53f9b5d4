"""The machine's roofs a record tree is held against: attached to the root, read from any record.

The roofline fields (``metrics/roofline.py``) and the roofline plot read a module's peaks here. The source is a
dict ``{"flops": FLOP/s, "bandwidth": bytes/s, ...}`` or a callable returning one (or None), so that the peaks
are measured only when a roofline figure is first read. It is private to the tree: never part of a row. Where
none are known, ``no_roofs_message`` says why (the profile's machine) and what to do.
"""
from __future__ import annotations

from typing import Any, Callable, Union

from .._machine import environment_in, other_machine
from .untimed import untimed_note

__all__ = ["attach_peaks", "peaks_of", "no_roofs_reason", "no_roofs_message", "no_roofs_for"]

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


def no_roofs_reason(environment: Any) -> str:
    """Why a profile with this environment has no roofs to hold its modules against (``Profile.peaks`` is None)."""
    other = other_machine(environment)
    if other is not None:
        return (f"it was measured on another machine ({other}), whose roofs were not saved with it, and this "
                "machine's would be wrong for it")
    device = environment.get("device") if isinstance(environment, dict) else None
    return f"it was measured on {device or 'a device'}, which this process cannot measure"


def no_roofs_message(environment: Any) -> str:
    """``no_roofs_reason``, and what to do."""
    return (f"no roofs for this profile: {no_roofs_reason(environment)}. Give that machine's: layerprof.load(path, "
            "peaks={'flops': FLOP/s, 'bandwidth': bytes/s}) (its spec sheet, or layerprof.peaks() run there); a "
            "profile saved with to_json() where it was measured holds them")


def no_roofs_for(meta: Any) -> str:
    """``no_roofs_message`` of a profile by its ``meta``; for one without times (a step on the meta device), the
    roofs of the machine it is estimated for, which only the user can give."""
    untimed = untimed_note(meta)
    if untimed is None:
        return no_roofs_message(environment_in(meta))
    return (f"no roofs for this profile: {untimed}, and the roofs to hold them against are those of the machine "
            "the model is estimated for. Give them: LayerProf(model, metrics=('flops',), peaks={'flops': FLOP/s, "
            "'bandwidth': bytes/s}) (a spec sheet's), or layerprof.load(path, peaks=...) for a saved profile; each "
            "module's attainable_ms is then the time of its own ops at those roofs")
