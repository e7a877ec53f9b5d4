"""Choosing a checkpoint plan against a budget of the step's peak memory (``checkpoint_plan(peak=...)``).

The step's peak under a plan (``peak.py``) is the highest of many intervals, each moved by what the plan holds
there, and the recomputations: not a sum over modules, so no knapsack finds the cheapest plan under it directly.
The planner weighs candidates instead, each by its predicted peak, and returns the cheapest (in the knapsack's
cold time) whose predicted peak fits:

- every plan on the saved-bytes Pareto frontier (the solver's, at the plan's resolution): the cheapest way to free
  each amount of saved memory;
- the frontier of the bytes held at the peak: the same knapsack with only the options that, wrapped, stop holding
  their saved bytes over the interval where the step peaks (a region's bytes are gone from the end of its forward to
  the start of its backward; a module whose backward has run before the peak frees nothing there, and wrapping it
  only costs time). First at the profiled step's peak, then, ``ROUNDS - 1`` more times, at the peak of the
  candidate with the lowest peak so far, where that is an interval not yet looked at.

Guaranteed: the plan is the cheapest of those candidates whose predicted peak fits, so no plan on the saved-bytes
frontier is cheaper and fits. Not guaranteed: the cheapest over every admissible set of modules; a brute-force test
on small trees counts how often that is cheaper (``tests/test_peak_budget.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .peak import PeakPrediction
from .solver import Run, Solution, frontier

__all__ = ["PeakChoice", "choose_under_peak", "ROUNDS"]

ROUNDS = 2  # frontiers of the bytes held at a peak: the profiled step's, then the lowest candidate's


@dataclass(frozen=True)
class PeakChoice:
    """``chosen``: the cheapest candidate whose predicted peak fits (None where none does) and its prediction;
    ``lowest``: the candidate with the least predicted peak (the cheaper of equals) and its prediction;
    ``considered``: how many distinct plans were weighed."""

    chosen: Solution | None
    chosen_peak: PeakPrediction | None
    lowest: Solution
    lowest_peak: PeakPrediction
    considered: int


def choose_under_peak(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], runs: Sequence[Run],
                      resolution: int, peak_budget: int, predict: Callable[[tuple[int, ...]], PeakPrediction],
                      held_across: Callable[[int], list[bool]], profiled_interval: int,
                      rounds: int = ROUNDS) -> PeakChoice:
    """The cheapest candidate (see the module doc) whose ``predict``-ed peak is at most ``peak_budget``.
    ``predict``: a Solution's chosen options -> its peak; ``held_across``: an interval -> for each option (nodes,
    then runs), whether wrapping it frees bytes over that interval."""
    weighed: dict[tuple[int, ...], tuple[Solution, PeakPrediction]] = {}

    def weigh(found: list[Solution]) -> None:
        for solution in found:
            if solution.chosen not in weighed:
                weighed[solution.chosen] = (solution, predict(solution.chosen))

    weigh(frontier(weights, costs, ends, resolution, runs))
    interval, looked = profiled_interval, set()
    for _ in range(rounds):
        if interval in looked:
            break
        looked.add(interval)
        mask = held_across(interval)
        count = len(weights)
        weigh(frontier([w if mask[i] else 0 for i, w in enumerate(weights)], costs, ends, resolution,
                       [run if mask[count + k] else Run(run.start, run.jump, 0, run.cost) for k, run in enumerate(runs)]))
        interval = min(weighed.values(), key=lambda pair: (pair[1].peak_bytes, pair[0].cost))[1].interval
    fitting = [pair for pair in weighed.values() if pair[1].peak_bytes <= peak_budget]
    chosen = min(fitting, key=lambda pair: (pair[0].cost, pair[1].peak_bytes), default=(None, None))
    lowest = min(weighed.values(), key=lambda pair: (pair[1].peak_bytes, pair[0].cost))
    return PeakChoice(chosen[0], chosen[1], lowest[0], lowest[1], len(weighed))
