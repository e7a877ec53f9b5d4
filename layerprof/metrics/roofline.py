"""Roofline fields: where each module's own ops sit against the machine's two roofs, and why it is slow.

From the flops meter's figures and the machine's peaks (``collect/peaks.py``, or the user's):

* ``intensity``: FLOPs per byte moved (inclusive of children); ``self_intensity``: of the module's own ops, the
  point the roofline places and ``bound`` reads;
* ``achieved_bandwidth``: the module's own bytes per second of its own (self) time;
* ``attainable_ms``: ``max(self_flops / peak FLOP/s, self_bytes / peak bandwidth)``, the time of a kernel that
  runs at the roof;
* ``efficiency``: attainable over measured self time (forward + backward): 1 at the roof;
* ``bound``: ``compute`` or ``memory`` by which term of the attainable time is larger, or ``overhead`` when the
  measured self time is more than ``OVERHEAD_RATIO`` times the attainable (efficiency below 1/10): the time
  then goes to neither arithmetic nor memory traffic but to Python, dispatch and kernel launches;
* ``lost_ms``: measured self time minus attainable, the time a better implementation could win (per recorded
  step, as the self time).

Self figures (a module's own ops, not its children's) make a parent's point its own work, so the points of a
tree add up to the step. The measured time is the self time moved by recomputation (``record/work_time.py``): a
recomputed module's re-run added, as its FLOPs count it; a re-run taken off the module whose backward ran it; and,
as FLOPs and bytes are of one step that ran the module, its mean over the steps that ran it (an auxiliary head run
every 10 steps is not 10 times as efficient).
Peaks come from the tree (``record/roofs.py``), where the Profile attaches a callable that measures them only when
one of these fields is first read; without peaks these fields are None.
"""
from __future__ import annotations

from typing import Any

from ..record.fields import FIELDS, Field, declare
from ..record.roofs import peaks_of
from ..record.work_time import step_ms, work_ms

__all__ = ["OVERHEAD_RATIO", "roofline_point", "BOUNDS", "ROOFLINE_FIELDS"]

OVERHEAD_RATIO = 10.0
BOUNDS = ("compute", "memory", "overhead")
# The fields that need the machine's peaks (reading one measures them once, unless given).
ROOFLINE_FIELDS = ("attainable_ms", "efficiency", "bound", "lost_ms")


def roofline_point(record: Any, peaks: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``{flops, bytes, ms, compute_ms, memory_ms, attainable_ms}`` of a module's own ops, or None where
    FLOPs/bytes or its self time were not measured or no peaks are known. ``ms`` is None for a module counted
    without times (a step on the meta device): its attainable time and bound still hold, at the peaks given."""
    flops, moved = getattr(record, "self_flops", None), getattr(record, "self_bytes", None)
    if flops is None or moved is None:
        return None
    ms = work_ms(record)
    if ms is not None and not ms:
        return None
    peaks = peaks_of(record) if peaks is None else peaks
    if not peaks:
        return None
    compute_ms, memory_ms = 1000.0 * flops / peaks["flops"], 1000.0 * moved / peaks["bandwidth"]
    return {"flops": flops, "bytes": moved, "ms": ms, "compute_ms": compute_ms, "memory_ms": memory_ms,
            "attainable_ms": max(compute_ms, memory_ms)}


def _intensity(record: Any) -> float | None:
    flops, moved = FIELDS["flops"].value(record), FIELDS["bytes"].value(record)
    return None if flops is None or not moved else flops / moved


def _self_intensity(record: Any) -> float | None:
    flops, moved = getattr(record, "self_flops", None), getattr(record, "self_bytes", None)
    return None if flops is None or not moved else flops / moved


def _achieved_bandwidth(record: Any) -> float | None:
    moved = getattr(record, "self_bytes", None)
    ms = None if moved is None else work_ms(record)
    return None if moved is None or not ms else moved / (ms / 1000.0)


def _attainable_ms(record: Any) -> float | None:
    point = roofline_point(record)
    return None if point is None else point["attainable_ms"]


def _efficiency(record: Any) -> float | None:
    point = roofline_point(record)
    return None if point is None or point["ms"] is None else point["attainable_ms"] / point["ms"]


def _bound(record: Any) -> str | None:
    point = roofline_point(record)
    if point is None:
        return None
    if point["ms"] is not None and point["ms"] > OVERHEAD_RATIO * point["attainable_ms"]:
        return "overhead"
    return "compute" if point["compute_ms"] >= point["memory_ms"] else "memory"


def _lost_ms(record: Any) -> float | None:
    """Per recorded step, as the self time is: what is lost in each step that ran the module, times the share of
    the steps that ran it."""
    point = roofline_point(record)
    if point is None or point["ms"] is None:
        return None
    return step_ms(record, max(0.0, point["ms"] - point["attainable_ms"]))


declare(
    Field("intensity", "flop/byte", "Intensity", compute=_intensity, combine="none", cost=False, meter="flops",
          doc="arithmetic intensity: FLOPs per byte read or written (inclusive)"),
    Field("self_intensity", "flop/byte", "Self Intensity", compute=_self_intensity, combine="none", cost=False,
          meter="flops", doc="the module's own FLOPs per own byte: its point on the roofline"),
    Field("achieved_bandwidth", "byte/s", "Bandwidth", compute=_achieved_bandwidth, combine="none", cost=False,
          meter="flops", doc="the module's own bytes per second of its self time"),
    Field("attainable_ms", "ms", "Attainable", compute=_attainable_ms, combine="none", cost=False, meter="flops",
          doc="max(self FLOPs / peak FLOP/s, self bytes / peak bandwidth): its own ops at the machine's roofs"),
    Field("efficiency", "ratio", "Efficiency", compute=_efficiency, combine="none", cost=False, meter="flops",
          doc="attainable_ms / measured self time (1: at the roof)"),
    Field("bound", "text", "Bound", compute=_bound, combine="none", cost=False, meter="flops",
          doc=f"compute, memory, or overhead (self time over {OVERHEAD_RATIO:g}x attainable)"),
    Field("lost_ms", "ms", "Lost", compute=_lost_ms, combine="none", cost=False, meter="flops",
          doc="measured self time minus attainable: what a better implementation could win"),
)
