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
from typing import Callable, Iterator, Sequence

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


@dataclass(frozen=True)
class Run:
    """An option besides the nodes: it covers pre-order positions ``start .. jump - 1``, frees ``weight`` and
    costs ``cost``."""

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


def _options(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], runs: Sequence[Run]
             ) -> list[list[tuple[int, int, int, float]]]:
    """For each position, its options as (number, jump, weight, cost): the node first, then its runs."""
    found = [[(i, ends[i], int(weights[i]), float(costs[i]))] for i in range(len(weights))]
    for k, run in enumerate(runs):
        found[run.start].append((len(weights) + k, run.jump, int(run.weight), float(run.cost)))
    return found


def _weight(weights: Sequence[int], runs: Sequence[Run], option: int) -> int:
    return int(weights[option]) if option < len(weights) else int(runs[option - len(weights)].weight)


def _cost(costs: Sequence[float], runs: Sequence[Run], option: int) -> float:
    return float(costs[option]) if option < len(costs) else float(runs[option - len(costs)].cost)


def _solution(weights: Sequence[int], costs: Sequence[float], runs: Sequence[Run], chosen: list[int]) -> Solution:
    return Solution(tuple(chosen), sum(_weight(weights, runs, o) for o in chosen),
                    sum(_cost(costs, runs, o) for o in chosen))


def best_reachable(weights: Sequence[int], ends: Sequence[int], runs: Sequence[Run] = ()
                   ) -> tuple[int, tuple[int, ...]]:
    """The most bytes any admissible choice frees (options with weight <= 0 are never worth choosing), and it."""
    count = len(weights)
    options = _options(weights, [0.0] * count, ends, runs)
    best = [0] * (count + 1)
    take: list[tuple[int, int] | None] = [None] * count
    for i in range(count - 1, -1, -1):
        best[i] = best[i + 1]
        for number, jump, weight, _ in options[i]:
            if weight > 0 and weight + best[jump] > best[i]:
                best[i], take[i] = weight + best[jump], (number, jump)
    chosen, i = [], 0
    while i < count:
        found = take[i]
        if found is None:
            i += 1
        else:
            chosen.append(found[0])
            i = found[1]
    return best[0], tuple(chosen)


def _table(options: list[list[tuple[int, int, int, float]]], need: int, resolution: int
           ) -> tuple[int, np.ndarray, list[bytes], list[list[tuple[int, int, int]]]]:
    """The table of ``best`` (see the module doc) on the grid for ``need``: the grid step, the row of position 0,
    per position the levels where each of its options is taken (one packed row of bits per option, in the order
    of ``units``; b"" for a position without options), and ``units``: per position its options worth a grid unit,
    as (number, jump, units).

    At a position, each option in turn is taken where it is cheaper than the least so far (passing over, then the
    options before it); at each level the last one so taken is the choice, as if it kept a pick per level. Levels
    above the most a row can free are infinite: each option touches only those its row and its units reach."""
    count = len(options)
    grid = max(1, math.ceil(need / resolution))
    target = math.ceil(need / grid)
    units = [[(number, jump, min(target, max(0, weight) // grid)) for number, jump, weight, _ in here]
             for here in options]
    costs = [{number: cost for number, _, _, cost in here} for here in options]
    units = [[option for option in here if option[2] > 0] for here in units]
    # Row j is needed by position j - 1 (passed over) and by every option that jumps to j.
    wanted = [1] * (count + 1)
    for here in units:
        for _, jump, _ in here:
            wanted[jump] += 1
    width = target + 1
    last = np.full(width, np.inf)
    last[0] = 0.0
    # Position -> its row and the highest level where the row is finite (above it every entry is infinite).
    rows: dict[int, tuple[np.ndarray, int]] = {count: (last, 0)}
    choices: list[bytes] = [b""] * count
    take = np.empty(width)
    for i in range(count - 1, -1, -1):
        here = units[i]
        if not here:
            rows[i] = rows[i + 1]
            _release(rows, wanted, i + 1)
            continue
        row, top = rows[i + 1]
        row = row.copy()
        marks = np.zeros((len(here), width), dtype=bool)
        price = costs[i]
        for k, (number, jump, unit) in enumerate(here):
            after, high = rows[jump]
            cost = price[number]
            stop = min(width, high + unit + 1)  # taking it is infinite from here on
            part = take[:stop]
            part[:unit] = after[0] + cost
            np.add(after[: stop - unit], cost, out=part[unit:])
            np.less(part, row[:stop], out=marks[k, :stop])
            np.fmin(part, row[:stop], out=row[:stop])  # where equal the row's own (fmin: a NaN cost never taken)
            top = max(top, stop - 1)
            _release(rows, wanted, jump)
        choices[i] = np.packbits(marks, axis=1).tobytes()
        _release(rows, wanted, i + 1)
        rows[i] = (row, top)
    return grid, rows[0][0], choices, units


def _release(rows: dict[int, tuple[np.ndarray, int]], wanted: list[int], j: int) -> None:
    wanted[j] -= 1
    if wanted[j] == 0:
        del rows[j]


def _walker(choices: list[bytes], units: list[list[tuple[int, int, int]]], width: int
            ) -> Callable[[int], list[int]]:
    """The walk back through the table from a grid level to the options chosen, for many levels: positions
    without options are stepped over at once; at a position, the last option whose bit is set at the level is
    the one chosen there."""
    count = len(units)
    after = [count] * (count + 1)  # the first position from i on that has an option
    for i in range(count - 1, -1, -1):
        after[i] = i if units[i] else after[i + 1]
    size = (width + 7) // 8  # bytes of one option's row of bits

    def walk(level: int) -> list[int]:
        chosen, i = [], after[0]
        while i < count:
            here, bits = units[i], choices[i]
            at, shift = level >> 3, 7 - (level & 7)
            for k in range(len(here) - 1, -1, -1):
                if (bits[k * size + at] >> shift) & 1:
                    number, jump, unit = here[k]
                    chosen.append(number)
                    level = max(0, level - unit)
                    i = after[jump]
                    break
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
    grid, best, choices, units = _table(_options(weights, costs, ends, runs), need, resolution)
    if not math.isfinite(best[-1]):
        return None
    return _solution(weights, costs, runs, _walker(choices, units, len(best))(len(best) - 1))


def frontier(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int],
             resolution: int = DEFAULT_RESOLUTION, runs: Sequence[Run] = ()) -> list[Solution]:
    """Every Pareto-optimal choice (bytes freed against cost) on the grid, from nothing to the most reachable."""
    return list(iter_frontier(weights, costs, ends, resolution, runs))


def iter_frontier(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int],
                  resolution: int = DEFAULT_RESOLUTION, runs: Sequence[Run] = ()) -> Iterator[Solution]:
    """``frontier``'s choices one at a time, cheapest first, each walked out of the table only when asked for (a
    caller that stops at the first one that suits it walks no more)."""
    top, _ = best_reachable(weights, ends, runs)
    if top <= 0:
        yield Solution((), 0, 0.0)
        return
    grid, best, choices, units = _table(_options(weights, costs, ends, runs), top, resolution)
    # The least cost of freeing each grid level never falls as the level rises: levels in order are costs in order.
    previous, freed = None, -1
    walk = _walker(choices, units, len(best))
    for level in range(len(best)):
        if not math.isfinite(best[level]) or best[level] == previous:
            continue
        previous = best[level]
        solution = _solution(weights, costs, runs, walk(level))
        if solution.freed > freed:
            freed = solution.freed
            yield solution
