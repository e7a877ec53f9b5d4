"""Turn the tracker's raw stamps of one step into per-call and per-module milliseconds.

Backward intervals, per backward pass (graph task): the tracker stamps, for each call, the first of its own graph
nodes to start and the last to finish in each pass. Here each call's interval in a pass is widened to cover its
sub-calls' intervals in that pass (children first), so a call's backward in a pass runs from the first node of
its whole subtree to start to the last one to finish, and a child's interval lies inside its parent's. A call's
backward is the sum of its intervals over passes, never the span between two passes.

Recursion: a module's inclusive time counts only its outermost call in a call chain (as cProfile's cumulative
time does); ``calls`` counts every call and self times count every call's own time.
"""
from __future__ import annotations

from itertools import starmap
from operator import attrgetter
from typing import Any, Iterable

from ..record.records import CallTiming
from .tracker import CallTrace

__all__ = ["StepTimes", "step_times"]


class StepTimes:
    """One module's times in one step; ``None`` where a pass was not measured. ``call_times`` (every call's
    ``CallTiming``) is built when read: only the last step's are kept, so the other steps never pay for them."""

    __slots__ = ("calls", "forward_ms", "backward_ms", "self_forward_ms", "self_backward_ms", "recompute_ms",
                 "_timings", "_call_times")

    def __init__(self) -> None:
        self.calls = 0
        self.forward_ms: float | None = None
        self.backward_ms: float | None = None
        self.self_forward_ms: float | None = None
        self.self_backward_ms: float | None = None
        self.recompute_ms: float | None = None
        self._timings: list[tuple[Any, ...]] = []  # CallTiming's fields, in order
        self._call_times: list[CallTiming] | None = None

    @property
    def call_times(self) -> list[CallTiming]:
        if self._call_times is None:
            self._call_times = list(starmap(CallTiming, self._timings))
        return self._call_times

    def __repr__(self) -> str:
        shown = ", ".join(f"{field}={getattr(self, field)!r}" for field in self.__slots__[:6])
        return f"StepTimes({shown})"


def _key(stamp: Any) -> int:
    # Host nanoseconds: the stamp itself on wall clocks, the first item of an (ns, event) pair on CUDA events.
    return stamp if type(stamp) is int else stamp[0]


def _raw(stamp: Any) -> Any:
    return stamp if type(stamp) is int else stamp[1]


def _passes(call: CallTrace) -> dict[int, list[Any]]:
    """``{task: [start, end]}`` of every pass of the call, same-task fragments joined."""
    result: dict[int, list[Any]] = {}
    fragments = [*(call.passes or ()), (call.task, call.bwd_start, call.bwd_end)]
    for task, start, end in fragments:
        known = result.get(task)
        if known is None:
            result[task] = [start, end]
        else:
            _widen(known, start, end)
    return result


def _widen(interval: list[Any], start: Any, end: Any) -> None:
    if start is not None and (interval[0] is None or _key(start) < _key(interval[0])):
        interval[0] = start
    if end is not None and (interval[1] is None or _key(end) > _key(interval[1])):
        interval[1] = end


def _merge_into_parents(calls: list[CallTrace]) -> None:
    """Widen every call's per-pass intervals to its sub-calls'. Calls are in creation order, so a parent comes
    before its children, and going backwards completes each child before it is merged."""
    for call in reversed(calls):
        parent = call.parent
        task = call.task
        if parent is None or task is None or parent.clock is not call.clock:
            # Stamps of two clocks (a CPU-stamped parent around CUDA-stamped children) cannot be compared.
            continue
        if call.passes is None and parent.passes is None and parent.task in (None, task):
            if parent.task is None:  # the common case: one pass, the parent's own nodes did not run first
                parent.task, parent.bwd_start, parent.bwd_end = task, call.bwd_start, call.bwd_end
            else:
                interval = [parent.bwd_start, parent.bwd_end]
                _widen(interval, call.bwd_start, call.bwd_end)
                parent.bwd_start, parent.bwd_end = interval
            continue
        merged = _passes(parent) if parent.task is not None else {}
        for child_task, (start, end) in _passes(call).items():
            known = merged.get(child_task)
            if known is None:
                merged[child_task] = [start, end]
            else:
                _widen(known, start, end)
        tasks = list(merged)
        parent.task = tasks[-1]
        parent.bwd_start, parent.bwd_end = merged[tasks[-1]]
        parent.passes = [(t, *merged[t]) for t in tasks[:-1]] or None


def _backward(call: CallTrace) -> tuple[float | None, Any]:
    """The call's backward milliseconds summed over passes, and the start of its first pass."""
    if call.task is None:
        return None, None
    clock = call.clock
    if call.passes is None:
        if call.bwd_start is None or call.bwd_end is None:
            return None, None
        return max(0.0, clock.ms(_raw(call.bwd_start), _raw(call.bwd_end))), call.bwd_start
    total: float | None = None
    first = None
    for start, end in _passes(call).values():
        if start is None or end is None:
            continue
        total = (total or 0.0) + max(0.0, clock.ms(_raw(start), _raw(end)))
        if first is None or _key(start) < _key(first):
            first = start
    return total, first


def _nested_in_itself(call: CallTrace) -> bool:
    name = call.name
    parent = call.parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.parent
    return False


_name = attrgetter("name")


def step_times(calls: Iterable[CallTrace], step: int = 0) -> dict[str, StepTimes]:
    """Per-module times of one step: calls, inclusive, self and recompute times, and every call's timing."""
    calls = list(calls)
    _merge_into_parents(calls)
    # A call can be inside a call of its own module only if some module was called more than once in the step:
    # else no call's parent chain is walked.
    names = list(map(_name, calls))
    maybe_recursive = len(set(names)) != len(names)
    # Sums of the counted sub-calls' times, by parent call (calls hash by identity).
    children_forward: dict[CallTrace, float] = {}
    children_backward: dict[CallTrace, float] = {}
    # (call, forward start ms, forward ms, backward start ms, backward ms) of the calls that count
    ordered: list[tuple[CallTrace, float, float, float | None, float | None]] = []
    append = ordered.append
    for call in calls:
        start, end = call.fwd_start, call.fwd_end
        if start is None or end is None or (call.raised and not call.recompute):
            # A forward that raised is not a call; a recompute that raised is checkpointing stopping early
            # once it has what backward needs, and its time was spent all the same.
            continue
        clock = call.clock
        if type(start) is int:  # wall clocks: nanoseconds, read without a method call per stamp
            forward_start, forward_ms = (start - clock.origin) / 1e6, (end - start) / 1e6
        else:
            forward_start, forward_ms = clock.offset_ms(start), clock.ms(start, end)
        backward_start_ms: float | None
        backward_ms: float | None
        b_start, b_end = call.bwd_start, call.bwd_end
        if call.task is None:  # no backward node of its own ran
            backward_ms = backward_start_ms = None
        elif call.passes is None and type(b_start) is int and b_end is not None:  # one pass, wall clock: inline
            backward_ms = (b_end - b_start) / 1e6
            if backward_ms < 0.0:
                backward_ms = 0.0
            backward_start_ms = (b_start - clock.origin) / 1e6
        else:
            backward_ms, backward_start = _backward(call)
            backward_start_ms = None if backward_ms is None else clock.offset_ms(_raw(backward_start))
        append((call, forward_start, forward_ms, backward_start_ms, backward_ms))
        parent = call.parent
        if parent is not None:
            children_forward[parent] = children_forward.get(parent, 0.0) + forward_ms
            if backward_ms is not None:
                children_backward[parent] = children_backward.get(parent, 0.0) + backward_ms

    result: dict[str, StepTimes] = {}
    for call, forward_start, forward_ms, backward_start_ms, backward_ms in ordered:
        name = call.name
        times = result.get(name)
        if times is None:
            times = result[name] = StepTimes()
        # A call inside another call of the same module is already inside that call's inclusive time.
        recursive = maybe_recursive and _nested_in_itself(call)
        recompute = call.recompute
        times._timings.append((forward_start, forward_ms, backward_start_ms, backward_ms, recompute, step, recursive))
        if recompute:
            if not recursive:
                times.recompute_ms = (times.recompute_ms or 0.0) + forward_ms
        else:
            times.calls += 1
            if not recursive:
                times.forward_ms = (times.forward_ms or 0.0) + forward_ms
            own = forward_ms - children_forward.get(call, 0.0)
            times.self_forward_ms = (times.self_forward_ms or 0.0) + own
        if backward_ms is not None:
            if not recursive:
                times.backward_ms = (times.backward_ms or 0.0) + backward_ms
            own = backward_ms - children_backward.get(call, 0.0)
            times.self_backward_ms = (times.self_backward_ms or 0.0) + (own if own > 0.0 else 0.0)
    return result
