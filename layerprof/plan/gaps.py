"""A chosen plan's wrappers priced by the other work between them (``WrapCost.gap_points``, ``wrap_cost.py``).

The knapsack prices every wrapper cold (``per_call_ms``): its cost must not depend on what else is wrapped. Once the
plan is chosen, its wrapped calls are known, and a call that runs right after another wrapped call, with little other
work between them, finds the checkpoint's code and data still in the caches and costs less (DenseNet's consecutive
dense layers: 0.38 ms a call measured against 0.83 priced cold). Here each wrapped call of the plan gets its gaps
from the profiled step's call times: in forward, the time from the end of the last wrapped call's forward to the
start of its own; in backward, from the start of the last wrapped call's backward (in backward's order) to the start
of its own, where its recomputation runs. The checkpoint's code for a call runs as its backward starts (the
recomputation's set-up), and the last call's recomputation and backward run after it: they are work between the two,
as the calibration's backward gap holds its blocks' own backward (adjacent transformer layers, a few ms of backward
each, are priced about cold; adjacent small dense layers, warm). From each gap the profiler's own hooks are taken off
(``hook_ms`` for every module call that starts in it). The first wrapped call of each pass has no wrapped call before
it in the step: cold. The plan's wrapper time is then its cold figure less, for each call, the cold per-call cost
less the cost at its gaps. A plan that wraps nothing adjacent (gaps of the calibration's filler or more on both
sides) is priced as before; a call whose timings are missing (a profile without call times) is priced cold. On a GPU
the call times are the device's, which run behind the host's Python: the gaps read there are the device's work, an
approximation of the host's.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from ..record.records import CallTiming, ModuleRecord
from .candidates import grad_calls
from .runs import parse_run
from .wrap_cost import WrapCost

__all__ = ["Span", "wrapped_spans", "gap_savings"]


@dataclass(frozen=True)
class Span:
    """One wrapped call in the profiled step: its forward and backward as (start, end) ms, backward None where the
    profile has no backward time for it."""

    name: str
    forward: tuple[float, float]
    backward: tuple[float, float] | None


def _calls(record: ModuleRecord) -> list[CallTiming]:
    return [timing for timing in record.call_times if not timing.recompute and not timing.recursive]


def _backward(first: CallTiming, last: CallTiming) -> tuple[float, float] | None:
    """The backward of a region whose first call in forward is ``first`` and last ``last``: backward runs in
    reverse, from ``last``'s start to ``first``'s end."""
    if last.backward_start_ms is None or first.backward_start_ms is None or first.backward_ms is None:
        return None
    return last.backward_start_ms, first.backward_start_ms + first.backward_ms


def wrapped_spans(records: dict[str, ModuleRecord], name: str) -> list[Span]:
    """Every call of a plan entry in the profiled step: a module's calls, or a run's (the i-th call of a run is
    the i-th call of each of its children, which a Sequential calls once each per call)."""
    run = parse_run(name)
    if run is None:
        found = _calls(records[name])
        return [Span(name, (call.forward_start_ms, call.forward_start_ms + call.forward_ms), _backward(call, call))
                for call in found]
    children = records[run[0]].children[run[1]:run[2]]
    firsts, lasts = _calls(children[0]), _calls(children[-1])
    if len(firsts) != len(lasts):
        return []
    return [Span(name, (first.forward_start_ms, last.forward_start_ms + last.forward_ms), _backward(first, last))
            for first, last in zip(firsts, lasts)]


def _gaps(spans: Sequence[tuple[float, float]], starts: list[float], hook_ms: float) -> list[float | None]:
    """For each (start, end) of ``spans`` in the order given, the time since the end of the one that started
    last before it, less ``hook_ms`` for each start of ``starts`` (sorted) inside that gap; None for the first."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    found: list[float | None] = [None] * len(spans)
    for before, after in zip(order, order[1:]):
        low, high = spans[before][1], spans[after][0]
        between = bisect.bisect_left(starts, high) - bisect.bisect_right(starts, low)
        found[after] = max(0.0, high - low - hook_ms * max(0, between))
    return found


def _entry(records: dict[str, ModuleRecord], name: str) -> ModuleRecord:
    """The record whose calls are a plan entry's: the module's, or a run's Sequential's."""
    run = parse_run(name)
    return records[name if run is None else run[0]]


def gap_savings(records: dict[str, ModuleRecord], names: Sequence[str], cost: WrapCost, hook_ms: float = 0.0
                ) -> dict[str, float]:
    """For each plan entry of ``names``: what its wrapper costs a step less than priced cold, from the gaps of
    its calls (0 where every call is cold). ``records``: the profile's records by qualified name."""
    saving = {name: 0.0 for name in names}
    if not cost.gap_points or not names:
        return saving
    # A call made under no_grad runs no checkpoint (the wrapper calls the forward as it is) and has no backward:
    # where its entry has such calls, those without a backward are no wrapped calls, before another or priced.
    entries = {name: _entry(records, name) for name in names}
    no_grad = {name for name, entry in entries.items() if grad_calls(entry) < float(entry.calls or 0)}
    spans = [span for name in names for span in wrapped_spans(records, name)
             if span.backward is not None or name not in no_grad]
    forward_starts, backward_starts = [], []
    for record in records.values():
        for call in record.call_times:
            forward_starts.append(call.forward_start_ms)
            if call.backward_start_ms is not None:
                backward_starts.append(call.backward_start_ms)
    forward_starts.sort()
    backward_starts.sort()
    forward_gaps = _gaps([span.forward for span in spans], forward_starts, hook_ms)
    timed = [i for i, span in enumerate(spans) if span.backward is not None]
    backward_gaps: list[float | None] = [None] * len(spans)
    # In backward, from the last wrapped call's start (its recomputation) to this one's start (the module doc).
    starts_only = [(spans[i].backward[0], spans[i].backward[0]) for i in timed]  # type: ignore[index]
    for i, gap in zip(timed, _gaps(starts_only, backward_starts, hook_ms)):
        backward_gaps[i] = gap
    counted = {name: 0 for name in names}
    for span, forward_gap, backward_gap in zip(spans, forward_gaps, backward_gaps):
        saving[span.name] += cost.per_call_ms - cost.per_call_at(forward_gap, backward_gap)
        counted[span.name] += 1
    for name in names:  # the last step's calls, scaled to the calls a step the cold figure prices
        calls = grad_calls(entries[name])  # (as the cold figure counts them)
        saving[name] = saving[name] * calls / counted[name] if counted[name] else 0.0
    return saving
