"""The speedscope file format (https://www.speedscope.app/file-format-schema.json) of a profile.

Three profiles share one frame per module: an *evented* forward timeline and an evented backward timeline (open
and close events, nested exactly: a child slice is clamped into its parent, ``at`` never decreases) and a
*sampled* profile of the module tree weighted by self time, which speedscope draws as a flame graph of where the
step's time goes. Forward re-run by activation checkpointing is left out of the timelines (it happens inside the
backward without nesting with it); its time is in the backward of the enclosing modules.
"""
from __future__ import annotations

import json
from typing import Any

from anytree import PreOrderIter

from .._version import __version__
from ..record.records import ModuleRecord
from .trace import TraceSlice, call_slices

__all__ = ["SCHEMA", "speedscope_document", "speedscope_json"]

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _frame_name(record: ModuleRecord) -> str:
    return f"{record.name} ({record.type})" if record.name else record.type


def _evented(name: str, slices: list[TraceSlice], frames: dict[str, int]) -> dict[str, Any]:
    """Open/close events of nested slices, in integer nanoseconds while laid out so containment is exact."""
    ordered = sorted(slices, key=lambda s: (s.start_ns, -s.duration_ns, s.depth))
    events: list[tuple[int, str, int]] = []
    stack: list[tuple[int, int]] = []  # (frame, end_ns) of open slices

    def close_until(time_ns: int) -> None:
        while stack and stack[-1][1] <= time_ns:
            frame, end = stack.pop()
            events.append((end, "C", frame))

    for piece in ordered:
        start, end = piece.start_ns, piece.end_ns
        close_until(start)
        if stack:
            end = min(end, stack[-1][1])  # clamped into the parent (a clock from another device, rounding)
        start = max(start, events[-1][0]) if events else start
        if end < start:
            continue
        frame = frames[piece.module]
        events.append((start, "O", frame))
        stack.append((frame, end))
    close_until(2**63)
    start_value = events[0][0] if events else 0
    end_value = events[-1][0] if events else 0
    return {
        "type": "evented",
        "name": name,
        "unit": "milliseconds",
        "startValue": start_value / 1e6,
        "endValue": end_value / 1e6,
        "events": [{"type": kind, "frame": frame, "at": at / 1e6} for at, kind, frame in events],
    }


def _sampled(name: str, root: ModuleRecord, frames: dict[str, int]) -> dict[str, Any]:
    """One sample per module, its stack the path from the root, weighted by its self time (ms per step)."""
    samples, weights = [], []
    for record in PreOrderIter(root):
        weight = (record.self_forward_ms or 0.0) + (record.self_backward_ms or 0.0)
        if weight > 0:
            samples.append([frames[node.name] for node in record.path])
            weights.append(weight)
    return {"type": "sampled", "name": name, "unit": "milliseconds", "startValue": 0,
            "endValue": sum(weights), "samples": samples, "weights": weights}


def speedscope_document(root: ModuleRecord, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The speedscope file as a JSON-ready dict."""
    records = list(PreOrderIter(root))
    frames = {record.name: index for index, record in enumerate(records)}
    slices = call_slices(records)
    profiles = [
        _evented(f"{root.type}: forward", [s for s in slices if s.phase == "forward"], frames),
        _evented(f"{root.type}: backward", [s for s in slices if s.phase == "backward"], frames),
        _sampled(f"{root.type}: self time per step (forward + backward)", root, frames),
    ]
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": _frame_name(record)} for record in records]},
        "profiles": profiles,
        "name": f"layerprof: {root.type}",
        "activeProfileIndex": 0,
        "exporter": f"layerprof {__version__}",
    }


def speedscope_json(root: ModuleRecord, meta: dict[str, Any] | None = None) -> str:
    """``speedscope_document`` as JSON text."""
    return json.dumps(speedscope_document(root, meta), ensure_ascii=False)
