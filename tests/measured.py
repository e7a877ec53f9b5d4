"""Checks on timings measured on a shared machine: retried, not loosened until they cannot fail.

Another process that preempts this one during a measurement (CI runs on 2 cores shared with other jobs) adds
milliseconds to that measurement only; a bug shifts every one. So a check that compares measured times runs its
measurement again, up to a few times, until the check holds, and asserts on the last one (the failure then shows
its numbers).
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def measured_until(attempts: int, measure: Callable[[], T], holds: Callable[[T], bool]) -> T:
    """``measure()`` up to ``attempts`` times, stopping at the first result for which ``holds`` is true; that
    result, or the last one."""
    result = measure()
    for _ in range(attempts - 1):
        if holds(result):
            break
        result = measure()
    return result


class Sleeper:
    """A hook (any arguments) that sleeps ``seconds`` and keeps how long each sleep really took, in ms, on the
    wall clock the profiler reads. A check that a sleep is outside a module's time then compares intervals
    (``child + slept <= parent``: both sleeps and child inside the parent, disjoint), which no load can break,
    instead of bounding the module's time by the sleep, which a preemption can reach."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.slept_ms: list[float] = []

    def __call__(self, *args: object) -> None:
        start = time.perf_counter_ns()
        time.sleep(self.seconds)
        self.slept_ms.append((time.perf_counter_ns() - start) / 1e6)
