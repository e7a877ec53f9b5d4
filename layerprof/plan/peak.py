"""The step's peak memory with a checkpoint plan, predicted from the memory measured in the profiled step.

The memory meter keeps, on a device its reader covers (CUDA; the CPU with ``metrics=("live_memory",)``), the bytes
allocated at every boundary of the step (each module call's forward start and end, backward start and end) and the
peak of each interval between two boundaries, and each call's boundaries beside the storages of its forward
(``checkpoint_bytes.storage_table``). A plan changes the step's memory only through what autograd holds, so each
interval's peak moves by what the plan holds then less what the profiled step held:

- a storage saved only inside wrapped regions (none of which takes it as input) is not held from the end of its
  region's forward to the start of its backward: ``-bytes`` over that span (for a storage saved in several
  regions, from the first one's forward end to the last one's backward start, except while a region's backward
  runs, where it is saved again); not one held besides autograd (``held_elsewhere``), which the recomputation
  replaces;
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

A planner asks this of many plans of one profile (``checkpoint_plan(peak=...)`` of every plan on the frontier):
``PeakModel`` reads the profile's tables once into arrays, and each plan then costs a few array passes (about 2 ms
on a 10,000-module step), not a walk of every storage in Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..metrics.checkpoint_bytes import regions

__all__ = ["PeakModel", "PeakPrediction", "predict_peak", "step_peak"]

_NONE = np.iinfo(np.int64).max  # "no boundary" where a minimum is taken


@dataclass(frozen=True)
class PeakPrediction:
    """The step's peak with a plan: ``peak_bytes`` (on the profile's reader's scale: allocated bytes on CUDA,
    live bytes made in the step on the CPU), ``phase`` (``"forward"``, ``"backward"``, ``"recompute"`` or
    ``"between calls"``: the loss, or after the last backward) and ``at``, the module whose backward or
    recomputation holds it (None in forward, or between calls)."""

    peak_bytes: int
    phase: str
    at: str | None
    interval: int = field(default=0, compare=False)  # where: the interval's number (a recomputation's: its first)


def step_peak(timeline: dict[str, Any]) -> int:
    """The profiled step's own peak: the highest interval from the model's first call on."""
    return max(timeline["peaks"][2:], default=0)


def _ragged(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """A list of lists of call indexes as one flat array and, for each entry, the index of its list."""
    counts = np.fromiter((len(entry) for entry in lists), dtype=np.int64, count=len(lists))
    flat = np.fromiter((i for entry in lists for i in entry), dtype=np.int64, count=int(counts.sum()))
    return flat, np.repeat(np.arange(len(lists), dtype=np.int64), counts)


def _subtree_ends(parents: Sequence[int]) -> np.ndarray | None:
    """For calls listed parents first, the end of each call's subtree (calls ``i .. end - 1``) where every subtree
    is one stretch of the list (calls nest in time: a call's children start and end inside it); None otherwise."""
    ends = np.arange(1, len(parents) + 1, dtype=np.int64)
    stack: list[int] = []
    for i, parent in enumerate(parents):
        while stack and stack[-1] != parent:
            ends[stack.pop()] = i
        if parent >= 0 and not stack:
            return None  # its parent's stretch has ended
        stack.append(i)
    for i in stack:
        ends[i] = len(parents)
    return ends


class _Forward:
    """One forward's storage table as arrays: the calls' boundaries, and each storage's savers and takers flat."""

    def __init__(self, table: dict[str, list[Any]]) -> None:
        self.table = table
        self.names = table["names"]
        count = len(self.names)
        self.parents = np.asarray(table["parents"], dtype=np.int64).reshape(count)
        self.bounds = np.asarray(table["bounds"], dtype=np.int64).reshape(count, 4)
        self.ends = _subtree_ends(table["parents"])
        self.calls_of: dict[str, list[int]] = {}
        for i, name in enumerate(self.names):
            self.calls_of.setdefault(name, []).append(i)
        self.sizes = np.asarray(table["sizes"], dtype=np.int64)
        self.savers, self.saver_of = _ragged(table["savers"])
        self.takers, self.taker_of = _ragged(table["inputs"])
        storages = len(self.sizes)
        self.saved = np.bincount(self.saver_of, minlength=storages) > 0
        self.held_elsewhere = np.zeros(storages, dtype=bool)
        self.held_elsewhere[np.asarray(table.get("held_elsewhere", ()), dtype=np.int64)] = True
        self.root_taken = np.bincount(self.taker_of[self.parents[self.takers] < 0], minlength=storages) > 0

    def regions(self, wrapped: set[str], runs: Sequence[Sequence[str]]) -> np.ndarray:
        """``checkpoint_bytes.regions`` from each region's opening calls and its subtree's stretch."""
        if self.ends is None:
            return np.asarray(regions(self.table, wrapped, runs), dtype=np.int64)
        firsts = {run[0] for run in runs}
        events: list[tuple[int, int]] = []  # (call, the call opening its region)
        for name in wrapped | firsts:
            events += [(i, i) for i in self.calls_of.get(name, ())]
        for run in runs:
            opened = self.calls_of.get(run[0], [])
            for name in run[1:]:
                if name in wrapped or name in firsts:
                    continue
                for i in self.calls_of.get(name, ()):
                    k = int(np.searchsorted(opened, i)) - 1  # the first child's last call before it
                    if k >= 0:
                        events.append((i, opened[k]))
        region = np.full(len(self.names), -1, dtype=np.int64)
        if not events:
            return region
        events.sort()
        calls = np.array([call for call, _ in events], dtype=np.int64)
        opening = np.array([start for _, start in events], dtype=np.int64)
        ends = self.ends[calls]
        reach = np.maximum.accumulate(ends)
        outermost = calls >= np.concatenate(([0], reach[:-1]))  # not inside an earlier event's subtree
        calls, opening, ends = calls[outermost], opening[outermost], ends[outermost]
        everywhere = np.arange(len(self.names), dtype=np.int64)
        at = np.searchsorted(calls, everywhere, side="right") - 1
        inside = (at >= 0) & (everywhere < ends[np.maximum(at, 0)])
        region[inside] = opening[at[inside]]
        return region


class _Change:
    """Additions over spans of boundaries ``[a, b)``, read per interval (interval ``k`` ends at boundary ``k``)."""

    def __init__(self, boundaries: int) -> None:
        self.diff = np.zeros(boundaries + 2, dtype=np.int64)

    def add(self, start: np.ndarray, end: np.ndarray, size: np.ndarray) -> None:
        kept = start < end
        np.add.at(self.diff, start[kept] + 1, size[kept])
        np.add.at(self.diff, end[kept] + 1, -size[kept])

    def per_interval(self) -> np.ndarray:
        return np.cumsum(self.diff)


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a sorted key array: where each run of equal keys starts, and its key."""
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1]))) if len(keys) else keys
    return starts, keys[starts]


class PeakModel:
    """The profiled step's memory, read once, to predict its peak under many plans (see the module doc)."""

    @staticmethod
    def predicts(tables: Sequence[dict[str, list[Any]]], timeline: dict[str, Any]) -> bool:
        """Whether a profile's storage ``tables`` and memory ``timeline`` can predict a plan's peak (the step's
        memory read at two boundaries or more, and every call's boundaries recorded), without building the model."""
        return len(timeline["levels"]) - 1 >= 2 and all("bounds" in table for table in tables)

    def __init__(self, tables: Sequence[dict[str, list[Any]]], timeline: dict[str, Any]) -> None:
        self.levels = np.asarray(timeline["levels"], dtype=np.int64)
        self.peaks = np.asarray(timeline["peaks"], dtype=np.int64)
        self.count = len(self.levels) - 1
        self.usable = self.predicts(tables, timeline)
        self.forwards = [_Forward(table) for table in tables] if self.usable else []
        # Range maxima of the interval peaks (a sparse table): a region's forward rise in two lookups.
        self._maxima = [self.peaks]
        while self.usable and 2 ** len(self._maxima) <= len(self.peaks):
            half, last = 2 ** (len(self._maxima) - 1), self._maxima[-1]
            self._maxima.append(np.maximum(last[:-half], last[half:]))

    def _highest(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The highest interval peak over ``first .. last`` (inclusive), for each pair."""
        level = np.floor(np.log2(np.maximum(last - first + 1, 1))).astype(np.int64)
        found = np.empty(len(first), dtype=np.int64)
        for k in np.unique(level):
            chosen = level == k
            table = self._maxima[k]
            found[chosen] = np.maximum(table[first[chosen]], table[last[chosen] - 2**k + 1])
        return found

    def predict(self, wrapped: set[str], runs: Sequence[Sequence[str]] = ()) -> PeakPrediction | None:
        """The step's peak with ``wrapped`` (and ``runs``, names in call order) under checkpoint; None where a table
        has no boundaries (a profile without a reader on its device) or a wrapped call ran on another device."""
        if not self.usable:
            return None
        change = _Change(self.count)
        recomputed = []
        for forward in self.forwards:
            found = self._spans(forward, wrapped, runs, change)
            if found is None:
                return None
            recomputed.append(found)
        shift = change.per_interval()
        moved = self.peaks[2:self.count + 1] + shift[2:self.count + 1]
        best = int(np.argmax(moved)) + 2
        peak = int(moved[best - 2])
        at: tuple[str, str | None] | None = None
        for forward, (starts, again, fe, bs) in zip(self.forwards, recomputed):
            if not len(starts):
                continue
            fs = forward.bounds[starts, 0]  # a region's first call starts it
            rise = self._highest(fs + 1, fe) - self.levels[fs]
            held = self.levels[bs] + shift[bs + 1] - again + rise
            top = int(np.argmax(held))
            if held[top] > peak:
                peak, at, best = int(held[top]), ("recompute", forward.names[int(starts[top])]), int(bs[top]) + 1
        return PeakPrediction(peak, *(at or self._where(best)), interval=best)

    def profiled_interval(self) -> int:
        """The interval where the profiled step peaked (the first of equals)."""
        return int(np.argmax(self.peaks[2:self.count + 1])) + 2

    def saved_inside(self) -> dict[str, float]:
        """For each module, the bytes its calls and the calls inside them save, a storage counted once for each
        call that saves it (so at least what wrapping it can take off any interval: a plan lowers the profiled peak
        by at most the sum over its wrapped modules); infinite where a table's calls do not nest in order."""
        found: dict[str, float] = {}
        for forward in self.forwards:
            if forward.ends is None:
                return {name: float("inf") for forward in self.forwards for name in forward.names}
            own = np.bincount(forward.savers, weights=forward.sizes[forward.saver_of], minlength=len(forward.names))
            running = np.concatenate(([0.0], np.cumsum(own)))
            inside = running[forward.ends] - running[:-1]
            for name, calls in forward.calls_of.items():
                found[name] = found.get(name, 0.0) + float(inside[calls].sum())
        return found

    def held_across(self, interval: int) -> set[str]:
        """The modules a call of which, wrapped, would not hold its saved bytes over ``interval``: its forward ended
        before it and its backward had not started (a region frees bytes only there)."""
        found: set[str] = set()
        for forward in self.forwards:
            ends, starts = forward.bounds[:, 1], forward.bounds[:, 2]
            across = np.flatnonzero((ends > 0) & (ends < interval) & (interval <= starts))
            found.update(forward.names[i] for i in across)
        return found

    def _spans(self, forward: _Forward, wrapped: set[str], runs: Sequence[Sequence[str]], change: _Change
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Add one forward's changes; its recomputed regions (their opening calls, in call order) with the bytes each
        saves again, its forward end and its backward start; None where a wrapped call's boundaries are unknown."""
        region = forward.regions(wrapped, runs)
        count = len(forward.names)
        inside = region >= 0
        members, start_of = np.flatnonzero(inside), region[inside]
        bounds = forward.bounds[members]
        if len(members) and not (bounds[:, 0].all() and bounds[:, 1].all()):
            return None  # a call on another device, or one the meter did not see end
        # Each region's spans: its forward from its first call's start to its last call's end, its backward from
        # the earliest start seen to the latest end.
        forward_end = np.zeros(count, dtype=np.int64)
        backward_start = np.full(count, _NONE, dtype=np.int64)
        backward_end = np.zeros(count, dtype=np.int64)
        np.maximum.at(forward_end, start_of, bounds[:, 1])
        np.minimum.at(backward_start, start_of, np.where(bounds[:, 2] > 0, bounds[:, 2], _NONE))
        np.maximum.at(backward_end, start_of, bounds[:, 3])
        starts = np.unique(start_of)
        backwarded = np.zeros(count, dtype=bool)
        backwarded[starts] = (backward_start[starts] != _NONE) & (backward_end[starts] > 0)
        backward_start[backward_start == _NONE] = 0
        sizes = forward.sizes
        again = np.zeros(count, dtype=np.int64)
        # Storages saved only inside checkpoints, none of which takes them as input: not held from the first
        # region's forward end to the last one's backward start, except while a region's backward runs.
        saver_region = region[forward.savers]
        outside = np.bincount(forward.saver_of[saver_region < 0], minlength=len(sizes)) > 0
        opened_by = region[forward.takers] == forward.takers
        held_in = np.bincount(forward.taker_of[opened_by], minlength=len(sizes)) > 0
        freed = forward.saved & ~outside & ~held_in
        pick = freed[forward.saver_of] & (saver_region >= 0)
        pick[pick] = backwarded[saver_region[pick]]
        pairs = np.unique(forward.saver_of[pick] * count + saver_region[pick])
        storage, held = pairs // count, pairs % count
        first_pair, owners = _groups(storage)
        if len(pairs):
            first = np.minimum.reduceat(forward_end[held], first_pair)
            last = np.maximum.reduceat(backward_start[held], first_pair)
            lost = np.where(forward.held_elsewhere, 0, sizes)
            change.add(first, last, -lost[owners])
            last_each = np.repeat(last, np.diff(np.append(first_pair, len(pairs))))
            np.add.at(again, held, sizes[storage])
            change.add(backward_start[held], np.minimum(backward_end[held], last_each), lost[storage])
        # Inputs of a region that nothing saved (not the model's own): held by its checkpoint until its backward ends.
        pick = ~forward.saved[forward.taker_of] & opened_by
        pick[pick] = backwarded[forward.takers[pick]]
        taken, holder = forward.taker_of[pick], forward.takers[pick]
        first_pair, owners = _groups(taken)
        if len(taken):
            first = np.minimum.reduceat(forward_end[holder], first_pair)
            last = np.maximum.reduceat(backward_end[holder], first_pair)
            kept = ~forward.root_taken[owners]
            change.add(first[kept], last[kept], sizes[owners][kept])
        recomputed = starts[backwarded[starts]]
        return recomputed, again[recomputed], forward_end[recomputed], backward_start[recomputed]

    def _where(self, interval: int) -> tuple[str, str | None]:
        """The phase of an interval and the module whose backward holds it: the latest call whose backward started
        before the interval and had not ended (None in forward or outside every call)."""
        latest: tuple[int, str] | None = None
        for forward in self.forwards:
            fs, fe, bs, be = forward.bounds.T
            roots = forward.parents < 0
            if ((fs[roots] < interval) & (interval <= fe[roots])).any():
                return "forward", None
            inside = np.flatnonzero((bs > 0) & (bs < interval) & (interval <= be))
            if len(inside):
                top = bs[inside].max()
                found = (int(top), max(forward.names[i] for i in inside[bs[inside] == top]))
                latest = found if latest is None or found > latest else latest
        return ("backward", latest[1]) if latest is not None else ("between calls", None)


def predict_peak(tables: Sequence[dict[str, list[Any]]], timeline: dict[str, Any], wrapped: set[str],
                 runs: Sequence[Sequence[str]] = ()) -> PeakPrediction | None:
    """The step's peak with ``wrapped`` (and ``runs``, names in call order) under checkpoint (see the module doc);
    None where a table has no boundaries (a profile without a reader on its device) or a wrapped call ran on
    another device. One plan: ``PeakModel`` for many."""
    return PeakModel(tables, timeline).predict(wrapped, runs)
