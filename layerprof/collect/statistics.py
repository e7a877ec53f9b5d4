"""Statistics over many steps, in bounded memory.

Per module and per pass: exact running mean, std, min and max (Welford), and a reservoir of at most
``max_samples`` step values for the median and p95, exact while the number of steps is at most ``max_samples``
and a uniform random sample of the steps beyond that. Memory is therefore bounded by
``modules x 2 passes x max_samples`` floats (8 bytes each): 16 MiB for 1,000 modules at the default 1,024,
however many steps run.
"""
from __future__ import annotations

import math
import random
from array import array

from ..record.fields import STAT_PASSES, STATISTICS
from ..record.records import ModuleRecord
from .timing import StepTimes

__all__ = ["RunningStat", "StepStats", "quantile"]
_MEAN_ONLY = ("self_forward_ms", "self_backward_ms", "recompute_ms")


class RunningStat:
    """Mean, sample std, min, max of a stream, plus a bounded reservoir of its values for quantiles."""

    __slots__ = ("count", "mean", "_m2", "min", "max", "_samples", "_max_samples", "_rng")

    def __init__(self, max_samples: int, rng: random.Random) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._samples = array("d")
        self._max_samples = max_samples
        self._rng = rng

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        if len(self._samples) < self._max_samples:
            self._samples.append(value)
        else:  # reservoir sampling keeps a uniform sample of every value seen
            slot = self._rng.randrange(self.count)
            if slot < self._max_samples:
                self._samples[slot] = value

    def summary(self) -> dict[str, float]:
        """``mean``, ``median``, ``std`` (sample, 0 for one value), ``min``, ``max``, ``p95``."""
        ordered = sorted(self._samples) or [0.0]
        return {
            "mean": self.mean,
            "median": quantile(ordered, 0.5),
            "std": math.sqrt(self._m2 / (self.count - 1)) if self.count > 1 else 0.0,
            "min": self.min,
            "max": self.max,
            "p95": quantile(ordered, 0.95),
        }


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolating linearly as ``numpy.percentile`` does by default
    (numpy's own call costs ~50 µs, which adds up over thousands of modules)."""
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class StepStats:
    """Accumulates per-module ``StepTimes`` over steps and writes means and statistics onto records."""

    def __init__(self, max_samples: int = 1024, seed: int = 0) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        self.max_samples = max_samples
        self.steps = 0
        self._rng = random.Random(seed)
        self._stats: dict[tuple[str, str], RunningStat] = {}
        self._sums: dict[tuple[str, str], tuple[int, float]] = {}
        self._calls: dict[str, int] = {}
        self._last_call_times: dict[str, list] = {}

    def add(self, step: dict[str, StepTimes]) -> None:
        """One measured step. A module absent from it did not run in that step."""
        self.steps += 1
        for name, times in step.items():
            self._calls[name] = self._calls.get(name, 0) + times.calls
            self._last_call_times[name] = times.call_times
            for field in STAT_PASSES:
                value = getattr(times, field)
                if value is not None:
                    key = (name, field)
                    stat = self._stats.get(key)
                    if stat is None:
                        stat = self._stats[key] = RunningStat(self.max_samples, self._rng)
                    stat.add(value)
            for field in _MEAN_ONLY:
                value = getattr(times, field)
                if value is not None:
                    count, total = self._sums.get((name, field), (0, 0.0))
                    self._sums[(name, field)] = (count + 1, total + value)

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        """Means per step in ``forward_ms`` etc., the other statistics beside them (``forward_ms_p95``...)."""
        for name, record in records.items():
            calls = self._calls.get(name, 0)
            record.steps = self.steps
            record.calls = calls // self.steps if self.steps and calls % self.steps == 0 else (
                calls / self.steps if self.steps else 0
            )
            record.call_times = list(self._last_call_times.get(name, []))
            for field in STAT_PASSES:
                stat = self._stats.get((name, field))
                if stat is None:
                    continue
                summary = stat.summary()
                setattr(record, field, summary["mean"])
                for statistic in STATISTICS:
                    setattr(record, f"{field}_{statistic}", summary[statistic])
            for field in _MEAN_ONLY:
                count, total = self._sums.get((name, field), (0, 0.0))
                if count:
                    setattr(record, field, total / count)
