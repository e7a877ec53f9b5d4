"""Steps of a training framework: a training step, then the gap until the next one, then a step..."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..collect.schedule import Action, Schedule

__all__ = ["GapSchedule"]


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
