"""A performance gate for CI: is profile B slower than profile A, beyond a limit and beyond the noise of both?

Each side is a distribution over the recorded steps, summarised by its median and the edges of its noise: its
fastest step (``low``) and its 95th percentile (``high``). Interference on a busy machine only adds time, so the
median is the typical step and the fastest step the least disturbed one. B is *slower* only when both hold:

1. its median is more than ``limit`` % above A's median (the change the gate reports);
2. the two stand apart: B's fastest step is slower than A's 95th percentile step.

So a single slow step (a page fault, another job) moves neither median nor B's fastest step, and a change smaller
than the step-to-step spread of the two profiles is reported as within the noise, not as a regression. One
recorded step has no spread: the medians alone decide. What no gate on two runs can tell
apart: the whole of B measured while the machine was busier than during A (every step of B slower); profile both
on the same idle machine, or several times.

The model's time is read from ``meta["step_ms"]`` (per-step forward and backward, written since this version),
else from the root's stored statistics (older files). A module's from its own statistics (median, min, p95 per
pass; a total sums the passes, which bounds rather than measures its minimum and p95).

A module (``--per-module``) is judged on its time *relative to the rest of the model* (the model's median less
the module's): a busier machine slows every module alike and leaves that ratio where it was, while a module that
got 25 % slower moves it by 25 % whatever its share. Its own median must also have risen by more than the limit:
where another module got faster, the rest shrinks, and the ratio alone would call an unchanged module slower.
Modules under ``MIN_SHARE`` % of the model (timer resolution) and over ``MAX_SHARE`` % (the rest is then too small
to measure against; the model's own verdict covers them) are not judged, nor any module of a profile with fewer
than ``MIN_MODULE_STEPS`` steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._machine import environment_in, memory_in
from ..record.records import preorder
from ..record.untimed import untimed_in
from .units import format_counted, format_ms

if TYPE_CHECKING:
    from ..profile import Profile
    from ..record.records import ModuleRecord

__all__ = ["Spread", "Verdict", "Gate", "model_spread", "module_spread", "different_models", "different_settings",
           "settings_that_differ", "different_machines", "PASSES", "MIN_SHARE", "MAX_SHARE", "MIN_MODULE_STEPS"]

PASSES = ("forward", "backward", "total")
MIN_SHARE = 1.0  # percent of the model's median: smaller modules are below the timer's resolution and noise
MAX_SHARE = 50.0  # percent: above it the rest of the model is too small a yardstick
# Steps each profile needs for a per-module verdict: with n steps a side, B's fastest above A's p95 happens by
# chance about once in C(2n, n) for one module (1 in 20 at 3 steps, in 184,756 at 10), and dozens are judged.
MIN_MODULE_STEPS = 10


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
    """A's and B's spreads of one time (the model's: ``name`` None) and whether B is slower beyond ``limit``.

    For a module the spreads are relative to the rest of the model, and ``times`` holds its medians in ms."""

    name: str | None
    a: Spread
    b: Spread
    limit: float
    times: tuple[float, float] | None = None

    @property
    def change(self) -> float:
        """B's median relative to A's, in percent."""
        return 100.0 * (self.b.median - self.a.median) / self.a.median if self.a.median > 0 else math.inf

    @property
    def noise(self) -> float:
        """The spread of the two profiles, in percent: A's p95 above its median plus B's fastest step below its
        median, about the change it takes for B's fastest step to clear A's p95."""
        above = (self.a.high - self.a.median) / self.a.median if self.a.median > 0 else 0.0
        below = (self.b.median - self.b.low) / self.b.median if self.b.median > 0 else 0.0
        return 100.0 * (above + below)

    @property
    def beyond_noise(self) -> bool:
        return self.b.low > self.a.high

    @property
    def slower(self) -> bool:
        """Beyond the limit and the noise; for a module, also slower in its own time by more than the limit: against
        the rest of the model alone, another module that got faster shrinks the rest, and a module whose time did not
        move read as slower (10.1 ms -> 10.1 ms, +467 % against a rest that fell from 30.6 to 5.4 ms)."""
        if self.times is not None:
            before, after = self.times
            if not after > before * (1.0 + self.limit / 100.0):
                return False
        return self.change > self.limit and self.beyond_noise

    def describe(self) -> str:
        what = "" if self.name is None else f"{self.name} "
        a, b = self.times or (self.a.median, self.b.median)
        return f"{what}{format_ms(a)} -> {format_ms(b)} ({self.change:+.1f} %)"


def _per(spread: Spread, rest: float) -> Spread:
    return Spread(spread.median / rest, spread.low / rest, spread.high / rest, spread.steps)


def different_models(a: Profile, b: Profile) -> str | None:
    """Why A and B are not two profiles of one model (None when they are): another root type, fewer than half of
    the modules alike by name and type, another batch size, or inputs of another shape beyond the batch (or of one
    shape against several)."""
    if a.tree.type != b.tree.type:
        return f"A is a {a.tree.type} and B a {b.tree.type}"
    modules_a = {(name, record.type) for name, record in a.records.items()}
    modules_b = {(name, record.type) for name, record in b.records.items()}
    alike = len(modules_a & modules_b)
    if 2 * alike < len(modules_a | modules_b):
        both = format_counted(len(modules_a | modules_b), "module")
        return (f"only {alike} of their {both} are alike by name and type "
                f"(A has {len(modules_a)}, B {len(modules_b)})")
    environment_a, environment_b = environment_in(a.meta), environment_in(b.meta)
    batch_a, batch_b = environment_a.get("batch_size"), environment_b.get("batch_size")
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        return f"A was profiled with batch size {batch_a} and B with {batch_b}"
    # Beyond the batch (whose size is the one most calls had: a short first batch is not the workload), the input's
    # other dimensions where every call had the same: a sequence length, an image size.
    shape_a, shape_b = environment_a.get("input_shape"), environment_b.get("input_shape")
    if isinstance(shape_a, list) and isinstance(shape_b, list) and shape_a[1:] != shape_b[1:]:
        return (f"A was profiled on inputs of shape {shape_a} and B on {shape_b} "
                "(other than the batch: another sequence length or image size)")
    # One shape against several (multi-scale training, dynamic padding against a fixed length): two workloads. Two
    # profiles of several shapes each (each batch padded to its own length) may be one.
    for (one, several, shape, count) in (("A", "B", shape_a, environment_b.get("input_shape_variants")),
                                         ("B", "A", shape_b, environment_a.get("input_shape_variants"))):
        if isinstance(shape, list) and isinstance(count, int) and count > 1:
            return (f"{one} was profiled on inputs of one shape, {shape}, and {several} on inputs of {count} shapes "
                    "(other than the batch: sequence lengths or image sizes that change from step to step)")
    return None


# What a step's time depends on besides the model and the code, as a profile's environment names it: where a gate's
# two profiles differ in one, a slower B says nothing of the change.
_SETTINGS: tuple[tuple[str, Any], ...] = (
    ("device", "on {}".format), ("dtype", "in {}".format),
    ("threads", lambda count: f"with {format_counted(count, 'thread')}"),
    ("autocast", lambda dtype: f"under torch.autocast ({dtype})" if dtype else "without torch.autocast"),
)
_MACHINE: tuple[tuple[str, Any], ...] = (("cpu", "CPU {!r}".format), ("gpu", "GPU {!r}".format),
                                         ("torch", "torch {}".format))


def different_settings(a: Profile, b: Profile, names: tuple[str, str] = ("A", "B")) -> str | None:
    """Why A and B were not measured the same way (None when they were, as far as both say): another device,
    dtype, thread count or torch.autocast (the memory meter's, where the forward entered it itself); steps of
    forward only against steps with backward; a time taken with meters that slow the step
    (``timing_distorted_by``) against one without. ``names``: what to call them."""
    found = [why for why in (_differing(a, b, _SETTINGS, names), _different_steps(a, b, names)) if why]
    return "; ".join(found) if found else None


def _ran(profile: Profile) -> str | None:
    """The passes the steps of ``profile`` ran, read from its backward times; for a profile without times (a step
    on the meta device or fake tensors), from its backward counts, and None (not known) where it has none."""
    if untimed_in(profile.meta) is None:
        backward = any(getattr(record, "backward_ms", None) for record in preorder(profile.tree))
        return "forward and backward" if backward else "forward only"
    counted = any(getattr(record, field, None) for record in preorder(profile.tree) for field in _BACKWARD_COUNTS)
    return "forward and backward" if counted else None


# What a step's backward counts where it has no times: FLOPs and bytes (the flops meter).
_BACKWARD_COUNTS = ("flops_backward", "bytes_backward")


def _different_steps(a: Profile, b: Profile, names: tuple[str, str]) -> str | None:
    found = []
    passes_a, passes_b = _ran(a), _ran(b)
    if passes_a is not None and passes_b is not None and passes_a != passes_b:
        found.append(f"{names[0]}'s steps ran {passes_a} and {names[1]}'s {passes_b}")
    slowed_a, slowed_b = a.meta.get("timing_distorted_by") or [], b.meta.get("timing_distorted_by") or []
    if slowed_a != slowed_b:
        said = [f"{name}'s times include the overhead of metrics {list(slowed)} (its one profiled step ran them)"
                for name, slowed in zip(names, (slowed_a, slowed_b)) if slowed]
        found.append(" and ".join(said))
    return "; ".join(found) if found else None


def different_machines(a: Profile, b: Profile, names: tuple[str, str] = ("A", "B")) -> str | None:
    """Where A and B name another CPU model, GPU or torch version (None where they do not, or do not say): a gate's
    verdict then holds the machines' difference too."""
    return _differing(a, b, _MACHINE, names)


def settings_that_differ(a: Profile, b: Profile) -> list[str]:
    """The settings (``device``, ``dtype``, ``threads``, ``autocast``) A and B name otherwise, in that order: what
    a gate's advice names to make alike."""
    return [key for key, _ in _settings_differing(a, b, _SETTINGS)]


def _settings_differing(a: Profile, b: Profile, keys: tuple[tuple[str, Any], ...]) -> list[tuple[str, Any]]:
    """(key, (A's value, B's value)) for each of ``keys`` whose value both profiles name, and name otherwise."""
    found_a, found_b = _settings(a.meta), _settings(b.meta)
    if found_a.get("device") != "cpu" or found_b.get("device") != "cpu":
        # The host's thread count sets a CPU step's speed; a GPU step's runs on the device.
        found_a.pop("threads", None)
        found_b.pop("threads", None)
    differing = []
    for key, _ in keys:
        value_a, value_b = found_a.get(key), found_b.get(key)
        if value_a is not None and value_b is not None and value_a != value_b:
            differing.append((key, (value_a, value_b)))
    return differing


def _differing(a: Profile, b: Profile, keys: tuple[tuple[str, Any], ...], names: tuple[str, str]) -> str | None:
    forms = dict(keys)
    differing = _settings_differing(a, b, keys)
    if not differing:
        return None
    shown_a = [forms[key](value_a) for key, (value_a, _) in differing]
    shown_b = [forms[key](value_b) for key, (_, value_b) in differing]
    return f"{names[0]} ran {', '.join(shown_a)} and {names[1]} {', '.join(shown_b)}"


def _settings(meta: dict[str, Any]) -> dict[str, Any]:
    """A profile's environment with its device as the device's type: the same GPU model as ``cuda:0`` or ``cuda:1``
    runs a step alike (the GPU's name is compared as the machine's); and ``autocast``, its dtype or False."""
    environment = environment_in(meta)
    found = dict(environment)
    device = environment.get("device")
    if isinstance(device, str):
        found["device"] = device.partition(":")[0]
    if environment.get("input_dtype") is not None:
        # Where the input was seen, so was torch.autocast (``autocast_dtype``, absent without it): a float32 model's
        # step under bf16 autocast computes its matrix products in bf16, which its ``dtype`` does not say. One the
        # forward enters itself (accelerate's prepare_model, Trainer(bf16=True)) is on after the input was seen:
        # the memory meter's ``autocast``, read inside the forward, says it.
        inside = memory_in(meta).get("autocast")
        found["autocast"] = environment.get("autocast_dtype") or (inside if isinstance(inside, str) else False)
    return found


_AGAINST = " (against the rest of the model)"


class Gate:
    """The verdict on the model's time (``model``) and, for modules of ``MIN_SHARE`` to ``MAX_SHARE`` % of the
    model's median in A, on each of theirs relative to the rest of the model (``modules``, in A's order)."""

    def __init__(self, a: Profile, b: Profile, limit: float, by: str = "total") -> None:
        if by not in PASSES:
            raise ValueError(f"by must be one of {', '.join(PASSES)}, got {by!r}")
        if not math.isfinite(limit) or limit < 0:
            raise ValueError(f"the limit must be a finite percentage >= 0, got {limit}")
        spread_a, spread_b = model_spread(a, by), model_spread(b, by)
        if spread_a is None or spread_b is None or spread_a.median <= 0:
            missing = "A" if spread_a is None or spread_a.median <= 0 else "B"
            hint = ("profile it with backward (the loss's .backward() inside the block), or gate on --by forward"
                    if by == "backward" else "profile at least one step that calls the model")
            raise ValueError(f"profile {missing} holds no {by} time to compare: {hint}")
        self.by, self.limit = by, limit
        self.model = Verdict(None, spread_a, spread_b, limit)
        self.modules: list[Verdict] = []
        if min(spread_a.steps, spread_b.steps) < MIN_MODULE_STEPS:
            return
        for name, record in a.records.items():
            other = b.records.get(name)
            if not name or other is None or other.type != record.type:
                continue
            module_a, module_b = module_spread(record, by), module_spread(other, by)
            if module_a is None or module_b is None:
                continue
            if not MIN_SHARE <= 100.0 * module_a.median / spread_a.median <= MAX_SHARE:
                continue
            rest_a, rest_b = spread_a.median - module_a.median, spread_b.median - module_b.median
            if rest_b <= 0:
                continue
            self.modules.append(Verdict(name, _per(module_a, rest_a), _per(module_b, rest_b), limit,
                                        (module_a.median, module_b.median)))

    def slower_modules(self) -> list[Verdict]:
        """Modules slower beyond the limit and the noise, innermost only (a parent of one is left out: its
        change is its child's), the largest increase first."""
        slower = [verdict for verdict in self.modules if verdict.slower]
        names = [verdict.name or "" for verdict in slower]
        innermost = [v for v in slower if not any(other.startswith(f"{v.name}.") for other in names)]
        return sorted(innermost, key=lambda v: v.times[1] - v.times[0] if v.times else 0.0, reverse=True)

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
            return f"FAIL: {who}: {head}" + (f"; slower{_AGAINST}: {named}{more}" if named else "")
        if model.change > self.limit:
            return f"ok: {head}: the change is within the noise of the two profiles, not a regression"
        return f"ok: {head}" + (f"; slower{_AGAINST} beyond the limit but not gated (add --per-module): "
                                f"{named}{more}" if named else "")
