"""Turn the tracker's raw stamps of one step into per-call and per-module milliseconds.

Backward intervals, per backward pass (graph task): the tracker stamps, for each call, the first of its own graph
nodes to start and the last to finish in each pass. Here each call's interval in a pass is widened to cover its
sub-calls' intervals in that pass (children first), so a call's backward in a pass runs from the first node of
its whole subtree to start to the last one to finish, and a child's interval lies inside its parent's. A call's
backward is the sum of its intervals over passes, never the span between two passes.

Recursion: a module's inclusive time counts only its outermost call in a call chain (as cProfile's cumulative
time does); ``calls`` counts every call and self times count every call's own time.

A call of a descendant made outside every call of a module of an ancestor's subtree (an encoder called by itself
before the model) is added to that ancestor's inclusive times, if the ancestor ran in the step, and to nothing
else of it (``record/adoption.py``).
"""
from __future__ import annotations

from itertools import starmap
from operator import attrgetter
from typing import Any, Iterable

from ..record.adoption import PREFIXES, adopters, prefix_of
from ..record.records import CallTiming
from .tracker import CallTrace

__all__ = ["StepTimes", "all_returned", "step_times"]


# Below a nanosecond, the finest stamp any clock gives, a call's backward less its children's is the round-off of
# summing intervals in ms (2.2e-16 ms where the children's intervals cover the call's: shown as "2.22e-13 µs"): 0.
_LEFTOVER_MS = 1e-6


class StepTimes:
    """One module's times in one step; ``None`` where a pass was not measured. ``timings``: every call's
    ``CallTiming`` fields as a tuple, in call order (a record makes its ``call_times`` from them when read)."""

    __slots__ = ("calls", "forward_ms", "backward_ms", "self_forward_ms", "self_backward_ms", "recompute_ms",
                 "timings", "host_forward_ms")

    def __init__(self, calls: int = 0, forward_ms: float | None = None, backward_ms: float | None = None,
                 self_forward_ms: float | None = None, self_backward_ms: float | None = None,
                 timings: list[tuple[Any, ...]] | None = None) -> None:
        self.calls = calls
        self.forward_ms = forward_ms
        self.backward_ms = backward_ms
        self.self_forward_ms = self_forward_ms
        self.self_backward_ms = self_backward_ms
        self.recompute_ms: float | None = None
        self.timings: list[tuple[Any, ...]] = [] if timings is None else timings  # CallTiming's fields, in order
        # The host's wall time of the counted forward calls, where CUDA events timed them (else None).
        self.host_forward_ms: float | None = None

    @property
    def call_times(self) -> list[CallTiming]:
        return list(starmap(CallTiming, self.timings))

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


def _merge_into_parent(call: CallTrace, parent: CallTrace, task: int) -> None:
    """Widen the parent's per-pass intervals to the call's (whose own are complete: its sub-calls are merged)."""
    if call.passes is None and parent.passes is None and parent.task in (None, task):
        if parent.task is None:  # the common case: one pass, the parent's own nodes did not run first
            parent.task, parent.bwd_start, parent.bwd_end = task, call.bwd_start, call.bwd_end
        else:
            interval = [parent.bwd_start, parent.bwd_end]
            _widen(interval, call.bwd_start, call.bwd_end)
            parent.bwd_start, parent.bwd_end = interval
        return
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


def all_returned(calls: list[CallTrace]) -> bool:
    """Whether every call's forward returned: none raised, none left open. Then every call is timed, and the
    calls hold nothing of the step but their stamps and names (a call that did not return may still hold the
    graph nodes its walk was to hook, or the exception being handled when it began)."""
    # A generator, not C-level passes (``map`` over ``attrgetter``): read once per block, right after the step, it
    # costs half as much cold (17 µs against 32 on BERT's 46 calls): the interpreter's loop is in the cache then,
    # builtins a block alone runs are not.
    return all(call.fwd_start is not None and call.fwd_end is not None and not call.raised for call in calls)


def _uncount_inside(calls: list[CallTrace], index: int, timings: list[tuple[Any, ...] | None]) -> None:
    """Take back the timings of the calls made inside ``calls[index]``, a forward that raised (a first attempt
    retried, a branch whose error a parent caught): its sub-calls belong to an attempt that is not a call, and kept
    they would read more time than their parent (whose own figures hold the attempt's time). The sums they added
    went to their parents, all inside the attempt and not counted either. Creation order puts them after it, up to
    the next call made under one of its ancestors (calls of other threads, whose ancestors are their own, may come
    between)."""
    failed = calls[index]
    ancestors = set()
    parent = failed.parent
    while parent is not None:
        ancestors.add(parent)
        parent = parent.parent
    for later in range(index + 1, len(calls)):
        parent = calls[later].parent
        while parent is not None and parent is not failed and parent not in ancestors:
            parent = parent.parent
        if parent is failed:
            timings[later] = None
        elif parent is not None:  # made under an ancestor: the failed call had ended on this thread
            return


def step_times(calls: Iterable[CallTrace], step: int = 0) -> dict[str, StepTimes]:
    """Per-module times of one step: calls, inclusive, self and recompute times, and every call's timing.

    Two passes over the calls, no object per call beyond its timing tuple. Calls are in creation order, a parent
    before its sub-calls: going backwards, a call's sub-calls are done when it is reached, so its backward
    intervals are complete (then widened into its parent's) and so are the sums of its counted sub-calls' times.
    Going forwards, each counted call's times are added to its module's, in call order."""
    calls = calls if type(calls) is list else list(calls)
    # A call can be inside a call of its own module only if some module was called more than once in the step:
    # else no call's parent chain is walked.
    names = list(map(_name, calls))
    maybe_recursive = len(set(names)) != len(names)
    # Sums of the counted sub-calls' times, by parent call (calls hash by identity).
    children_forward: dict[CallTrace, float] = {}
    children_backward: dict[CallTrace, float] = {}
    timings: list[tuple[Any, ...] | None] = [None] * len(calls)  # CallTiming's fields, None: not counted
    hosts: dict[int, float] | None = None  # by call index, the host's forward ms of calls timed by CUDA events
    for index in range(len(calls) - 1, -1, -1):
        call = calls[index]
        parent = call.parent
        start, end = call.fwd_start, call.fwd_end
        # A forward that raised is not a call, nor are the calls made inside it (its sub-calls, already counted
        # here, are taken back); a recompute that raised is checkpointing stopping early once it has what backward
        # needs, and its time was spent all the same.
        if call.raised and not call.recompute:
            _uncount_inside(calls, index, timings)
        elif start is not None and end is not None:
            clock = call.clock
            if type(start) is int:  # wall clocks: nanoseconds, read without a method call per stamp
                forward_start, forward_ms = (start - clock.origin) / 1e6, (end - start) / 1e6
            else:  # CUDA events, with the host's nanoseconds beside them (tracker.py)
                forward_start, forward_ms = clock.offset_ms(start[1]), clock.ms(start[1], end[1])
                if hosts is None:
                    hosts = {}
                hosts[index] = (end[0] - start[0]) / 1e6
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
            # Made inside a call of the same module: already inside that call's inclusive time.
            recursive = maybe_recursive and _nested_in_itself(call)
            timings[index] = (forward_start, forward_ms, backward_start_ms, backward_ms, call.recompute, step,
                              recursive)
            if parent is not None:
                children_forward[parent] = children_forward.get(parent, 0.0) + forward_ms
                if backward_ms is not None:
                    children_backward[parent] = children_backward.get(parent, 0.0) + backward_ms
            elif backward_ms is not None and call.elsewhere is not None:
                # Its backward runs inside that call's (below); its forward ran beside that call's own thread.
                children_backward[call.elsewhere] = children_backward.get(call.elsewhere, 0.0) + backward_ms
            elif backward_ms is not None and call.during is not None and call.during.clock is clock:
                # Re-run by the backward of that call's node, which ran the backward pass through its graph too: that
                # pass is this call's backward and not the running call's own (its forward stays the running call's:
                # re-run time is no call's forward).
                children_backward[call.during] = children_backward.get(call.during, 0.0) + backward_ms
        task = call.task
        if parent is None:
            # A call on a thread of its own while a call ran on another (a replica's): inside that call's
            # backward too, as its forward is inside that call's forward.
            parent = call.elsewhere
        # Stamps of two clocks (a CPU-stamped parent around CUDA-stamped children) cannot be compared.
        if parent is None or task is None or parent.clock is not call.clock:
            continue
        if call.passes is None and parent.passes is None:  # the common case, one pass: inline
            if parent.task is None:  # the parent's own nodes did not run first, nor another sub-call's
                parent.task, parent.bwd_start, parent.bwd_end = task, call.bwd_start, call.bwd_end
                continue
            b_start = call.bwd_start
            if parent.task == task and type(b_start) is int:  # wall clock: the stamps are ints (or None)
                p_start = parent.bwd_start
                if p_start is None or b_start < p_start:
                    parent.bwd_start = b_start
                b_end = call.bwd_end
                if b_end is not None:
                    p_end = parent.bwd_end
                    if p_end is None or b_end > p_end:
                        parent.bwd_end = b_end
                continue
        _merge_into_parent(call, parent, task)

    result: dict[str, StepTimes] = {}
    # Calls not made by their tree parent, with their timings and their host forward ms (None off CUDA events).
    uncalled: list[tuple[CallTrace, tuple[Any, ...], float | None]] = []
    known_prefix = PREFIXES.get
    for index, (call, timing) in enumerate(zip(calls, timings)):
        if timing is None:
            continue
        name = call.name
        parent = call.parent
        if parent is None or parent.name != (known_prefix(name) or prefix_of(name)):
            uncalled.append((call, timing, None if hosts is None else hosts.get(index)))
        times = result.get(name)
        _, forward_ms, _, backward_ms, recompute, _, recursive = timing
        if times is None:
            if not recompute and not recursive:  # the common case, a module's first call: its values as they are
                own = None if backward_ms is None else backward_ms - children_backward.get(call, 0.0)
                times = result[name] = StepTimes(1, forward_ms, backward_ms,
                                                 forward_ms - children_forward.get(call, 0.0),
                                                 None if own is None else own if own > _LEFTOVER_MS else 0.0, [timing])
                if hosts is not None and index in hosts:
                    times.host_forward_ms = hosts[index]
                continue
            times = result[name] = StepTimes()
        times.timings.append(timing)
        if recompute:
            if not recursive:
                times.recompute_ms = (times.recompute_ms or 0.0) + forward_ms
        else:
            times.calls += 1
            if not recursive:
                times.forward_ms = (times.forward_ms or 0.0) + forward_ms
                if hosts is not None and index in hosts:
                    times.host_forward_ms = (times.host_forward_ms or 0.0) + hosts[index]
            own = forward_ms - children_forward.get(call, 0.0)
            times.self_forward_ms = (times.self_forward_ms or 0.0) + own
        if backward_ms is not None:
            if not recursive:
                times.backward_ms = (times.backward_ms or 0.0) + backward_ms
            own = backward_ms - children_backward.get(call, 0.0)
            times.self_backward_ms = (times.self_backward_ms or 0.0) + (own if own > _LEFTOVER_MS else 0.0)
    for call, timing, host in uncalled:
        if _may_adopt(call, result):
            _adopt(result, adopters(call), timing[1], timing[3], host)
    return result


def _may_adopt(call: CallTrace, result: dict[str, StepTimes]) -> bool:
    """Whether a tree ancestor of the call's module below its caller's module ran in the step: else nothing
    adopts it (a ModuleList's child called by the list's parent, on every step of most models)."""
    caller = call.parent
    stop = None if caller is None else caller.name
    ancestor = call.name
    while ancestor and ancestor != stop:
        ancestor = prefix_of(ancestor)
        if ancestor in result:
            return ancestor != stop
    return False


def _adopt(result: dict[str, StepTimes], found: tuple[str, ...], forward_ms: float, backward_ms: float | None,
           host_ms: float | None = None) -> None:
    """Add an adopted call's inclusive times to those of its adopters that ran in the step (a call of their own
    that was not a checkpoint re-run); ``host_ms``: its host forward time, where CUDA events timed it."""
    for name in found:
        times = result.get(name)
        if times is None or not times.calls:
            continue
        times.forward_ms = (times.forward_ms or 0.0) + forward_ms
        if host_ms is not None and times.host_forward_ms is not None:
            times.host_forward_ms += host_ms
        if backward_ms is not None:
            times.backward_ms = (times.backward_ms or 0.0) + backward_ms
