"""Turn the tracker's raw stamps into per-call and per-module milliseconds on the records."""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from .records import CallTiming, ModuleRecord
from .tracker import CallTrace

__all__ = ["fill_times"]


def _call_timing(call: CallTrace, step: int) -> CallTiming | None:
    if call.fwd_start is None or call.fwd_end is None:
        return None
    if call.raised and not call.recompute:
        # A forward that raised is not a call; a recompute that raised is checkpointing stopping early
        # once it has what backward needs, and its time was spent all the same.
        return None
    clock = call.clock
    timing = CallTiming(
        forward_start_ms=clock.offset_ms(call.fwd_start),
        forward_ms=clock.ms(call.fwd_start, call.fwd_end),
        recompute=call.recompute,
        step=step,
    )
    if call.bwd_start is not None and call.bwd_end is not None:
        timing.backward_start_ms = clock.offset_ms(call.bwd_start)
        timing.backward_ms = max(0.0, clock.ms(call.bwd_start, call.bwd_end))
    return timing


def fill_times(calls: Iterable[CallTrace], records: dict[str, ModuleRecord], step: int = 0) -> None:
    """Add ``calls`` (one step) to ``records``: call timings, calls, inclusive, self and recompute times."""
    timings: dict[int, CallTiming] = {}
    children_forward: dict[int, float] = defaultdict(float)
    children_backward: dict[int, float] = defaultdict(float)
    ordered: list[tuple[CallTrace, CallTiming]] = []
    for call in calls:
        timing = _call_timing(call, step)
        if timing is None:
            continue
        timings[id(call)] = timing
        ordered.append((call, timing))
        parent = call.parent
        if parent is not None:
            children_forward[id(parent)] += timing.forward_ms
            if timing.backward_ms is not None:
                children_backward[id(parent)] += timing.backward_ms

    for call, timing in ordered:
        record = records[call.name]
        record.call_times.append(timing)
        if timing.recompute:
            record.recompute_ms = (record.recompute_ms or 0.0) + timing.forward_ms
        else:
            record.calls += 1
            record.forward_ms = (record.forward_ms or 0.0) + timing.forward_ms
            self_forward = timing.forward_ms - children_forward.get(id(call), 0.0)
            record.self_forward_ms = (record.self_forward_ms or 0.0) + self_forward
        if timing.backward_ms is not None:
            record.backward_ms = (record.backward_ms or 0.0) + timing.backward_ms
            self_backward = max(0.0, timing.backward_ms - children_backward.get(id(call), 0.0))
            record.self_backward_ms = (record.self_backward_ms or 0.0) + self_backward
