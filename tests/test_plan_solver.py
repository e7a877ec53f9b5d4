"""The planner's exact solver against brute force, and budget parsing."""
from __future__ import annotations

import math
import random
from typing import Callable

import numpy as np
import pytest
import torch

from layerprof.plan.budget import parse_budget
from layerprof.plan.solver import Run, best_reachable, ends_of, frontier, iter_frontier, solve


def _random_tree(rng: random.Random, count: int) -> list[int]:
    """Parent indexes of a random tree, renumbered in pre-order."""
    parents = [-1] + [rng.randrange(i) for i in range(1, count)]
    children: dict[int, list[int]] = {i: [] for i in range(count)}
    for i in range(1, count):
        children[parents[i]].append(i)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children[node]))
    index = {node: k for k, node in enumerate(order)}
    return [-1 if parents[node] < 0 else index[parents[node]] for node in order]


def _admissible(ends: list[int], weights: list[int]):
    count = len(ends)
    for mask in range(1 << count):
        chosen = [i for i in range(count) if mask >> i & 1]
        if any(weights[i] <= 0 for i in chosen):
            continue
        if any(i < j < ends[i] for i in chosen for j in chosen):
            continue  # a node and one of its descendants
        yield chosen


def test_ends_of() -> None:
    # 0 -> (1 -> 2, 3), 4
    assert ends_of([-1, 0, 1, 1, 0]) == [5, 4, 3, 4, 5]


def test_solver_matches_brute_force_on_small_trees() -> None:
    rng = random.Random(20)
    checked = infeasible = 0
    for _ in range(400):
        count = rng.randint(1, 10)
        ends = ends_of(_random_tree(rng, count))
        weights = [rng.randint(-5, 60) for _ in range(count)]
        costs = [rng.randint(0, 20) + 0.25 for _ in range(count)]
        need = rng.randint(0, 150)
        meeting = [(sum(costs[i] for i in s), s) for s in _admissible(ends, weights)
                   if sum(weights[i] for i in s) >= need]
        solution = solve([max(0, w) for w in weights], costs, ends, need)
        if not meeting:
            assert solution is None
            infeasible += 1
            top, chosen = best_reachable([max(0, w) for w in weights], ends)
            assert top == max(sum(weights[i] for i in s) for s in _admissible(ends, weights))
            assert top == sum(weights[i] for i in chosen) < need
            continue
        checked += 1
        assert solution is not None and solution.freed >= need
        assert solution.cost == pytest.approx(min(cost for cost, _ in meeting))
        assert not any(i < j < ends[i] for i in solution.chosen for j in solution.chosen)
    assert checked > 200 and infeasible > 20  # both branches exercised


def test_grid_rounding_stays_within_one_percent() -> None:
    # Byte weights far above the grid: each weight is rounded down to whole grid steps, so the plan may pay for
    # a little more than the exact optimum but always frees what it claims.
    rng = random.Random(3)
    for _ in range(30):
        count = 9
        ends = ends_of(_random_tree(rng, count))
        weights = [rng.randint(1, 10**8) for _ in range(count)]
        costs = [rng.uniform(0.1, 5.0) for _ in range(count)]
        need = rng.randint(1, sum(weights) // 2)
        exact = min((sum(costs[i] for i in s) for s in _admissible(ends, weights)
                     if sum(weights[i] for i in s) >= need), default=None)
        solution = solve(weights, costs, ends, need)
        if exact is None:
            assert solution is None
            continue
        assert solution is not None and solution.freed >= need and solution.cost >= exact - 1e-9
        # Every set freeing need + 9 grid steps (9 nodes' rounding at most) costs at least the plan.
        grid = -(-need // 4096)
        tighter = min(sum(costs[i] for i in s) for s in _admissible(ends, weights)
                      if sum(weights[i] for i in s) >= need + count * grid) if need + count * grid <= best_reachable(weights, ends)[0] else None
        if tighter is not None:
            assert solution.cost <= tighter + 1e-9


def test_frontier_is_monotone_and_ends_at_the_most_reachable() -> None:
    rng = random.Random(5)
    ends = ends_of(_random_tree(rng, 10))
    weights = [rng.randint(0, 60) for _ in range(10)]
    costs = [rng.uniform(0.1, 5.0) for _ in range(10)]
    points = frontier(weights, costs, ends)
    assert points[0].freed == 0 and points[0].cost == 0
    assert all(a.freed < b.freed and a.cost < b.cost for a, b in zip(points, points[1:]))
    assert points[-1].freed == best_reachable(weights, ends)[0]
    for point in points:  # each point is the cheapest way to free what it frees
        assert point.cost == pytest.approx(solve(weights, costs, ends, point.freed).cost)


def test_the_frontier_keeps_the_most_freed_for_a_cost_when_options_cost_nothing() -> None:
    """Recomputations priced at 0 ms (a live profile whose reader's time took off a module's whole forward): the
    frontier's point at cost 0 wraps every free option, not none. Under the root (0, not an option): a block (1)
    of two leaves (2, 3), and a leaf (4); the leaves 2 and 4 cost nothing, 3 costs 1 ms, the block 5 ms."""
    ends = ends_of([-1, 0, 1, 1, 0])
    weights, costs = [0, 100, 30, 40, 20], [0.0, 5.0, 0.0, 1.0, 0.0]
    points = [(p.chosen, p.freed, p.cost) for p in frontier(weights, costs, ends, resolution=1000)]
    # Nothing (today) first; then 2 and 4 for free (30 + 20 bytes); then 3 for 1 ms (+40); then the block with 4
    # (100 + 20) for 5 ms. Before, the free levels gave the first of them, which frees nothing: (), then 3 alone.
    assert points == [((), 0, 0.0), ((2, 4), 50, 0.0), ((2, 3, 4), 90, 1.0), ((1, 4), 120, 5.0)]
    # Both ends of each cost, for the peak planner: also the first plan the table finds at a cost's lowest level
    # (3 and 4 for 1 ms: 60 bytes, the least over 50; the block alone for 5 ms: 100, the least over 90).
    both = [(p.chosen, p.freed, p.cost) for p in iter_frontier(weights, costs, ends, resolution=1000, both_ends=True)]
    assert both == [((), 0, 0.0), ((2, 4), 50, 0.0), ((3, 4), 60, 1.0), ((2, 3, 4), 90, 1.0), ((1,), 100, 5.0),
                    ((1, 4), 120, 5.0)]


@pytest.mark.parametrize("given, today, expected", [
    (1000, 5000, 1000), ("2GiB", 0, 2 * 2**30), ("300MB", 0, 300 * 10**6), ("1.5 kib", 0, 1536),
    ("50%", 999, 499), (0.25, 1000, 250), (1.0, 1000, 1000), ("0", 10, 0), ("300", 1000, 300),
    ("0.5", 1000, 500), (" 1.0 ", 1000, 1000), (np.int64(300), 1000, 300), (np.float32(0.25), 1000, 250),
    (torch.tensor(0.5).item(), 1000, 500),
    # a 0-d tensor as its value; a whole number in scientific notation, as a shell gives it, is bytes
    (torch.tensor(0.5), 1000, 500), (torch.tensor(300), 1000, 300), ("1e6", 1000, 10**6), ("1.5e9", 0, 15 * 10**8),
    ("+300", 1000, 300), ("150%", 1000, 1500),  # above today's: a plan that wraps nothing, with a note
])
def test_parse_budget(given: object, today: int, expected: int) -> None:
    assert parse_budget(given, today) == expected


@pytest.mark.parametrize("given, error, words", [
    ("lots", ValueError, "cannot read budget 'lots'"), ("2 parsecs", ValueError, "cannot read budget"),
    ("x%", ValueError, "not a percentage"), (-5, ValueError, "non-negative"), (1.5, ValueError, "fraction in (0, 1]"),
    (None, TypeError, "got NoneType"), (True, TypeError, "got bool"), ("-10%", ValueError, "a share of 0 or more"),
    (2.0, ValueError, "for bytes give a whole number (2)"), ("1.5", ValueError, "fraction in (0, 1]"),
    ("-1", ValueError, "budget '-1' must be a non-negative number of bytes"), (torch.ones(2), TypeError, "got Tensor"),
    (np.float64(1.5), ValueError, "fraction in (0, 1]"), (float("nan"), ValueError, "non-negative"),
])
def test_parse_budget_errors(given: object, error: type, words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace("%", "%")):
        parse_budget(given, 1000)


def _random_runs(rng: random.Random, parents: list[int], ends: list[int], count: int) -> list[Run]:
    """Up to ``count`` runs of two or more consecutive children of one node, random weights and costs."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        if parent >= 0:
            children.setdefault(parent, []).append(i)
    families = [kids for kids in children.values() if len(kids) >= 2]
    runs = []
    for _ in range(count if families else 0):
        kids = rng.choice(families)
        first = rng.randrange(len(kids) - 1)
        last = rng.randrange(first + 1, len(kids))
        runs.append(Run(kids[first], ends[kids[last]], rng.randint(-5, 90), rng.randint(0, 20) + 0.5))
    return runs


def test_solver_with_runs_matches_brute_force() -> None:
    """Runs of consecutive children are options too: every admissible set of nodes and runs (no two stretches
    of the pre-order overlapping) is tried, and the solver finds the cheapest that meets the need."""
    rng = random.Random(7)
    checked = with_runs = 0
    for _ in range(300):
        count = rng.randint(2, 9)
        parents = _random_tree(rng, count)
        ends = ends_of(parents)
        runs = _random_runs(rng, parents, ends, rng.randint(0, 4))
        weights = [rng.randint(-5, 60) for _ in range(count)]
        costs = [rng.randint(0, 20) + 0.25 for _ in range(count)]
        spans = [(i, ends[i], weights[i], costs[i]) for i in range(count)]
        spans += [(run.start, run.jump, run.weight, run.cost) for run in runs]
        need = rng.randint(0, 150)
        best = None
        for mask in range(1 << len(spans)):
            chosen = [spans[k] for k in range(len(spans)) if mask >> k & 1]
            if any(w <= 0 for _, _, w, _ in chosen):
                continue
            ordered = sorted(chosen)
            if any(a[1] > b[0] for a, b in zip(ordered, ordered[1:])):
                continue  # two stretches overlap
            if sum(w for _, _, w, _ in chosen) >= need:
                cost = sum(c for _, _, _, c in chosen)
                best = cost if best is None else min(best, cost)
        solution = solve([max(0, w) for w in weights], costs, ends, need,
                         runs=[run for run in runs if run.weight > 0])
        positive = [run for run in runs if run.weight > 0]
        if best is None:
            assert solution is None
            continue
        checked += 1
        assert solution is not None and solution.cost == pytest.approx(best) and solution.freed >= need
        picked = [(i, ends[i]) if i < count else (positive[i - count].start, positive[i - count].jump)
                  for i in solution.chosen]
        ordered = sorted(picked)
        assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))
        with_runs += any(i >= count for i in solution.chosen)
        top, _ = best_reachable([max(0, w) for w in weights], ends, positive)
        assert top >= solution.freed
    assert checked > 150 and with_runs > 30  # runs chosen often enough to matter


def _reference(weights: list[int], costs: list[float], ends: list[int], runs: list[Run], need: int,
               resolution: int) -> tuple[list[float], Callable[[int], list[int]]]:
    """The knapsack's table the plain way, a Python loop over every option and level: at each position the pass
    first, then its node, then its runs in order, each taken at a level where strictly cheaper than the least so
    far. Its row of position 0, and the walk from a level to the options chosen."""
    count = len(weights)
    grid = max(1, -(-need // resolution))
    target = -(-need // grid)
    here: list[list[tuple[int, int, int, float]]] = [[(i, ends[i], weights[i], costs[i])] for i in range(count)]
    for k, run in enumerate(runs):
        here[run.start].append((count + k, run.jump, run.weight, run.cost))
    options = [[(n, j, min(target, max(0, w) // grid), c) for n, j, w, c in found if max(0, w) // grid > 0]
               for found in here]
    rows = [[math.inf] * (target + 1) for _ in range(count + 1)]
    rows[count][0] = 0.0
    picks = [[0] * (target + 1) for _ in range(count)]
    for i in range(count - 1, -1, -1):
        rows[i] = list(rows[i + 1])
        for k, (_, jump, unit, cost) in enumerate(options[i], start=1):
            for level in range(target + 1):
                take = rows[jump][max(0, level - unit)] + cost
                if take < rows[i][level]:
                    rows[i][level], picks[i][level] = take, k
    def walk(level: int) -> list[int]:
        chosen, i = [], 0
        while i < count:
            k = picks[i][level]
            if k:
                number, jump, unit, _ = options[i][k - 1]
                chosen.append(number)
                level, i = max(0, level - unit), jump
            else:
                i += 1
        return chosen
    return rows[0], walk


def test_solver_and_frontier_match_the_plain_table_with_runs() -> None:
    """The solver's table (numpy rows, levels a row cannot reach skipped, one row of bits per option) against the
    plain loop of ``_reference``, on random trees with runs: the same options chosen, bytes and cost, for the
    plan and for every point of the frontier. Whole-number costs make ties common, so a different tie broken, a
    level skipped that could be reached or a bit read from the wrong option gives another choice here. A coarse
    grid (``resolution`` 16 to 64 levels, weights up to 400) rounds the weights as on a large model."""
    rng = random.Random(13)
    compared = points = with_runs = 0
    for _ in range(150):
        count = rng.randint(2, 14)
        parents = _random_tree(rng, count)
        ends = ends_of(parents)
        runs = [run for run in _random_runs(rng, parents, ends, rng.randint(0, 8)) if run.weight > 0]
        runs = [Run(run.start, run.jump, run.weight * rng.randint(2, 8), float(rng.randint(0, 5))) for run in runs]
        weights = [max(0, rng.randint(-40, 400)) for _ in range(count)]
        costs = [float(rng.randint(0, 6)) for _ in range(count)]
        resolution = rng.choice((16, 32, 64))
        top = best_reachable(weights, ends, runs)[0]
        need = rng.randint(1, max(1, top + 20))
        best, walk = _reference(weights, costs, ends, runs, need, resolution)
        expected = None
        if math.isfinite(best[-1]):
            chosen = walk(len(best) - 1)
            expected = (tuple(chosen), sum(weights[i] if i < count else runs[i - count].weight for i in chosen),
                        sum(costs[i] if i < count else runs[i - count].cost for i in chosen))
        found = solve(weights, costs, ends, need, resolution, runs)
        assert (found.chosen, found.freed, found.cost) == expected if found else expected is None
        compared += 1
        with_runs += found is not None and any(i >= count for i in found.chosen)
        if top <= 0:
            continue
        best, walk = _reference(weights, costs, ends, runs, top, resolution)
        # Nothing first, then for each cost the highest level it reaches (the most freed for it).
        reference, freed = [], -1
        for level, value in enumerate(best):
            if math.isfinite(value) and (level == 0 or level == len(best) - 1 or best[level + 1] != value):
                chosen = walk(level)
                total = sum(weights[i] if i < count else runs[i - count].weight for i in chosen)
                if total > freed:
                    freed = total
                    reference.append((tuple(chosen), total))
        assert [(s.chosen, s.freed) for s in frontier(weights, costs, ends, resolution, runs)] == reference
        points += len(reference)
    assert compared == 150 and with_runs > 40 and points > 600  # 45 with runs and 854 points with this seed
