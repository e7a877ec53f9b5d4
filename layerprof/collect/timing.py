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
    if call.bwd_start is not None and call.bwd_end is not None:
        timing.backward_start_ms = clock.offset_ms(call.bwd_start)
        timing.backward_ms = max(0.0, clock.ms(call.bwd_start, call.bwd_end))
    return timing


def step_times(calls: Iterable[CallTrace], step: int = 0) -> dict[str, StepTimes]:
    """Per-module times of one step: calls, inclusive, self and recompute times, and every call's timing."""
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
        if timing.recompute:
            times.recompute_ms = _add(times.recompute_ms, timing.forward_ms)
        else:
            times.calls += 1
            times.forward_ms = _add(times.forward_ms, timing.forward_ms)
            own = timing.forward_ms - children_forward.get(id(call), 0.0)
            times.self_forward_ms = _add(times.self_forward_ms, own)
        if timing.backward_ms is not None:
            times.backward_ms = _add(times.backward_ms, timing.backward_ms)
            own = max(0.0, timing.backward_ms - children_backward.get(id(call), 0.0))
            times.self_backward_ms = _add(times.self_backward_ms, own)
    return result
