"""The time of a module's own work, as its own FLOPs and bytes count it: the roofline's measured time.

A module's self time (forward + backward, less its sub-calls') and its own FLOPs (``self_flops``) cover the same
ops, except under activation checkpointing:

* a recomputed module's FLOPs count its re-run, which its self times leave out (the re-run is ``recompute_ms``, a
  time of its own): its share of the re-run (its ``recompute_ms`` less its children's, both inclusive) is added;
* the re-run runs inside another module's backward: non-reentrant checkpointing re-runs a region while the first
  of its nodes that needs a saved tensor unpacks it, reentrant checkpointing inside the region's own backward node.
  That module's self backward holds the whole re-run, which is not its work: taken off the innermost module whose
  backward interval holds the re-run's start.

Read from the last step's calls (``call_times``, the only ones kept), which say where each re-run ran; the shares
are the records' means over the steps. Without recomputation, ``work_ms`` is ``self_total_ms``.

FLOPs and bytes are counted in one step, in which the module ran, while its times are means over every recorded
step, 0 in those it did not run (an auxiliary head every 10 steps, a layer dropped by stochastic depth): set
beside the counted figures, a time is the mean over the steps that ran the module (``ran_ms``), else the rates
(FLOP/s, bandwidth, efficiency) come out ``steps / steps_run`` times too high.

>>> from layerprof.record.records import ModuleRecord
>>> leaf = ModuleRecord("fc", "Linear")
>>> leaf.self_forward_ms, leaf.self_backward_ms = 1.0, 2.0
>>> work_ms(leaf)
3.0
"""
from __future__ import annotations

from typing import Any

from .fields import FIELDS
from .roofs import _root

__all__ = ["work_ms", "ran_ms", "step_ms"]

_SHIFTS = "_work_shifts"  # where a root keeps its shifts, made when first read


def work_ms(record: Any) -> float | None:
    """``self_total_ms`` of ``record``, moved by the recomputations its self time holds or leaves out, per step
    that ran it (``ran_ms``)."""
    ms = FIELDS["self_total_ms"].value(record)
    if ms is None:
        return None
    root = _root(record)
    shifts = root.__dict__.get(_SHIFTS)
    if shifts is None:
        shifts = _shifts(root)
        root.__dict__[_SHIFTS] = shifts
    return ran_ms(record, max(0.0, ms + shifts.get(record.name, 0.0)) if shifts else ms)


def ran_ms(record: Any, ms: float) -> float:
    """``ms``, a mean over the recorded steps, as the mean over the steps that ran ``record``'s module (the same
    where it ran in every one)."""
    steps, ran = getattr(record, "steps", 0), getattr(record, "steps_run", 0)
    return ms * steps / ran if 0 < ran < steps else ms


def step_ms(record: Any, ms: float) -> float:
    """``ms``, a mean over the steps that ran ``record``'s module, as a mean over every recorded step (0 in those
    it did not run): what the module takes of a step, the inverse of ``ran_ms``."""
    steps, ran = getattr(record, "steps", 0), getattr(record, "steps_run", 0)
    return ms * ran / steps if 0 < ran < steps else ms


def _shifts(root: Any) -> dict[str, float]:
    records = [root, *root.descendants]
    recomputing = [record for record in records if record.recompute_ms]
    if not recomputing:
        return {}
    shifts: dict[str, float] = {}
    for record in recomputing:
        own = record.recompute_ms - sum(child.recompute_ms or 0.0 for child in record.children)
        if own > 0.0:
            shifts[record.name] = own
    last = max((timing.step for record in records for timing in record.call_times), default=None)
    # The re-runs of the last step, and the backward intervals that may hold them (each with its module's depth).
    runs = [(timing.forward_start_ms, timing.forward_ms, record) for record in recomputing
            for timing in record.call_times if timing.recompute and not timing.recursive and timing.step == last]
    backwards = [(timing.backward_start_ms, timing.backward_start_ms + timing.backward_ms, record.depth, record.name)
                 for record in records for timing in record.call_times
                 if timing.step == last and not timing.recompute and timing.backward_ms
                 and timing.backward_start_ms is not None]
    spans: dict[int, list[tuple[float, float]]] = {}  # id(record) -> its re-runs' (start, end)
    for start, ms, record in runs:
        spans.setdefault(id(record), []).append((start, start + ms))
    for start, ms, record in runs:
        above = record.parent
        while above is not None:  # inside an ancestor's re-run: taken off with it
            if any(first <= start < end for first, end in spans.get(id(above), ())):
                break
            above = above.parent
        if above is not None:
            continue
        holding = [interval for interval in backwards if interval[0] <= start < interval[1]]
        if holding:
            name = max(holding, key=lambda interval: interval[2])[3]
            shifts[name] = shifts.get(name, 0.0) - ms
    return shifts
