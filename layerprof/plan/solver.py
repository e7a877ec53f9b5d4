"""The exact choice of modules to recompute: a tree knapsack solved by dynamic programming on a byte grid.

Pure numbers, no torch. The tree is given in pre-order: node ``i``'s subtree is ``i .. ends[i] - 1``. Choosing a
node frees ``weights[i]`` bytes at ``costs[i]`` ms and rules out every other node of its subtree (a module and its
descendants are never wrapped both). Walking the pre-order, each node is either chosen (jump to ``ends[i]``) or
not (go on to ``i + 1``, into its children), so

    best[i][b] = min(best[i + 1][b], costs[i] + best[ends[i]][max(0, b - units[i])])

is the least cost of freeing at least ``b`` grid units with nodes ``i ..``: O(nodes x grid) in all, one numpy
row per node. Weights are rounded down to the grid, so a solution frees at least what it claims; the grid has
``resolution`` steps up to the target, so rounding moves the target by at most (chosen nodes) / resolution of
it, and is exact when the target is below ``resolution`` bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Solution", "solve", "best_reachable", "frontier", "ends_of"]

DEFAULT_RESOLUTION = 4096


@dataclass(frozen=True)
class Solution:
    """Chosen node indexes (pre-order), the bytes they free (exact sum of weights) and their cost."""

    chosen: tuple[int, ...]
    freed: int
    cost: float


def ends_of(parents: Sequence[int]) -> list[int]:
    """``ends`` for a pre-order list of parent indexes (-1 for the root)."""
    ends = list(range(1, len(parents) + 1))
    for i in range(len(parents) - 1, 0, -1):
        parent = parents[i]
        if ends[i] > ends[parent]:
            ends[parent] = ends[i]
    return ends


def best_reachable(weights: Sequence[int], ends: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """The most bytes any admissible choice frees (nodes with weight <= 0 are never worth choosing), and it."""
    count = len(weights)
    best = [0] * (count + 1)
    take = [False] * count
    for i in range(count - 1, -1, -1):
        below = 0
        child = i + 1
        while child < ends[i]:
            below += best[child]
            child = ends[child]
        take[i] = weights[i] > below
        best[i] = weights[i] if take[i] else below
    chosen, i = [], 0
    while i < count:
        if take[i]:
            chosen.append(i)
            i = ends[i]
        else:
            i += 1
    top = sum(best[i] for i in _roots(ends))
    return top, tuple(chosen)


def _roots(ends: Sequence[int]) -> list[int]:
    roots, i = [], 0
    while i < len(ends):
        roots.append(i)
        i = ends[i]
    return roots


def _table(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], need: int, resolution: int
           ) -> tuple[int, np.ndarray, list[np.ndarray], list[int]]:
    count = len(weights)
    grid = max(1, math.ceil(need / resolution))
    target = math.ceil(need / grid)
    units = [min(target, max(0, int(w) // grid)) for w in weights]
    # Row j is needed by node j - 1 (not chosen) and by every node whose subtree ends at j (chosen).
    wanted = [1] * (count + 1)
    for i in range(count):
        if units[i] > 0:
            wanted[ends[i]] += 1
    rows: dict[int, np.ndarray] = {}
    last = np.full(target + 1, np.inf)
    last[0] = 0.0
    rows[count] = last
    choices: list[np.ndarray] = [np.zeros(0, dtype=np.uint8)] * count
    for i in range(count - 1, -1, -1):
        skip = rows[i + 1]
        unit = units[i]
        if unit > 0:
            after = rows[ends[i]]
            take = np.empty_like(after)
            take[:unit] = after[0]
            take[unit:] = after[: target + 1 - unit]
            take += costs[i]
            choose = take < skip
            row = np.where(choose, take, skip)
            choices[i] = np.packbits(choose)
            _release(rows, wanted, ends[i])
        else:
            row = skip
        _release(rows, wanted, i + 1)
        rows[i] = row
    return grid, rows[0], choices, units


def _release(rows: dict[int, np.ndarray], wanted: list[int], j: int) -> None:
    wanted[j] -= 1
    if wanted[j] == 0:
        del rows[j]


def _walk(choices: list[np.ndarray], units: list[int], ends: Sequence[int], level: int) -> list[int]:
    chosen, i, count = [], 0, len(units)
    while i < count:
        bits = choices[i]
        if len(bits) and (bits[level >> 3] >> (7 - (level & 7))) & 1:
            chosen.append(i)
            level = max(0, level - units[i])
            i = ends[i]
        else:
            i += 1
    return chosen


def solve(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], need: int,
          resolution: int = DEFAULT_RESOLUTION) -> Solution | None:
    """The cheapest admissible choice that frees at least ``need`` bytes; None when none does. Give ineligible
    nodes weight 0."""
    if need <= 0:
        return Solution((), 0, 0.0)
    grid, best, choices, units = _table(weights, costs, ends, need, resolution)
    if not math.isfinite(best[-1]):
        return None
    chosen = _walk(choices, units, ends, len(best) - 1)
    return Solution(tuple(chosen), int(sum(weights[i] for i in chosen)), float(sum(costs[i] for i in chosen)))


def frontier(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int],
             resolution: int = DEFAULT_RESOLUTION) -> list[Solution]:
    """Every Pareto-optimal choice (bytes freed against cost) on the grid, from nothing to the most reachable."""
    top, _ = best_reachable(weights, ends)
    if top <= 0:
        return [Solution((), 0, 0.0)]
    grid, best, choices, units = _table(weights, costs, ends, top, resolution)
    found: list[Solution] = []
    previous = None
    for level in range(len(best)):
        if not math.isfinite(best[level]) or best[level] == previous:
            continue
        previous = best[level]
        chosen = _walk(choices, units, ends, level)
        found.append(Solution(tuple(chosen), int(sum(weights[i] for i in chosen)),
                              float(sum(costs[i] for i in chosen))))
    pareto: list[Solution] = []
    for solution in sorted(found, key=lambda s: (s.cost, -s.freed)):
        if not pareto or solution.freed > pareto[-1].freed:
            pareto.append(solution)
    return pareto
