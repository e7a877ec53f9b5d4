"""Statistics over many steps, in bounded memory, with one denominator: every recorded step.

A module's per-step figures are over all recorded steps; a step in which it did not run (or ran without a
backward pass) counts as 0 for that pass, so a module that runs every fifth step shows a fifth of its per-run
time, and ``steps_run`` says in how many steps it ran. The root and every module share the denominator, so a
share of the root is a share of the same steps, and a child that runs inside its parent is never above it.

Per module and pass: exact mean, sample std, min and max, and a reservoir of at most ``max_samples`` step values
for the median and p95, exact while the number of steps is at most ``max_samples`` and a uniform random sample
of the steps beyond that. The reservoir keeps the *same* steps for every module (one draw per step), so a
quantile of a child is never above the same quantile of its parent. Memory is bounded by
``modules x 2 passes x max_samples`` floats (8 bytes each): 16 MiB for 1,000 modules at the default 1,024.
"""
from __future__ import annotations

import math
import random
from array import array
from typing import Any, Callable, Iterable

from ..record.records import ModuleRecord
from .timing import StepTimes

__all__ = ["RunningStat", "StepStats", "STATISTICS", "STAT_PASSES", "quantile", "drop_times"]

STATISTICS = ("median", "std", "min", "max", "p95")
STAT_PASSES = ("forward_ms", "backward_ms")
_MEAN_ONLY = ("self_forward_ms", "self_backward_ms", "recompute_ms")


class RunningStat:
    """Mean, sample std, min, max of one stream, plus a bounded reservoir of its values for quantiles."""

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


# What ``fill`` writes on the record of a module that did not run (its ``call_times`` is the class's: none).
_NOT_RUN = {"steps": 1, "calls": 0, "steps_run": 0}
_STAT_KEYS = {field: tuple(f"{field}_{statistic}" for statistic in STATISTICS) for field in ("forward_ms", "backward_ms")}

# What ``fill`` writes of times on a record: the passes' means and statistics, self and recompute times, the host's
# forward, and the calls' timings (``call_times``).
_TIMES = ("forward_ms", "backward_ms", *_MEAN_ONLY, *_STAT_KEYS["forward_ms"], *_STAT_KEYS["backward_ms"],
          "host_forward_ms", "host_forward_ms_median", "_timings", "_earlier_timings")


def drop_times(records: dict[str, ModuleRecord]) -> None:
    """Take every time ``fill`` wrote off ``records``, which then read None ("not measured"): what a step on the
    meta device or fake tensors keeps (its calls and steps, and the meters' figures)."""
    for record in records.values():
        own = record.__dict__
        for key in _TIMES:
            own.pop(key, None)


class _Pass:
    """One module's values of one pass over the steps: sums for the mean and std, extremes over the steps that
    had a value (0 joins them in ``summary`` when some steps had none), and the shared reservoir."""

    __slots__ = ("runs", "total", "total_sq", "min", "max", "samples")

    def __init__(self, filled: int) -> None:
        self.runs = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.samples = array("d", bytes(8 * filled))  # the steps before this module first ran: zeros

    def summary(self, steps: int) -> dict[str, float]:
        if steps == 1:  # one step (the one-shot profile): every statistic is its value, nothing to sort
            value = self.total
            return {"mean": value, "median": value, "std": 0.0, "min": value, "max": value, "p95": value}
        mean = self.total / steps
        variance = (self.total_sq - steps * mean * mean) / (steps - 1) if steps > 1 else 0.0
        ordered = sorted(self.samples) or [0.0]
        zeros = self.runs < steps
        return {
            "mean": mean,
            "median": quantile(ordered, 0.5),
            "std": math.sqrt(max(0.0, variance)),
            "min": min(self.min, 0.0) if zeros else self.min,
            "max": max(self.max, 0.0) if zeros else self.max,
            "p95": quantile(ordered, 0.95),
        }


class _Module:
    __slots__ = ("calls", "steps_run", "forward", "backward", "sums", "last_times", "last_step", "host")

    def __init__(self, filled: int) -> None:
        self.calls = 0
        self.steps_run = 0
        self.forward = _Pass(filled)
        self.backward = _Pass(filled)
        self.sums = [0.0, 0.0, 0.0]  # _MEAN_ONLY, in order
        self.host: _Pass | None = None  # the host's forward time, where CUDA events timed it (made when first seen)
        self.last_times: StepTimes | None = None  # its call timings are built only for the last step
        self.last_step = 0


def _or_zero(value: float | None) -> float:
    return 0.0 if value is None else value


def _put(values: _Pass, value: float, slot: int | None) -> None:
    values.runs += 1
    values.total += value
    values.total_sq += value * value
    if value < values.min:
        values.min = value
    if value > values.max:
        values.max = value
    if slot is not None:
        if slot < 0:
            values.samples.append(value)
        else:
            values.samples[slot] = value


def _put_zero(values: _Pass, slot: int | None) -> None:
    if slot is not None:
        if slot < 0:
            values.samples.append(0.0)
        else:
            values.samples[slot] = 0.0


class StepStats:
    """Accumulates per-module ``StepTimes`` over steps and writes means and statistics onto records."""

    def __init__(self, max_samples: int = 1024, seed: int = 0) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        self.max_samples = max_samples
        self.steps = 0
        # Made at the first draw, once the reservoir is full: seeding one costs more than a one-shot profile's
        # statistics, which never draw.
        self._seed = seed
        self._rng: random.Random | None = None
        self._modules: dict[str, _Module] = {}
        self._sampled = 0  # reservoir length, the same for every module
        # The first step is kept as it came and only folded into the sums when a second one arrives: a one-shot
        # profile (one step, the usual case) writes its values straight onto the records.
        self._first: dict[str, StepTimes] | None = None
        # The first step's times where they are made when first needed (``add_later``).
        self._later: Callable[[], dict[str, StepTimes]] | None = None
        self._later_calls: Iterable[Any] = ()

    def add(self, step: dict[str, StepTimes]) -> None:
        """One measured step. A module absent from it did not run in that step: it counts 0."""
        if self.steps == 0:
            self.steps, self._first = 1, step
            return
        first, self._first = self._first_step(), None
        if first is not None:
            self.steps = 0
            self._add(first)
        self._add(step)

    def add_later(self, make: Callable[[], dict[str, StepTimes]], calls: Iterable[Any] = ()) -> None:
        """The first measured step, its times made by ``make()`` when first needed (``fill``, ``step_totals``, a
        second step): a one-shot profile's last step, whose times a profile that is never read never needs.
        ``calls``: the step's calls (with a ``name``), for ``ran`` before the times are made."""
        if self.steps:
            raise ValueError("add_later is for the first step: a step was added already")
        self.steps, self._later, self._later_calls = 1, make, calls

    def ran(self) -> set[str]:
        """The names of the modules called (or recomputed) in a recorded step."""
        if self._later is not None:
            return {call.name for call in self._later_calls}
        first = self._first
        return set(first if first is not None else self._modules)

    def _first_step(self) -> dict[str, StepTimes] | None:
        """The first step's times, while it is the only one (None once folded into the sums)."""
        if self._later is not None:
            self._first, self._later, self._later_calls = self._later(), None, ()
        return self._first

    def _add(self, step: dict[str, StepTimes]) -> None:
        self.steps += 1
        steps = self.steps
        # One reservoir draw per step, shared by every module: -1 appends, an index replaces, None skips.
        slot: int | None
        if self._sampled < self.max_samples:
            slot = -1
        else:
            if self._rng is None:
                self._rng = random.Random(self._seed)
            drawn = self._rng.randrange(steps)
            slot = drawn if drawn < self.max_samples else None
        modules = self._modules
        for name, times in step.items():
            module = modules.get(name)
            if module is None:
                module = modules[name] = _Module(self._sampled)
            module.last_step = steps
            module.calls += times.calls
            module.steps_run += 1
            module.last_times = times
            value = times.forward_ms
            if value is None:
                _put_zero(module.forward, slot)
            else:
                _put(module.forward, value, slot)
            value = times.backward_ms
            if value is None:
                _put_zero(module.backward, slot)
            else:
                _put(module.backward, value, slot)
            sums = module.sums
            if times.self_forward_ms is not None:
                sums[0] += times.self_forward_ms
            if times.self_backward_ms is not None:
                sums[1] += times.self_backward_ms
            if times.recompute_ms is not None:
                sums[2] += times.recompute_ms
            value = times.host_forward_ms
            if value is not None:
                if module.host is None:  # as many samples as the module's other passes held before this step
                    module.host = _Pass(len(module.forward.samples) - (1 if slot == -1 else 0))
                _put(module.host, value, slot)
            elif module.host is not None:
                _put_zero(module.host, slot)
        if slot is not None:
            if len(step) < len(modules):
                for module in modules.values():
                    if module.last_step != steps:
                        _put_zero(module.forward, slot)
                        _put_zero(module.backward, slot)
                        if module.host is not None:
                            _put_zero(module.host, slot)
            if slot < 0:
                self._sampled += 1

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        """Means per recorded step in ``forward_ms`` etc., the other statistics beside them (``forward_ms_p95``...),
        ``steps`` and ``steps_run``. A pass that never ran stays None."""
        steps = self.steps
        first = self._first_step()
        if first is not None:
            self._fill_one(first, records)
            return
        for name, record in records.items():
            record.steps = steps
            module = self._modules.get(name)
            if module is None or not steps:
                record.calls = 0
                record.steps_run = 0
                continue
            calls = module.calls
            record.calls = calls // steps if calls % steps == 0 else calls / steps
            record.steps_run = module.steps_run
            # The calls of the last recorded step only: a module that skipped it has none (an earlier step's
            # calls, drawn in the trace, would stand outside every slice of that step).
            if module.last_times is not None:
                if module.last_step == steps:
                    record._timings = module.last_times.timings
                else:  # kept apart, for the planner: whether the model re-ran it itself (``plan._own_calls``)
                    record.__dict__["_earlier_timings"] = module.last_times.timings
            for field, values in (("forward_ms", module.forward), ("backward_ms", module.backward)):
                if not values.runs:
                    continue
                summary = values.summary(steps)
                own = record.__dict__
                own[field] = summary["mean"]
                for statistic, key in zip(STATISTICS, _STAT_KEYS[field]):
                    own[key] = summary[statistic]
            for field, total, values in zip(_MEAN_ONLY, module.sums, (module.forward, module.backward, None)):
                if field == "recompute_ms":
                    if total:
                        record.recompute_ms = total / steps
                elif values.runs:
                    setattr(record, field, total / steps)
            if module.host is not None and module.host.runs:
                summary = module.host.summary(steps)
                record.host_forward_ms, record.host_forward_ms_median = summary["mean"], summary["median"]

    def step_totals(self) -> dict[str, list[float] | None]:
        """The model's forward and backward time in each recorded step (of the reservoir's steps, the same ones
        every module's median is taken over), for a gate on the distribution of steps (``render/gate.py``).

        The root's own times where it ran; where it was never called (a trainer calls its children), the sum of
        its top-level modules. A pass that never ran is None."""
        step = self._first_step()
        if step is not None:  # one step: its own values
            root_times = step.get("")
            times = [root_times] if root_times is not None and root_times.forward_ms is not None else [
                value for name, value in step.items() if name and "." not in name]
            return {key: [round(sum(_or_zero(getattr(t, f"{key}_ms")) for t in times), 6)]
                    if any(getattr(t, f"{key}_ms") is not None for t in times) else None
                    for key in ("forward", "backward")}
        root = self._modules.get("")
        parts = [root] if root is not None and root.forward.runs else [
            module for name, module in self._modules.items() if name and "." not in name]
        totals: dict[str, list[float] | None] = {}
        for key in ("forward", "backward"):
            passes = [getattr(module, key) for module in parts]
            if not any(values.runs for values in passes):
                totals[key] = None
                continue
            totals[key] = [round(sum(values.samples[i] for values in passes), 6) for i in range(self._sampled)]
        return totals

    @staticmethod
    def _fill_one(step: dict[str, StepTimes], records: dict[str, ModuleRecord]) -> None:
        """``fill`` for a single recorded step: every statistic is the step's value (std 0)."""
        found = step.get
        forward_median, forward_std, forward_min, forward_max, forward_p95 = _STAT_KEYS["forward_ms"]
        backward_median, backward_std, backward_min, backward_max, backward_p95 = _STAT_KEYS["backward_ms"]
        for name, record in records.items():
            own = record.__dict__
            times = found(name)
            if times is None:
                own.update(_NOT_RUN)
                continue
            own["steps"] = 1
            own["calls"] = times.calls
            own["steps_run"] = 1
            own["_timings"] = times.timings
            forward, backward = times.forward_ms, times.backward_ms
            if forward is not None:
                own["forward_ms"] = own[forward_median] = own[forward_min] = own[forward_max] = forward
                own[forward_p95] = forward
                own[forward_std] = 0.0
                if times.host_forward_ms is not None:
                    own["host_forward_ms"] = own["host_forward_ms_median"] = times.host_forward_ms
            if backward is not None:
                own["backward_ms"] = own[backward_median] = own[backward_min] = own[backward_max] = backward
                own[backward_p95] = backward
                own[backward_std] = 0.0
            # As ``fill`` does: a self time where its pass has a value, recompute where it is not 0.
            if forward is not None:
                own["self_forward_ms"] = times.self_forward_ms or 0.0
            if backward is not None:
                own["self_backward_ms"] = times.self_backward_ms or 0.0
            if times.recompute_ms:
                own["recompute_ms"] = times.recompute_ms
