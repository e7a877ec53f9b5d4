"""The step's peak memory with a checkpoint plan, predicted from the memory measured in the profiled step.

The memory meter keeps, on a device its reader covers (CUDA; the CPU with ``metrics=("live_memory",)``), the bytes
allocated at every boundary of the step (each module call's forward start and end, backward start and end) and the
peak of each interval between two boundaries, and each call's boundaries beside the storages of its forward
(``checkpoint_bytes.storage_table``). A plan changes the step's memory only through what autograd holds, so each
interval's peak moves by what the plan holds then less what the profiled step held:

- a storage saved only inside wrapped regions (none of which takes it as input) is not held from the end of its
  region's forward to the start of its backward: ``-bytes`` over that span (for a storage saved in several
  regions, from the first one's forward end to the last one's backward start, except while a region's backward
  runs, where it is saved again);
- a region's input that nothing saved is held by the checkpoint from the end of the region's forward to the end of
  its backward: ``+bytes`` over that span (not the model's own inputs, which the step holds anyway);
- at the start of a region's backward, its recomputation runs: on top of what is allocated there, less the
  region's storages (not yet recomputed), the region's forward rises again as far as it rose in the profiled
  forward (its forward peak above its start: the saved storages, the temporaries, the output).

Everything else the profiled step held (parameter gradients, the gradients flowing between modules, what the
calls not wrapped save) is where it was, so the predicted step peak is the highest of the intervals so moved and
the recomputations. The early stop of a non-reentrant checkpoint (the last ops of a region, which save nothing
backward needs, are not re-run) makes a recomputation rise less than its forward did: the prediction errs high
there, by up to the region's output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..metrics.checkpoint_bytes import regions

__all__ = ["PeakPrediction", "predict_peak", "step_peak"]


@dataclass(frozen=True)
class PeakPrediction:
    """The step's peak with a plan: ``peak_bytes`` (on the profile's reader's scale: allocated bytes on CUDA,
    live bytes made in the step on the CPU), ``phase`` (``"forward"``, ``"backward"``, ``"recompute"`` or
    ``"between calls"``: the loss, or after the last backward) and ``at``, the module whose backward or
    recomputation holds it (None in forward, or between calls)."""

    peak_bytes: int
    phase: str
    at: str | None


def step_peak(timeline: dict[str, Any]) -> int:
    """The profiled step's own peak: the highest interval from the model's first call on."""
    return max(timeline["peaks"][2:], default=0)


class _Spans:
    """Additions over spans of boundaries ``[a, b)``, read per interval (interval ``k`` ends at boundary ``k``)."""

    def __init__(self, boundaries: int) -> None:
        self.diff = [0] * (boundaries + 2)

    def add(self, start: int, end: int, size: int) -> None:
        if start < end:
            self.diff[start + 1] += size
            self.diff[end + 1] -= size

    def per_interval(self) -> list[int]:
        found, running = [], 0
        for step in self.diff:
            running += step
            found.append(running)
        return found


@dataclass
class _Region:
    start: int  # the call index of the outermost wrapped call, or of a run's first call
    forward_start: int
    forward_end: int
    backward_start: int
    backward_end: int
    again: int = 0  # bytes its recomputation saves again


def _regions(table: dict[str, list[Any]], wrapped: set[str], runs: Sequence[Sequence[str]]
             ) -> tuple[list[int], dict[int, _Region]] | None:
    region = regions(table, wrapped, runs)
    bounds = table["bounds"]
    found: dict[int, _Region] = {}
    for i, start in enumerate(region):
        if start < 0:
            continue
        fs, fe, bs, be = bounds[i]
        if not fs or not fe:
            return None  # a call on another device, or one the meter did not see end
        spans = found.get(start)
        if spans is None:
            found[start] = _Region(start, fs, fe, bs, be)
            continue
        spans.forward_start, spans.forward_end = min(spans.forward_start, fs), max(spans.forward_end, fe)
        if bs:
            spans.backward_start = min(spans.backward_start, bs) if spans.backward_start else bs
        spans.backward_end = max(spans.backward_end, be)
    return region, found


def _table_spans(table: dict[str, list[Any]], wrapped: set[str], runs: Sequence[Sequence[str]], spans: _Spans
                 ) -> list[_Region] | None:
    """Add one forward's changes to ``spans``; its regions (with their ``again`` bytes), None where unknown."""
    found = _regions(table, wrapped, runs)
    if found is None:
        return None
    region, by_start = found
    parents = table["parents"]
    backwarded = {start: r for start, r in by_start.items() if r.backward_start and r.backward_end}
    for size, saved_by, taken_by in zip(table["sizes"], table["savers"], table["inputs"]):
        if any(region[i] < 0 for i in saved_by):
            continue  # saved outside every checkpoint: held as before
        if saved_by:
            if any(region[i] == i for i in taken_by):
                continue  # a checkpoint's input: held by it as it was by its savers
            held = [backwarded[start] for start in {region[i] for i in saved_by} if start in backwarded]
            if not held:
                continue
            first, last = min(r.forward_end for r in held), max(r.backward_start for r in held)
            spans.add(first, last, -size)
            for r in held:
                r.again += size
                spans.add(r.backward_start, min(r.backward_end, last), size)
            continue
        holders = [backwarded[i] for i in taken_by if region[i] == i and i in backwarded]
        if holders and not any(parents[i] < 0 for i in taken_by):
            spans.add(min(r.forward_end for r in holders), max(r.backward_end for r in holders), size)
    return list(backwarded.values())


def predict_peak(tables: Sequence[dict[str, list[Any]]], timeline: dict[str, Any], wrapped: set[str],
                 runs: Sequence[Sequence[str]] = ()) -> PeakPrediction | None:
    """The step's peak with ``wrapped`` (and ``runs``, names in call order) under checkpoint (see the module doc);
    None where a table has no boundaries (a profile without a reader on its device) or a wrapped call ran on
    another device."""
    levels, peaks = timeline["levels"], timeline["peaks"]
    count = len(levels) - 1
    if count < 2 or any("bounds" not in table for table in tables):
        return None
    spans = _Spans(count)
    recomputed: list[tuple[dict[str, list[Any]], _Region]] = []
    for table in tables:
        found = _table_spans(table, wrapped, runs, spans)
        if found is None:
            return None
        recomputed += [(table, r) for r in found]
    change = spans.per_interval()
    best = max(range(2, count + 1), key=lambda k: peaks[k] + change[k])
    prediction = PeakPrediction(peaks[best] + change[best], *_where(tables, best))
    for table, r in recomputed:
        rise = max(peaks[r.forward_start + 1:r.forward_end + 1]) - levels[r.forward_start]
        at = levels[r.backward_start] + change[r.backward_start + 1] - r.again + rise
        if at > prediction.peak_bytes:
            prediction = PeakPrediction(at, "recompute", table["names"][r.start])
    return prediction


def _where(tables: Sequence[dict[str, list[Any]]], interval: int) -> tuple[str, str | None]:
    """The phase of an interval and the module whose backward holds it: the latest call whose backward started
    before the interval and had not ended (None in forward or outside every call)."""
    if any(bounds[0] < interval <= bounds[1] for table in tables for bounds, parent in
           zip(table["bounds"], table["parents"]) if parent < 0):
        return "forward", None
    inside = [(bounds[2], table["names"][i]) for table in tables for i, bounds in enumerate(table["bounds"])
              if bounds[2] and bounds[2] < interval <= bounds[3]]
    return ("backward", max(inside)[1]) if inside else ("between calls", None)
