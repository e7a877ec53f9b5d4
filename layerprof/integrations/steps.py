"""Steps of a training framework: a training step, then the gap until the next one, then a step..."""
from __future__ import annotations

from ..collect.schedule import Action, Schedule

__all__ = ["GapSchedule"]


class GapSchedule:
    """A LayerProf schedule over steps that alternate training step, gap, training step, ...: the gaps (evaluation,
    logging, data loading between steps) have their hooks off, so they cost nothing and are never recorded;
    training step ``k`` (LayerProf step ``2k``) follows ``per_step``, or is recorded when there is none."""

    def __init__(self, per_step: Schedule | None = None) -> None:
        # Kept as its fields, which the profile's meta shows (``vars(schedule)``), and rebuilt when asked.
        self.per_step = None if per_step is None else dict(vars(per_step))

    def __call__(self, step: int) -> Action:
        if step % 2:
            return Action.NONE
        return Action.RECORD if self.per_step is None else Schedule(**self.per_step)(step // 2)
