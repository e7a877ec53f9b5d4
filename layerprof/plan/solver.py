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
           ) -> tuple[int, np.ndarray, list[np.ndarray], list[list[tuple[int, int, int]]]]:
    count = len(options)
    grid = max(1, math.ceil(need / resolution))
    target = math.ceil(need / grid)
    # Per position, the options worth a grid unit: (number, jump, units).
    units = [[(number, jump, min(target, max(0, weight) // grid)) for number, jump, weight, _ in here]
             for here in options]
    costs = [{number: cost for number, _, _, cost in here} for here in options]
    units = [[option for option in here if option[2] > 0] for here in units]
    # Row j is needed by position j - 1 (passed over) and by every option that jumps to j.
    wanted = [1] * (count + 1)
    for here in units:
        for _, jump, _ in here:
            wanted[jump] += 1
    rows: dict[int, np.ndarray] = {}
    last = np.full(target + 1, np.inf)
    last[0] = 0.0
    rows[count] = last
    # Per position, the option chosen at each grid level: 0 none, k the k-th of units[i] (bits where only one).
    choices: list[np.ndarray] = [np.zeros(0, dtype=np.uint8)] * count
    for i in range(count - 1, -1, -1):
        row = rows[i + 1]
        pick = np.zeros(target + 1, dtype=np.uint16) if units[i] else None
        for k, (number, jump, unit) in enumerate(units[i], start=1):
            after = rows[jump]
            take = np.empty_like(after)
            take[:unit] = after[0]
            take[unit:] = after[: target + 1 - unit]
            take += costs[i][number]
            better = take < row
            row = np.where(better, take, row)
            pick[better] = k
            _release(rows, wanted, jump)
        if pick is not None:
            choices[i] = np.packbits(pick.astype(bool)) if len(units[i]) == 1 else pick
        _release(rows, wanted, i + 1)
        rows[i] = row
    return grid, rows[0], choices, units


def _release(rows: dict[int, np.ndarray], wanted: list[int], j: int) -> None:
    wanted[j] -= 1
    if wanted[j] == 0:
        del rows[j]


def _walker(choices: list[np.ndarray], units: list[list[tuple[int, int, int]]]) -> Callable[[int], list[int]]:
    """The walk back through the table from a grid level to the options chosen, for many levels: positions
    without options are stepped over at once, and a position's one-option bits are read as bytes."""
    count = len(units)
    after = [count] * (count + 1)  # the first position from i on that has an option
    for i in range(count - 1, -1, -1):
        after[i] = i if units[i] else after[i + 1]
    bits = [bytes(here) if len(unit) == 1 else b"" for here, unit in zip(choices, units)]

    def walk(level: int) -> list[int]:
        chosen, i = [], after[0]
        while i < count:
            here = units[i]
            k = (bits[i][level >> 3] >> (7 - (level & 7))) & 1 if len(here) == 1 else int(choices[i][level])
            if k:
                number, jump, unit = here[k - 1]
                chosen.append(number)
                level = max(0, level - unit)
                i = after[jump]
            else:
                i = after[i + 1]
        return chosen

    return walk


def _walk(choices: list[np.ndarray], units: list[list[tuple[int, int, int]]], level: int) -> list[int]:
    return _walker(choices, units)(level)


def solve(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], need: int,
          resolution: int = DEFAULT_RESOLUTION, runs: Sequence[Run] = ()) -> Solution | None:
    """The cheapest admissible choice that frees at least ``need`` bytes; None when none does. Give ineligible
    nodes weight 0 (and leave ineligible runs out)."""
    if need <= 0:
        return Solution((), 0, 0.0)
    grid, best, choices, units = _table(_options(weights, costs, ends, runs), need, resolution)
    if not math.isfinite(best[-1]):
        return None
    return _solution(weights, costs, runs, _walk(choices, units, len(best) - 1))


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
    walk = _walker(choices, units)
    for level in range(len(best)):
        if not math.isfinite(best[level]) or best[level] == previous:
            continue
        previous = best[level]
        solution = _solution(weights, costs, runs, walk(level))
        if solution.freed > freed:
            freed = solution.freed
            yield solution
