"""Turn the tracker's raw stamps of one step into per-call and per-module milliseconds."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from ..record.records import CallTiming
from .tracker import CallTrace

__all__ = ["StepTimes", "step_times"]


@dataclass
class StepTimes:
    """One module's times in one step; ``None`` where a pass was not measured."""

    calls: int = 0
    forward_ms: float | None = None
    backward_ms: float | None = None
    self_forward_ms: float | None = None
    self_backward_ms: float | None = None
    recompute_ms: float | None = None
    call_times: list[CallTiming] = field(default_factory=list)


def _add(total: float | None, value: float) -> float:
    return value if total is None else total + value


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
    intervals = call.backward_intervals()
    if intervals:
        # One interval per backward pass through the call: their sum, never the span between passes.
        timing.backward_start_ms = clock.offset_ms(intervals[0][0])
        timing.backward_ms = sum(max(0.0, clock.ms(start, end)) for start, end in intervals)
    return timing


def _nested_in_itself(call: CallTrace) -> bool:
    """Whether a call of the same module encloses this one (recursion): its time is already in that call's."""
    parent = call.parent
    while parent is not None:
        if parent.name == call.name:
            return True
        parent = parent.parent
    return False


def step_times(calls: Iterable[CallTrace], step: int = 0) -> dict[str, StepTimes]:
    """Per-module times of one step: calls, inclusive, self and recompute times, and every call's timing.

    Inclusive times add up the outermost calls of a module only (a recursive call is inside the time of the call
    that made it, as in cProfile's cumulative time); ``calls`` counts every call; self times add up every call's
    own part."""
    children_forward: dict[int, float] = defaultdict(float)
    children_backward: dict[int, float] = defaultdict(float)
    ordered: list[tuple[CallTrace, CallTiming]] = []
    for call in calls:
        timing = _call_timing(call, step)
        if timing is None:
            continue
        ordered.append((call, timing))
        parent = call.parent
        if parent is not None:
            children_forward[id(parent)] += timing.forward_ms
            if timing.backward_ms is not None:
                children_backward[id(parent)] += timing.backward_ms

    result: dict[str, StepTimes] = {}
    for call, timing in ordered:
        times = result.get(call.name)
        if times is None:
            times = result[call.name] = StepTimes()
        times.call_times.append(timing)
        recursive = timing.recursive = _nested_in_itself(call)
        if timing.recompute:
            times.recompute_ms = _add(times.recompute_ms, timing.forward_ms)
        else:
            times.calls += 1
            if not recursive:
                times.forward_ms = _add(times.forward_ms, timing.forward_ms)
            own = timing.forward_ms - children_forward.get(id(call), 0.0)
            times.self_forward_ms = _add(times.self_forward_ms, own)
        if timing.backward_ms is not None:
            if not recursive:
                times.backward_ms = _add(times.backward_ms, timing.backward_ms)
            own = max(0.0, timing.backward_ms - children_backward.get(id(call), 0.0))
            times.self_backward_ms = _add(times.self_backward_ms, own)
    return result
