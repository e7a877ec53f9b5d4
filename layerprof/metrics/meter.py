"""The meter registry: the ``Meter`` base class and one registry of meters, filled by ``register_meter``.

A meter is told when profiling starts and stops, optionally sees every module call's forward hooks (with the
tracker's ``CallTrace``, whose ``name`` is the module's qualified name), and writes numbers onto the records
in ``fill``. Timing itself is not a meter: it is always on.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from torch import nn

from .._check import check_names
from .._torch import dict_version
from ..record.records import ModuleRecord

__all__ = ["Meter", "METERS", "register_meter", "make_meters", "DEFAULT_METRICS", "measures"]


class Meter:
    """Base class of a metric. Override what you need; ``wants_forward_hooks`` says whether the tracker calls
    ``forward_pre``/``forward_post`` (they cost time on every call, so only meters that need them ask)."""

    name = "abstract"
    wants_forward_hooks = False
    # Whether the tracker calls ``backward_start``/``backward_end`` (off by default: the default path stays lean).
    wants_backward_hooks = False
    # A meter that slows the step (dispatch modes, saved-tensor hooks) says so, so timing can stay clean.
    distorts_timing = False
    # A meter that must stop the module clocks while something not the modules' own runs (FSDP's collectives)
    # says so: CPU modules are then stamped with a clock it can pause, handed to it in ``use_clock``.
    pauses_clock = False
    # A meter whose ``start`` reads nothing of the records (it is handed an empty dict) and whose ``fill`` reads
    # only what ``stop`` left in the meter says so: the profiler may then make the records, and fill them, when
    # the profile is first read instead of when the block ends (a one-shot profile never read costs less).
    deferrable = False
    # A meter that is another one with more (``live_memory`` is ``memory`` with the CPU's live bytes) names it:
    # the two may not run together, and what asks for the other is served by this one.
    replaces: str | None = None

    @classmethod
    def needed_by(cls, model: nn.Module) -> bool:
        """Whether ``model``'s times are wrong without this meter, so that it runs even when not asked for
        (the FSDP meter on a ``fully_shard`` model). Called as a ``LayerProf`` is made and again as it starts
        (``fully_shard`` applied in between); keep it cheap."""
        return False

    def use_clock(self, clock: Any) -> None:
        """Only for a meter with ``pauses_clock``: the clock CPU module boundaries are stamped with this profile,
        given before ``start``; ``clock.pause()``/``clock.resume()`` stop it and let it run on."""

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: Sequence[tuple[str, nn.Module]]) -> None:
        """Profiling begins (``__enter__``): hooks are about to go on. ``entries``: every module once, with its
        first name, in ``named_modules()`` order (a sequence of pairs: indexed, iterated, measured with ``len``)."""

    def modules_added(self, entries: Sequence[tuple[str, nn.Module]]) -> None:
        """Modules made while profiling (registered on a profiled module during a forward, such as a lazily built
        head) joined, with their names, before their first call: their records exist from now on."""

    def forward_pre(self, call: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Before a module's forward (only if ``wants_forward_hooks``)."""

    def forward_post(self, call: Any, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        """After a module's forward (only if ``wants_forward_hooks``)."""

    def end_step(self, recorded: bool) -> None:
        """A step ended; ``recorded`` is False for warm-up and unscheduled steps, whose numbers should be dropped."""

    def backward_start(self, calls: Sequence[Any]) -> None:
        """These calls' backward begins: a graph node that is the first of each is about to run (only if
        ``wants_backward_hooks``). One graph node can start several nested calls, hence a list."""

    def backward_end(self, calls: Sequence[Any]) -> None:
        """A graph node that is among the last of each of these calls has run. A call can end at several nodes:
        the last time it is named here is the end of its backward (only if ``wants_backward_hooks``)."""

    def stop(self) -> None:
        """Profiling ends (``__exit__``, also on error): release anything installed in ``start``."""

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        """Write this meter's numbers onto the records, after ``stop``."""

    def meta(self) -> dict[str, Any]:
        """Numbers that belong to the whole run rather than a module; kept in ``profile.meta[self.name]``."""
        return {}

    def explain(self, error: BaseException) -> str | None:
        """What to tell the user about ``error``, raised in a block this meter ran in, where the meter is why it
        was raised (what the meter installs that the code cannot run with, and what to do); None otherwise. The
        profiler adds it to the exception as a note."""
        return None


METERS: dict[str, type[Meter]] = {}

# What LayerProf(model) runs when ``metrics`` is not given: the meters that cost nothing per call.
DEFAULT_METRICS: tuple[str, ...] = ("params",)


def register_meter(cls: type[Meter]) -> type[Meter]:
    """Class decorator: make a meter available as ``LayerProf(model, metrics=(cls.name, ...))``."""
    METERS[cls.name] = cls
    return cls


def _resolve(chosen: Iterable[str]) -> tuple[list[type[Meter]], list[type[Meter]]]:
    """The classes of the meters ``chosen`` names (an unknown name, or two that replace each other, raise), and
    those of the meters not named whose ``needed_by`` is their own (the ones a model may need)."""
    classes = []
    for name in chosen:
        if METERS.get(name) in classes:  # (it would run twice, and be listed twice in the profile's meta)
            raise ValueError(f"metrics: {name!r} is given twice; give each meter once")
        if name not in METERS:
            known = ", ".join(sorted(METERS)) or "(none registered)"
            raise ValueError(f"unknown metric {name!r}; choose from: {known}")
        classes.append(METERS[name])
    named = {cls.name for cls in classes}
    for cls in classes:
        if cls.replaces in named:
            raise ValueError(f"metrics: {cls.name!r} is {cls.replaces!r} with more; give one of them, not both")
    return classes, _needing(named)


def _needing(named: set[str]) -> list[type[Meter]]:
    """The registered meters not in ``named`` whose ``needed_by`` is their own (the ones a model may need)."""
    return [cls for name, cls in METERS.items()
            if name not in named and getattr(cls.needed_by, "__func__", None) is not _NEEDED_BY_NONE]


def _needed(needing: list[type[Meter]], model: nn.Module) -> list[Meter]:
    """A meter of each class of ``needing`` that ``model`` needs."""
    return [cls() for cls in needing if cls.needed_by(model)]


# The registry's version (``dict_version``) and ``_resolve(DEFAULT_METRICS)`` as it read then: a LayerProf made with
# the default meters right after a step reads no name and no registered meter again while the registry is as it was.
_DEFAULT: list[Any] = [None, None]


def make_meters(names: Iterable[str] | None, model: nn.Module | None = None) -> list[Meter]:
    """Instantiate meters by name; an unknown name is a ValueError listing the known ones. With ``model``, the
    meters it needs (``Meter.needed_by``) are added when not named."""
    if names is None:
        version = None if dict_version is None else dict_version(METERS)
        if version is None or _DEFAULT[0] != version:
            _DEFAULT[:] = version, _resolve(DEFAULT_METRICS)
        classes, needing = _DEFAULT[1]
    else:
        classes, needing = _resolve(check_names("metrics", names, "('flops', 'memory')"))
    meters = []
    for cls in classes:
        meters.append(cls())
    if model is not None:
        meters += _needed(needing, model)
    return meters


def meters_needed_since(meters: list[Meter], model: nn.Module) -> list[Meter]:
    """The meters ``model`` needs now (``Meter.needed_by``) that ``meters`` lack: the model changed after its
    LayerProf was made (``fully_shard`` applied after ``LayerProf(model)``)."""
    return _needed(_needing({meter.name for meter in meters}), model)


_NEEDED_BY_NONE = Meter.needed_by.__func__  # (the base's: no model needs the meter; not called)


def measures(meters: Iterable[Meter], name: str) -> bool:
    """Whether one of ``meters`` is the meter ``name`` or one that replaces it."""
    return any(name in (meter.name, meter.replaces) for meter in meters)
