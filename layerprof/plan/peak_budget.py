"""Choosing a checkpoint plan against a budget of the step's peak memory (``checkpoint_plan(peak=...)``).

The step's peak under a plan (``peak.py``) is the highest of many intervals, each moved by what the plan holds
there, and the recomputations: not a sum over modules, so no knapsack finds the cheapest plan under it directly.
The planner weighs candidates instead, each by its predicted peak, cheapest first, and returns the cheapest (in the
knapsack's cold time) whose predicted peak fits:

- the plans on the saved-bytes Pareto frontier (the solver's, at the plan's resolution): the cheapest way to free
  each amount of saved memory;
- the frontiers of the bytes held at a peak: the same knapsack with only the options that, wrapped, stop holding
  their saved bytes over the interval where a peak is (a region's bytes are gone from the end of its forward to the
  start of its backward; a module whose backward has run before the peak frees nothing there). First at the
  profiled step's peak, then, ``ROUNDS - 1`` more times, at the peak of the lowest plan weighed so far, among the
  intervals not yet looked at.

Each frontier is walked at both ends of each cost (``iter_frontier(both_ends=True)``: the plan that frees the most
for it, and the one at the lowest level it reaches, which frees less and can hold less at the peak), cheapest
first, and left at its first plan that fits, or at the first that costs no less
than the best fit so far. A plan is predicted (about 2 ms on a 10,000-module step) unless a bound rules it out:
at the profiled step's peak, a plan takes off at most what its wrapped modules save, so where their saved bytes
fall short of the peak's excess over the budget it cannot fit (where no plan fits, those are predicted after all,
for the least peak any reaches). At most ``MAX_WEIGHED`` plans are predicted in all.

Guaranteed: the plan is the cheapest of those weighed whose predicted peak fits; where the saved-bytes frontier was
walked to its first fit (always, unless ``MAX_WEIGHED`` stopped it first: ``PeakChoice.complete``), no plan on it
is cheaper and fits. Not guaranteed: the cheapest over every admissible set of modules; a brute-force test on small
trees counts how often that is cheaper (``tests/test_peak_budget.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from .peak import PeakPrediction
from .solver import Run, Solution, iter_frontier

__all__ = ["PeakChoice", "choose_under_peak", "ROUNDS", "MAX_WEIGHED"]

ROUNDS = 4  # frontiers of the bytes held at a peak: the profiled step's, then at the lowest plans' peaks
MAX_WEIGHED = 2048  # plans weighed at most, over every frontier (a prediction each)


@dataclass(frozen=True)
class PeakChoice:
    """``chosen``: the cheapest plan weighed whose predicted peak fits (None where none does) and its prediction;
    ``lowest``: the plan weighed with the least predicted peak (the cheaper of equals) and its prediction;
    ``considered``: how many distinct plans were weighed; ``complete``: whether the saved-bytes frontier was walked
    to its first fit or its end (``MAX_WEIGHED`` did not stop it)."""

    chosen: Solution | None
    chosen_peak: PeakPrediction | None
    lowest: Solution
    lowest_peak: PeakPrediction
    considered: int
    complete: bool


def choose_under_peak(weights: Sequence[int], costs: Sequence[float], ends: Sequence[int], runs: Sequence[Run],
                      resolution: int, peak_budget: int, predict: Callable[[tuple[int, ...]], PeakPrediction],
                      held_across: Callable[[int], list[bool]], profiled_interval: int, profiled_peak: int,
                      saved_inside: Sequence[float], rounds: int | None = None) -> PeakChoice:
    """The cheapest plan weighed (see the module doc) whose ``predict``-ed peak is at most ``peak_budget``.
    ``predict``: a Solution's chosen options -> its peak; ``held_across``: an interval -> for each option (nodes,
    then runs), whether wrapping it frees bytes over that interval; ``saved_inside``: for each option, the most
    it can lower the profiled peak (``PeakModel.saved_inside``): a plan whose options sum to less than the
    profiled peak's excess over the budget cannot fit, and is passed over unpredicted."""
    weighed: dict[tuple[int, ...], tuple[Solution, PeakPrediction]] = {}
    fit: list[tuple[Solution, PeakPrediction]] = []
    passed: list[Solution] = []  # ruled out by the bound: predicted only where nothing fits, for the lowest peak

    def walk(plans: Iterator[Solution]) -> bool:
        """Weigh ``plans`` (cheapest first) up to the first that fits or costs no less than the best fit; whether
        it got there (not stopped by ``MAX_WEIGHED``)."""
        for solution in plans:
            if fit and solution.cost >= fit[0][0].cost:
                return True
            if profiled_peak - sum(saved_inside[i] for i in solution.chosen) > peak_budget:
                passed.append(solution)
                continue  # cannot fit (see above)
            found = weighed.get(solution.chosen)
            if found is None:
                if len(weighed) >= MAX_WEIGHED:
                    return False
                found = weighed[solution.chosen] = (solution, predict(solution.chosen))
            if found[1].peak_bytes <= peak_budget:
                fit[:] = [found]
                return True
        return True

    complete = walk(iter_frontier(weights, costs, ends, resolution, runs, both_ends=True))
    interval, looked, count = profiled_interval, set(), len(weights)
    for _ in range(ROUNDS if rounds is None else rounds):
        looked.add(interval)
        mask = held_across(interval)
        walk(iter_frontier([w if mask[i] else 0 for i, w in enumerate(weights)], costs, ends, resolution,
                           [run if mask[count + k] else Run(run.start, run.jump, 0, run.cost)
                            for k, run in enumerate(runs)], both_ends=True))
        elsewhere = [pair for pair in weighed.values() if pair[1].interval not in looked]
        if not elsewhere or len(weighed) >= MAX_WEIGHED:
            break
        interval = min(elsewhere, key=lambda pair: (pair[1].peak_bytes, pair[0].cost))[1].interval
    if not fit:  # the least peak any plan looked at reaches: those the bound passed over too
        for solution in passed:
            if len(weighed) >= MAX_WEIGHED:
                break
            if solution.chosen not in weighed:
                weighed[solution.chosen] = (solution, predict(solution.chosen))
        weighed.setdefault((), (Solution((), 0, 0.0), predict(())))
    lowest = min(weighed.values(), key=lambda pair: (pair[1].peak_bytes, pair[0].cost))
    chosen = fit[0] if fit else (None, None)
    return PeakChoice(chosen[0], chosen[1], lowest[0], lowest[1], len(weighed), complete)
