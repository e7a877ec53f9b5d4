"""Chrome trace-event JSON: every module call's forward and backward as nested slices, for Perfetto
(ui.perfetto.dev) or chrome://tracing.

One process (the model); threads are tracks: ``forward``, ``backward`` and, under activation checkpointing,
``recompute`` (forward re-run during backward, which does not nest with the backward slices around it). Each
slice is a complete event (``"ph": "X"``) in microseconds. Within a track, slices nest: a slice that would
overlap a sibling without containing it (a clock from another device, an unusual graph) goes to an extra track
of the same pass instead of breaking the nesting. Times are kept in integer nanoseconds while tracks are laid
out, so containment is exact, and a child that outlasts its parent by under 1 ns is trimmed to fit; they are
written as binary fractions of a microsecond, so that containment stays exact when a reader adds ``ts + dur``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from ..record.records import ModuleRecord

__all__ = ["TraceSlice", "call_slices", "trace_document", "trace_json"]

_PID = 1
_TOLERANCE_NS = 1


@dataclass
class TraceSlice:
    """One interval of one module call, in integer nanoseconds from the start of profiling."""

    name: str
    module: str
    type: str
    phase: str  # "forward", "backward" or "recompute"
    start_ns: int
    duration_ns: int
    call: int  # index into the record's call_times
    step: int
    depth: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


def _ns(ms: float) -> int:
    return int(round(ms * 1e6))


def _us(ns: int) -> float:
    """Microseconds in multiples of 2**-10 µs (about 1 ns). Such numbers, and sums of two of them, are exact in a
    double up to 2**43 µs (100 days), so a reader's ``ts + dur`` is exactly the end written: with ``ns / 1000``
    a child ending at its parent's instant could end 6e-11 µs after it, and a reader closes the parent first."""
    return round(ns * 1024 / 1000) / 1024


def call_slices(records: Iterable[ModuleRecord]) -> list[TraceSlice]:
    """A slice for each forward, backward and recomputed forward in every record's ``call_times``."""
    slices = []
    for record in records:
        label = record.name or record.type
        for index, timing in enumerate(record.call_times):
            phase = "recompute" if timing.recompute else "forward"
            slices.append(TraceSlice(label, record.name, record.type, phase, _ns(timing.forward_start_ms),
                                     _ns(timing.forward_ms), index, timing.step, record.depth))
            if timing.backward_start_ms is not None and timing.backward_ms is not None:
                slices.append(TraceSlice(label, record.name, record.type, "backward", _ns(timing.backward_start_ms),
                                         _ns(timing.backward_ms), index, timing.step, record.depth))
    return slices


class _Track:
    """Slices that nest: a stack of the slices still open at the latest start."""

    def __init__(self, name: str, tid: int) -> None:
        self.name = name
        self.tid = tid
        self.open: list[TraceSlice] = []

    def fits(self, piece: TraceSlice) -> bool:
        while self.open and self.open[-1].end_ns <= piece.start_ns:
            self.open.pop()
        return not self.open or piece.end_ns <= self.open[-1].end_ns + _TOLERANCE_NS

    def add(self, piece: TraceSlice) -> None:
        if self.open and piece.end_ns > self.open[-1].end_ns:
            piece.duration_ns = self.open[-1].end_ns - piece.start_ns  # rounding: trim into the parent
        self.open.append(piece)


def _layout(slices: list[TraceSlice]) -> list[tuple[_Track, TraceSlice]]:
    # Parents first: earlier start, then longer, then shallower in the module tree.
    ordered = sorted(slices, key=lambda s: (s.start_ns, -s.duration_ns, s.depth))
    tracks: dict[str, list[_Track]] = {}
    placed = []
    next_tid = 1
    for phase in ("forward", "backward", "recompute"):
        if any(s.phase == phase for s in ordered):
            tracks[phase] = [_Track(phase, next_tid)]
            next_tid += 1
    for piece in ordered:
        candidates = tracks[piece.phase]
        track = next((t for t in candidates if t.fits(piece)), None)
        if track is None:
            track = _Track(f"{piece.phase} ({len(candidates) + 1})", 0)
            candidates.append(track)
        track.add(piece)
        placed.append((track, piece))
    for phase_tracks in tracks.values():
        for track in phase_tracks:
            if track.tid == 0:
                track.tid = next_tid
                next_tid += 1
    return placed


def trace_document(root: ModuleRecord, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": meta}``.

    Metadata events (``"ph": "M"``) name the process and tracks; then one ``"X"`` event per slice, ordered by
    ``ts`` (and, at equal ``ts``, the enclosing slice first).
    """
    placed = _layout(call_slices([root, *root.descendants]))
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": 0, "args": {"name": f"layerprof: {root.type}"}},
    ]
    tracks = {track.tid: track for track, _ in placed}
    for tid in sorted(tracks):
        events.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "args": {"name": tracks[tid].name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": tid, "args": {"sort_index": tid}})
    for track, piece in placed:
        events.append({
            "name": piece.name,
            "cat": piece.phase,
            "ph": "X",
            "ts": _us(piece.start_ns),
            "dur": _us(piece.end_ns) - _us(piece.start_ns),
            "pid": _PID,
            "tid": track.tid,
            "args": {"module": piece.module, "type": piece.type, "call": piece.call, "step": piece.step},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def trace_json(root: ModuleRecord, meta: dict[str, Any] | None = None) -> str:
    """``trace_document`` as JSON text."""
    return json.dumps(trace_document(root, meta), default=str, ensure_ascii=False)
