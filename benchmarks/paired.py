"""Paired step timing for the checkpoint benchmark: a step with a change and a step without, run back to back.

Each pair runs the two steps in one order or the other, alternately (base first, then the change first: over two
pairs an A B B A sequence, so that a linear drift of the machine cancels), and times each in process CPU time
(other work on a shared machine does not count; on a GPU ``cuda_timed``, wall time between synchronizes), with the
minor page faults the step took. The figure is the median
of the paired differences; beside it a distribution-free 95 % confidence interval of that median from the order
statistics (``median_ci``), which needs no assumption on the differences' distribution (steps on a loaded host have
long tails). ``extend`` adds pairs for one change until that interval is narrow enough or a cap is reached: the
stopping rule reads the interval's width only, never where the median lies, so it does not bias the figure.
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Paired", "band", "cuda_timed", "extend", "median_ci", "narrow_enough", "pair_order", "run_pairs", "within"]

NARROW_SHARE, NARROW_MS = 0.10, 1.0  # a plan's pairs are added until its 95 % interval is this narrow (or the cap)


def band(predicted_ms: float) -> float:
    """The checkpoint issue's tolerance on a plan's extra time either side of its prediction: 25 %, or 2 ms."""
    return max(2.0, 0.25 * abs(predicted_ms))


def within(predicted: float, measured: float) -> bool:
    """The issue's target: measured extra time within 25 % of predicted, or within 2 ms."""
    return abs(measured - predicted) <= band(predicted)


def narrow_enough(predicted_ms: float) -> float:
    """The half-width of the 95 % interval of a plan's measured extra time at which its pairs stop: 10 % of the
    predicted extra time, or 1 ms where that is more."""
    return max(NARROW_SHARE * abs(predicted_ms), NARROW_MS)


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The order-statistic confidence interval of the median of ``values``: (x_(k), x_(n+1-k)) in sorted order,
    k the largest rank with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2, so that the interval covers
    the true median with at least ``confidence``. Where no rank qualifies (n < 6 at 95 %), the whole range."""
    if not values:
        raise ValueError("median_ci needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    ordered = sorted(values)
    n = len(ordered)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1) for the next k
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2.0 ** n  # P(X <= k)
        if nxt > tail:
            break
        below, k = nxt, k + 1
    if k == 0:
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def pair_order(index: int) -> bool:
    """Whether pair ``index`` runs the base step first: even pairs base first, odd ones the change first."""
    return index % 2 == 0


@dataclass
class Paired:
    """One change's pairs: the differences change - base (ms), the base steps' times, the minor page faults of
    each step (base, change)."""

    differences: list[float] = field(default_factory=list)
    bases: list[float] = field(default_factory=list)
    faults: list[tuple[int, int]] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.differences)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.differences) < 2:
            return self.differences[0], self.differences[0]
        first, _, third = statistics.quantiles(self.differences, n=4)
        return first, third

    @property
    def ci(self) -> tuple[float, float]:
        return median_ci(self.differences)

    @property
    def half_width(self) -> float:
        low, high = self.ci
        return (high - low) / 2.0

    @property
    def base_ms(self) -> float:
        return statistics.median(self.bases)

    @property
    def median_faults(self) -> tuple[float, float]:
        return (statistics.median(f[0] for f in self.faults), statistics.median(f[1] for f in self.faults))


Timer = Callable[[Callable[[], Any]], tuple[float, int]]  # a step run and timed: (ms, minor page faults)


def _timed(run: Callable[[], Any]) -> tuple[float, int]:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.process_time()
    run()
    elapsed = (time.process_time() - start) * 1e3
    return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def cuda_timed(run: Callable[[], Any]) -> tuple[float, int]:
    """A step on a GPU: wall time from a synchronize before it (the work queued earlier is not the step's) to one
    after it (its kernels are), as ``verify_plan`` times it; process CPU time would leave the GPU's time out."""
    import torch

    from layerprof.plan.verify import _timed as synchronized

    return synchronized(run, torch.cuda.synchronize)


def _one_pair(base: Callable[[], Any], step: Callable[[], Any], index: int, into: Paired | None,
              timed: Timer = _timed) -> None:
    if pair_order(index):
        (plain, plain_faults), (changed, changed_faults) = timed(base), timed(step)
    else:
        (changed, changed_faults), (plain, plain_faults) = timed(step), timed(base)
    if into is not None:
        into.differences.append(changed - plain)
        into.bases.append(plain)
        into.faults.append((plain_faults, changed_faults))


def run_pairs(base: Callable[[], Any], steps: dict[str, Callable[[], Any]], repeats: int,
              timed: Timer = _timed) -> dict[str, Paired]:
    """``repeats`` pairs of each step against ``base``, the steps interleaved round by round, after one warm-up
    round that is not kept. ``timed``: how a step is timed (process CPU time; ``cuda_timed`` on a GPU)."""
    found = {key: Paired() for key in steps}
    for index in range(repeats + 1):
        for key, step in steps.items():
            _one_pair(base, step, index, found[key] if index else None, timed)
    return found


_LEAST = 6  # pairs below which no order statistics make a 95 % interval of the median (median_ci)


def extend(base: Callable[[], Any], step: Callable[[], Any], paired: Paired, half_width: float, cap: int,
           timed: Timer = _timed) -> Paired:
    """More pairs of ``step`` against ``base`` until the 95 % interval of the median difference is at most
    ``half_width`` either side, or there are ``cap`` pairs; checked at even counts of at least 6 only, so that as
    many pairs ran base first as change first and the interval is a 95 % one."""
    while len(paired.differences) < cap:
        count = len(paired.differences)
        if count % 2 == 0 and count >= _LEAST and paired.half_width <= half_width:
            break
        _one_pair(base, step, count + 1, paired, timed)  # index as in run_pairs, where index 0 was the warm-up round
    return paired
