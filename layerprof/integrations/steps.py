"""Steps of a training framework: a training step, then the gap until the next one, then a step..."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Iterable

from .._check import check_names
from ..collect.schedule import Action, Schedule
from ..metrics.meter import make_meters

__all__ = ["GapSchedule", "checked_options"]


def checked_options(owner: str, path_name: str, path: Any, schedule: Any,
                    metrics: Iterable[str] | None) -> tuple[Any, Schedule | None, tuple[str, ...] | None]:
    """A framework integration's ``path``, ``schedule`` and ``metrics``, checked as it is made (not at the run's
    first step, or after the run where a schedule given in the path's place was written to): a TypeError or
    ValueError naming the argument, as ``LayerProf`` raises for its own."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        hint = " (a schedule goes by name: schedule=layerprof.schedule(...))" if isinstance(path, Schedule) else ""
        raise TypeError(f"{owner}: {path_name} must be a directory (a str or os.PathLike) or None, got "
                        f"{type(path).__name__}{hint}")
    GapSchedule.around(schedule)  # (a TypeError for anything but a Schedule or None)
    if metrics is None:
        return path, schedule, None
    names = check_names("metrics", metrics, "('flops', 'memory')")
    make_meters(names)  # an unknown or repeated name: a ValueError listing the known ones
    return path, schedule, names


@dataclass(frozen=True)
class GapSchedule(Schedule):
    """A LayerProf schedule over steps that alternate training step, gap, training step, ...: the gaps (evaluation,
    logging, data loading between steps) have their hooks off, so they cost nothing and are never recorded.
    Training step ``k`` (LayerProf step ``2k``) follows the schedule's own fields (``wait``, ``warmup``, ...), or
    is recorded when ``every_step``. Build one with ``GapSchedule.around(schedule_or_None)``."""

    every_step: bool = False

    @classmethod
    def around(cls, per_step: Schedule | None) -> GapSchedule:
        """The gap schedule whose training steps follow ``per_step`` (every one recorded when None)."""
        if per_step is None:
            return cls(every_step=True)
        if not isinstance(per_step, Schedule):
            raise TypeError(
                f"schedule must be a layerprof.schedule(wait=, warmup=, active=, repeat=), got {per_step!r}")
        return cls(**{f.name: getattr(per_step, f.name) for f in fields(Schedule)})

    def __call__(self, step: int) -> Action:
        if step % 2:
            return Action.NONE
        return Action.RECORD if self.every_step else super().__call__(step // 2)
