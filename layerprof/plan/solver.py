"""The exact choice of modules to recompute: a tree knapsack solved by dynamic programming on a byte grid.

Pure numbers, no torch. The tree is given in pre-order: node ``i``'s subtree is ``i .. ends[i] - 1``. Every option
covers a stretch of that order: choosing node ``i`` covers its subtree, ``i .. ends[i] - 1``, and a *run* (several
consecutive children of one parent wrapped together) covers ``start .. jump - 1``, the subtrees of those children.
A choice is admissible when its stretches do not overlap (a module and its descendants are never wrapped both,
nor a run and a module inside it or around it). Walking the pre-order, each position is either passed over (go
on to ``i + 1``, into the subtree) or an option starting there is chosen (jump past its stretch), so

    best[i][b] = min(best[i + 1][b], min over options o at i of costs[o] + best[jump[o]][max(0, b - units[o])])

is the least cost of freeing at least ``b`` grid units with options from ``i`` on: O(options x grid) in all, one
numpy row per option. Weights are rounded down to the grid, so a solution frees at least what it claims; the
grid has ``resolution`` steps up to the target, so rounding moves the target by at most (chosen options) /
resolution of it, and is exact when the target is below ``resolution`` bytes. Options are numbered: node ``i``
is ``i``, run ``k`` is ``len(weights) + k``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

__all__ = ["Solution", "Run", "solve", "best_reachable", "frontier", "iter_frontier", "ends_of"]

DEFAULT_RESOLUTION = 4096


@dataclass(frozen=True)
class Solution:
    """Chosen options (node indexes in pre-order, then runs numbered after the nodes), the bytes they free (exact
    sum of weights) and their cost."""

    chosen: tuple[int, ...]
    freed: int
    cost: float


class Run(NamedTuple):
    """An option besides the nodes: it covers pre-order positions ``start .. jump - 1``, frees ``weight`` and
    costs ``cost``. A tuple, so that the solver reads thousands as columns at once."""

    start: int
    jump: int
    weight: int
    cost: float


def ends_of(parents: Sequence[int]) -> list[int]:
    """``ends`` for a pre-order list of parent indexes (-1 for the root)."""
    ends = list(range(1, len(parents) + 1))
    for i in range(len(parents) - 1, 0, -1):
        parent = parents[i]
        if ends[i] > ends[parent]:
            ends[parent] = ends[i]
    return ends


class _Options(NamedTuple):
    """Every option in position order (at a position its node first, then its runs in their order): ``numbers``,
    ``jumps``, ``weights`` and ``costs`` as arrays, and ``offsets``: position i's options are
    ``offsets[i]:offsets[i + 1]``."""

    numbers: np.ndarray
    jumps: np.ndarray
    weights: np.ndarray
    costs: np.ndarray
    offsets: list[int]

    def kept(self, keep: np.ndarray, count: int) -> _Options:
        """The options where ``keep`` is true, in the same order."""
        positions = np.repeat(np.arange(count), np.diff(self.offsets))[keep]
        return _Options(self.numbers[keep], self.jumps[keep], self.weights[keep], self.costs[keep],
                        np.searchsorted(positions, np.arange(count + 1)).tolist())


def _options(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], runs: Sequence[Run]) -> _Options:
    count = len(weights)
    starts, jumps, freed, prices = (list(column) for column in zip(*runs)) if runs else ([], [], [], [])
    starts = np.concatenate([np.arange(count), np.asarray(starts, dtype=np.int64)])
    order = np.argsort(starts, kind="stable")  # the nodes come first, so first at their position

    def column(nodes: Sequence[Any], found: list[Any], dtype: type) -> np.ndarray:
        return np.concatenate([np.asarray(nodes, dtype=dtype).reshape(count), np.asarray(found, dtype=dtype)])[order]

    return _Options(order, column(ends, jumps, np.int64), column(weights, freed, np.int64),
                    column(costs, prices, np.float64), np.searchsorted(starts[order], np.arange(count + 1)).tolist())


def _pricing(weights: Sequence[int], costs: Sequence[float], runs: Sequence[Run]) -> Callable[[list[int]], Solution]:
    """The ``Solution`` of a choice of options (their numbers), for many choices: every option's bytes and cost read
    once, each choice's summed in its order."""
    freed = [int(weight) for weight in weights] + [int(run.weight) for run in runs]
    price = [float(cost) for cost in costs] + [float(run.cost) for run in runs]

    def solution(chosen: list[int]) -> Solution:
        return Solution(tuple(chosen), sum([freed[o] for o in chosen]), sum([price[o] for o in chosen]))

    return solution


def best_reachable(weights: Sequence[int], ends: Sequence[int], runs: Sequence[Run] = ()
                   ) -> tuple[int, tuple[int, ...]]:
    """The most bytes any admissible choice frees (options with weight <= 0 are never worth choosing), and it."""
    count = len(weights)
    options = _options(weights, [0.0] * count, ends, runs)
    options = options.kept(options.weights > 0, count)
    numbers, jumps, freed, offsets = (options.numbers.tolist(), options.jumps.tolist(), options.weights.tolist(),
                                      options.offsets)
    best = [0] * (count + 1)
    take: list[int] = [-1] * count  # the option taken at each position, -1 none
    for i in range(count - 1, -1, -1):
        best[i] = best[i + 1]
        for o in range(offsets[i], offsets[i + 1]):
            if freed[o] + best[jumps[o]] > best[i]:
                best[i], take[i] = freed[o] + best[jumps[o]], o
    chosen, i = [], 0
    while i < count:
        o = take[i]
        if o < 0:
            i += 1
        else:
            chosen.append(numbers[o])
            i = jumps[o]
    return best[0], tuple(chosen)


class _Table(NamedTuple):
    """The table of ``best`` (see the module doc) on the grid for a need: the grid step, the row of position 0,
    and per position the options worth a grid unit (``numbers``, ``jumps``, ``units``: position i's are
    ``offsets[i]:offsets[i + 1]``) and the levels where each is taken (``choices``: one packed row of bits per
    option, in their order; b"" for a position without options)."""

    grid: int
    best: np.ndarray
    numbers: list[int]
    jumps: list[int]
    units: list[int]
    offsets: list[int]
    choices: list[bytes]


def _table(options: _Options, need: int, resolution: int) -> _Table:
    """At a position, each option in turn is taken where it is cheaper than the least so far (passing over, then
    the options before it); at each level the last one so taken is the choice, as if it kept a pick per level.
    Levels above the most a row can free are infinite: each option touches only those its row and its units
    reach."""
    count = len(options.offsets) - 1
    grid = max(1, math.ceil(need / resolution))
    target = math.ceil(need / grid)
    every = np.minimum(target, np.maximum(options.weights, 0) // grid)
    worth = options.kept(every > 0, count)
    units, jumps, costs, offsets = every[every > 0].tolist(), worth.jumps.tolist(), worth.costs.tolist(), worth.offsets
    # Row j is needed by position j - 1 (passed over) and by every option that jumps to j.
    wanted = (np.bincount(worth.jumps, minlength=count + 1) + 1).tolist()
    width = target + 1
    last = np.full(width, np.inf)
    last[0] = 0.0
    # Position -> its row and the highest level where the row is finite (above it every entry is infinite).
    rows: dict[int, tuple[np.ndarray, int]] = {count: (last, 0)}
    choices: list[bytes] = [b""] * count
    take = np.empty(width)
    for i in range(count - 1, -1, -1):
        first, stop_at = offsets[i], offsets[i + 1]
        if first == stop_at:
            rows[i] = rows[i + 1]
            _release(rows, wanted, i + 1)
            continue
        row, top = rows[i + 1]
        row = row.copy()
        marks = np.zeros((stop_at - first, width), dtype=bool)
        for k in range(stop_at - first):
            jump, unit, cost = jumps[first + k], units[first + k], costs[first + k]
            after, high = rows[jump]
            stop = high + unit + 1  # taking it is infinite from here on
            if stop > width:
                stop = width
            part, least = take[:stop], row[:stop]
            part[:unit] = after[0] + cost
            np.add(after[: stop - unit], cost, out=part[unit:])
            np.less(part, least, out=marks[k, :stop])
            np.fmin(part, least, out=least)  # where equal the row's own (fmin: a NaN cost never taken)
            if stop > top:
                top = stop - 1
            wanted[jump] -= 1
            if not wanted[jump]:
                del rows[jump]
        choices[i] = np.packbits(marks, axis=1).tobytes()
        _release(rows, wanted, i + 1)
        rows[i] = (row, top)
    return _Table(grid, rows[0][0], worth.numbers.tolist(), jumps, units, offsets, choices)


def _release(rows: dict[int, tuple[np.ndarray, int]], wanted: list[int], j: int) -> None:
    wanted[j] -= 1
    if wanted[j] == 0:
        del rows[j]


def _walker(table: _Table) -> Callable[[int], list[int]]:
    """The walk back through the table from a grid level to the options chosen, for many levels: positions
    without options are stepped over at once; at a position, the last option whose bit is set at the level is
    the one chosen there."""
    numbers, jumps, units, offsets, choices = table.numbers, table.jumps, table.units, table.offsets, table.choices
    count = len(offsets) - 1
    after = [count] * (count + 1)  # the first position from i on that has an option
    for i in range(count - 1, -1, -1):
        after[i] = i if offsets[i] < offsets[i + 1] else after[i + 1]
    size = (len(table.best) + 7) // 8  # bytes of one option's row of bits
    here = [(offsets[i], offsets[i + 1] - offsets[i] - 1, choices[i]) for i in range(count)]  # first, last k, bits

    def walk(level: int) -> list[int]:
        chosen, i = [], after[0]
        while i < count:
            first, k, bits = here[i]
            at, shift = level >> 3, 7 - (level & 7)
            while k >= 0 and not (bits[k * size + at] >> shift) & 1:
                k -= 1
            if k >= 0:
                chosen.append(numbers[first + k])
                level = max(0, level - units[first + k])
                i = after[jumps[first + k]]
            else:
                i = after[i + 1]
        return chosen

    return walk


def solve(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], need: int,
          resolution: int = DEFAULT_RESOLUTION, runs: Sequence[Run] = ()) -> Solution | None:
    """The cheapest admissible choice that frees at least ``need`` bytes; None when none does. Give ineligible
    nodes weight 0 (and leave ineligible runs out)."""
    if need <= 0:
        return Solution((), 0, 0.0)
    table = _table(_options(weights, costs, ends, runs), need, resolution)
    if not math.isfinite(table.best[-1]):
        return None
    return _pricing(weights, costs, runs)(_walker(table)(len(table.best) - 1))


def frontier(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int],
             resolution: int = DEFAULT_RESOLUTION, runs: Sequence[Run] = ()) -> list[Solution]:
    """Every Pareto-optimal choice (bytes freed against cost) on the grid, from nothing (today's point, first even
    where a plan that costs nothing frees some) to the most reachable."""
    return list(iter_frontier(weights, costs, ends, resolution, runs))


def _same_cost(a: float, b: float) -> bool:
    """Two levels' least costs are one cost: equal but for the rounding of their sums' order."""
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def iter_frontier(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int],
                  resolution: int = DEFAULT_RESOLUTION, runs: Sequence[Run] = (),
                  both_ends: bool = False) -> Iterator[Solution]:
    """``frontier``'s choices one at a time, cheapest first, each walked out of the table only when asked for (a
    caller that stops at the first one that suits it walks no more). ``both_ends``: for each cost, also the plan
    at the lowest level it reaches, before the frontier's (the peak planner weighs both: the one that frees less
    can hold less at the step's peak)."""
    top, _ = best_reachable(weights, ends, runs)
    if top <= 0:
        yield Solution((), 0, 0.0)
        return
    table = _table(_options(weights, costs, ends, runs), top, resolution)
    best = table.best
    # The least cost of freeing each grid level never falls as the level rises: levels in order are costs in order.
    # Of the levels one cost reaches, the highest is the frontier's (it frees the most for that cost): where options
    # cost nothing (a recomputation priced at 0 ms), the first levels all cost 0, and the lowest would free nothing.
    # Level 0, wrapping nothing (today), is yielded first all the same. On the grid: a walk at the highest level
    # can, rounded, free a few bytes less than one at a lower level of the same cost.
    freed, last = -1, len(best) - 1
    walk, solution_of = _walker(table), _pricing(weights, costs, runs)
    for level in range(len(best)):
        cost = best[level]
        if not math.isfinite(cost):
            continue
        if level and level < last and _same_cost(best[level + 1], cost):
            if not both_ends or _same_cost(best[level - 1], cost):
                continue
        solution = solution_of(walk(level))
        if solution.freed > freed:
            freed = solution.freed
            yield solution
