"""A performance gate for CI: is profile B slower than profile A, beyond a limit and beyond the noise of both?

Each side is a distribution over the recorded steps, summarised by its median and the edges of its noise: its
fastest step (``low``) and its 95th percentile (``high``). Interference on a busy machine only adds time, so the
median is the typical step and the fastest step the least disturbed one. B is *slower* only when all three hold:

1. its median is more than ``limit`` % above A's median (the change the gate reports);
2. B's median is above A's noise: above A's 95th percentile step;
3. A's median is below B's noise: below B's fastest step.

So a single slow step (a page fault, another job) moves neither median, and a change smaller than the step-to-step
spread of either profile is reported as within the noise, not as a regression. What no gate on two runs can tell
apart: the whole of B measured while the machine was busier than during A (every step of B slower); profile both
on the same idle machine, or several times.

The model's time is read from ``meta["step_ms"]`` (per-step forward and backward, written since this version),
else from the root's stored statistics (older files). A module's from its own statistics (median, min, p95 per
pass; a total sums the passes, which bounds rather than measures its minimum and p95).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .units import format_ms

if TYPE_CHECKING:
    from ..profile import Profile
    from ..record.records import ModuleRecord

__all__ = ["Spread", "Verdict", "Gate", "gate", "model_spread", "module_spread", "different_models", "PASSES",
           "MIN_SHARE"]

PASSES = ("forward", "backward", "total")
MIN_SHARE = 1.0  # percent of the model's median: smaller modules are below the timer's resolution and noise


@dataclass(frozen=True)
class Spread:
    """One time over the recorded steps, in ms: ``median``, the noise edges ``low`` (fastest step) and ``high``
    (95th percentile), and ``steps``."""

    median: float
    low: float
    high: float
    steps: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        """The spread of per-step values."""
        median, high = np.percentile(values, [50, 95])  # linear interpolation, as the stored statistics
        return cls(float(median), float(min(values)), float(high), len(values))


def _passes(by: str) -> tuple[str, ...]:
    return ("forward", "backward") if by == "total" else (by,)


def _step_series(profile: Profile, by: str) -> list[float] | None:
    stored = profile.meta.get("step_ms")
    if not isinstance(stored, dict):
        return None
    series = [stored.get(name) for name in _passes(by)]
    series = [values for values in series if isinstance(values, list) and values]
    if not series or len({len(values) for values in series}) != 1:
        return None
    return [sum(step) for step in zip(*series)]


def module_spread(record: ModuleRecord, by: str = "total", steps: int = 1) -> Spread | None:
    """A module's ``by`` time from its stored statistics; None where no pass of it ran.

    A record written before the statistics existed has only its mean: all three are the mean then."""
    median = low = high = 0.0
    found = False
    for name in _passes(by):
        mean = getattr(record, f"{name}_ms", None)
        if mean is None:
            continue
        found = True
        median += _stat(record, name, "median", mean)
        low += _stat(record, name, "min", mean)
        high += _stat(record, name, "p95", mean)
    if not found:
        return None
    return Spread(median, low, high, int(getattr(record, "steps", None) or steps))


def _stat(record: ModuleRecord, name: str, statistic: str, default: float) -> float:
    value = getattr(record, f"{name}_ms_{statistic}", None)
    return float(default if value is None else value)


def model_spread(profile: Profile, by: str = "total") -> Spread | None:
    """The model's ``by`` time per step: from ``meta["step_ms"]`` where present, else the root's statistics, else
    (a root never called) the sum of its top-level modules'."""
    series = _step_series(profile, by)
    if series is not None:
        return Spread.of(series)
    steps = int(profile.meta.get("steps") or 1)
    root = profile.tree
    spread = module_spread(root, by, steps)
    if spread is not None:
        return spread
    parts = [module_spread(child, by, steps) for child in root.children]
    known = [part for part in parts if part is not None]
    if not known:
        return None
    return Spread(sum(p.median for p in known), sum(p.low for p in known), sum(p.high for p in known), steps)


@dataclass(frozen=True)
class Verdict:
    """A's and B's spreads of one time (the model's: ``name`` None) and whether B is slower beyond ``limit``."""

    name: str | None
    a: Spread
    b: Spread
    limit: float

    @property
    def change(self) -> float:
        """B's median relative to A's, in percent."""
        return 100.0 * (self.b.median - self.a.median) / self.a.median if self.a.median > 0 else math.inf

    @property
    def noise(self) -> float:
        """How far the noise of either profile reaches, in percent of its median: A's p95 above it, B's fastest
        step below it."""
        above = (self.a.high - self.a.median) / self.a.median if self.a.median > 0 else 0.0
        below = (self.b.median - self.b.low) / self.b.median if self.b.median > 0 else 0.0
        return 100.0 * max(above, below)

    @property
    def beyond_noise(self) -> bool:
        return self.b.median > self.a.high and self.b.low > self.a.median

    @property
    def slower(self) -> bool:
        return self.change > self.limit and self.beyond_noise

    def describe(self) -> str:
        what = "" if self.name is None else f"{self.name or '(root)'} "
        return f"{what}{format_ms(self.a.median)} -> {format_ms(self.b.median)} ({self.change:+.1f} %)"


def different_models(a: Profile, b: Profile) -> str | None:
    """Why A and B are not two profiles of one model (None when they are): another root type, fewer than half of
    the modules alike by name and type, or another batch size."""
    if a.tree.type != b.tree.type:
        return f"A is a {a.tree.type} and B a {b.tree.type}"
    modules_a = {(name, record.type) for name, record in a.records.items()}
    modules_b = {(name, record.type) for name, record in b.records.items()}
    alike = len(modules_a & modules_b)
    if 2 * alike < len(modules_a | modules_b):
        return (f"only {alike} of their {len(modules_a | modules_b)} modules are alike by name and type "
                f"(A has {len(modules_a)}, B {len(modules_b)})")
    batch_a, batch_b = (_environment(p).get("batch_size") for p in (a, b))
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        return f"A was profiled with batch size {batch_a} and B with {batch_b}"
    return None


def _environment(profile: Profile) -> dict[str, Any]:
    environment = profile.meta.get("environment")
    return environment if isinstance(environment, dict) else {}


class Gate:
    """The verdict on the model's time (``model``) and, for modules of at least ``MIN_SHARE`` % of the model's
    median in A, on each of theirs (``modules``, by name, in A's order)."""

    def __init__(self, a: Profile, b: Profile, limit: float, by: str = "total") -> None:
        if by not in PASSES:
            raise ValueError(f"by must be one of {', '.join(PASSES)}, got {by!r}")
        if not math.isfinite(limit) or limit < 0:
            raise ValueError(f"the limit must be a finite percentage >= 0, got {limit}")
        spread_a, spread_b = model_spread(a, by), model_spread(b, by)
        if spread_a is None or spread_b is None or spread_a.median <= 0:
            missing = "A" if spread_a is None or spread_a.median <= 0 else "B"
            raise ValueError(f"profile {missing} holds no {by} time to compare; profile it with backward "
                             f"for backward time, or gate on --by forward")
        self.by, self.limit = by, limit
        self.model = Verdict(None, spread_a, spread_b, limit)
        self.modules: list[Verdict] = []
        floor = spread_a.median * MIN_SHARE / 100.0
        for name, record in a.records.items():
            other = b.records.get(name)
            if not name or other is None or other.type != record.type:
                continue
            module_a, module_b = module_spread(record, by), module_spread(other, by)
            if module_a is not None and module_b is not None and module_a.median >= floor:
                self.modules.append(Verdict(name, module_a, module_b, limit))

    def slower_modules(self) -> list[Verdict]:
        """Modules slower beyond the limit and the noise, innermost only (a parent of one is left out: its
        change is its child's), the largest increase first."""
        slower = [verdict for verdict in self.modules if verdict.slower]
        names = [verdict.name or "" for verdict in slower]
        innermost = [v for v in slower if not any(other.startswith(f"{v.name}.") for other in names)]
        return sorted(innermost, key=lambda v: v.b.median - v.a.median, reverse=True)

    def failed(self, per_module: bool = False) -> bool:
        """B is slower: the model's time, or with ``per_module`` any module's."""
        return self.model.slower or (per_module and bool(self.slower_modules()))

    def line(self, per_module: bool = False, shown: int = 5) -> str:
        """One line for the log: the verdict, the model's change against the limit and the noise, and the modules
        that got slower."""
        model = self.model
        steps = f"{model.a.steps} and {model.b.steps} steps"
        head = (f"{self.by} time per step (median) {model.describe()}, limit +{self.limit:g} %, "
                f"noise {model.noise:.1f} % ({steps})")
        slower = self.slower_modules()
        named = ", ".join(verdict.describe() for verdict in slower[:shown])
        more = f" and {len(slower) - shown} more" if len(slower) > shown else ""
        if self.failed(per_module):
            who = "B is slower" if model.slower else "modules of B are slower"
            return f"FAIL: {who}: {head}" + (f"; slower: {named}{more}" if named else "")
        if model.change > self.limit:
            return f"ok: {head}: the change is within the noise of the two profiles, not a regression"
        return f"ok: {head}" + (f"; slower beyond the limit but not gated (add --per-module): {named}{more}"
                                if named else "")
