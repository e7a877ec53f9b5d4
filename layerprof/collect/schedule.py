"""Which steps to profile, as torch.profiler's ``schedule``: skip ``wait`` steps, run ``warmup`` steps with hooks
on but results dropped, record ``active`` steps; ``repeat`` cycles (0: forever)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .._check import check_int

__all__ = ["Action", "Schedule", "schedule", "first_recorded"]


class Action(Enum):
    """What a step is for: hooks off (``NONE``), hooks on but dropped (``WARMUP``), recorded (``RECORD``)."""

    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"


@dataclass(frozen=True)
class Schedule:
    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "active", "repeat", "skip_first"):
            check_int(f"schedule {name}", getattr(self, name), minimum=1 if name == "active" else 0)

    def no_step_note(self, step_num: int) -> str | None:
        """The warning for a block that recorded no step after ``step_num`` + 1 steps, where this schedule words
        it better than LayerProf's own (a framework's steps, counted otherwise): None here."""
        return None

    def __call__(self, step: int) -> Action:
        """The action for step number ``step`` (0-based, counted by ``prof.step()``)."""
        if step < self.skip_first:
            return Action.NONE
        step -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step >= cycle * self.repeat:
            return Action.NONE
        position = step % cycle
        if position < self.wait:
            return Action.NONE
        if position < self.wait + self.warmup:
            return Action.WARMUP
        return Action.RECORD


def first_recorded(plan: Schedule) -> int:
    """The number of the first step ``plan`` records (past ``skip_first``, the first cycle's wait and warm-up)."""
    return plan.skip_first + plan.wait + plan.warmup


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0) -> Schedule:
    """A schedule for ``LayerProf(model, schedule=...)``.

    >>> s = schedule(wait=1, warmup=1, active=2, repeat=1)
    >>> [s(i).value for i in range(5)]
    ['none', 'warmup', 'record', 'record', 'none']
    """
    return Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
