"""Steps of a training framework: a training step, then the gap until the next one, then a step..."""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable

from .._check import check_int, check_names
from .._files import move_all_into_place, temporary_beside
from ..collect.schedule import Action, Schedule
from ..metrics.meter import make_meters
from ..render.units import format_counted

__all__ = ["GapSchedule", "checked_options", "checked_folder", "next_run", "run_stem", "steps_done",
           "write_profile_files", "written_or_warned"]


def checked_options(owner: str, path_name: str, path: Any, schedule: Any,
                    metrics: Iterable[str] | None) -> tuple[Any, Schedule | None, tuple[str, ...] | None]:
    """A framework integration's ``path``, ``schedule`` and ``metrics``, checked as it is made (not at the run's
    first step, or after the run where a schedule given in the path's place was written to): a TypeError or
    ValueError naming the argument, as ``LayerProf`` raises for its own."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        hint = " (a schedule goes by name: schedule=layerprof.schedule(...))" if isinstance(path, Schedule) else ""
        raise TypeError(f"{owner}: {path_name} must be a directory (a str or os.PathLike) or None, got "
                        f"{type(path).__name__}{hint}")
    if path is not None:
        if isinstance(path, str):
            path = os.path.expanduser(path)  # ("~/prof", as TrainingArguments' output_dir)
        checked_folder(owner, path_name, path)
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
    The run's training step ``k`` (LayerProf step ``2k``) is the trainer's step ``first + k``, which follows the
    schedule's own fields (``wait``, ``warmup``, ...), or is recorded when ``every_step``: ``first``, the trainer's
    steps done before the run began, is how a run resumed from a checkpoint profiles the steps an uninterrupted run
    would. Build one with ``GapSchedule.around(schedule_or_None, first)``."""

    every_step: bool = False
    first: int = 0

    @classmethod
    def around(cls, per_step: Schedule | None, first: int = 0) -> GapSchedule:
        """The gap schedule whose training steps follow ``per_step`` (every one recorded when None), the run's
        first being the trainer's step ``first``."""
        first = check_int("first", first)
        if per_step is None:
            return cls(every_step=True, first=first)
        if not isinstance(per_step, Schedule):
            raise TypeError(
                f"schedule must be a layerprof.schedule(wait=, warmup=, active=, repeat=), got {per_step!r}")
        return cls(**{f.name: getattr(per_step, f.name) for f in fields(Schedule)}, first=first)

    def __call__(self, step: int) -> Action:
        if step % 2:
            return Action.NONE
        return Action.RECORD if self.every_step else super().__call__(self.first + step // 2)

    def no_step_note(self, step_num: int) -> str | None:
        """In the framework's training steps and the user's schedule (LayerProf's own steps count the gaps too);
        None without a schedule of the user's (every step recorded: LayerProf's own words)."""
        if self.every_step:
            return None
        given = {f.name: getattr(self, f.name) for f in fields(Schedule)}
        shown = ", ".join(f"{name}={value}" for name, value in given.items()
                          if value != Schedule.__dataclass_fields__[name].default)
        steps = (step_num + 1) // 2
        training = format_counted(steps, "training step")
        if self.first:  # (resumed: the schedule counts the trainer's steps)
            training += f" (the trainer's {self.first} to {self.first + steps - 1}: it resumed after {self.first})"
        if any(Schedule.__call__(self, step) is Action.RECORD for step in range(self.first, self.first + steps)):
            return (f"LayerProf recorded no training step: every call in the active ones of the run's {training} "
                    f"(layerprof.schedule({shown})) raised.")
        where = "outside" if self.first else "before"
        return (f"LayerProf recorded no training step: the run's {training} all came {where} the schedule's active "
                f"ones (layerprof.schedule({shown})). Run more steps, or change the schedule.")


def checked_folder(owner: str, path_name: str, path: Any) -> None:
    """A ValueError, as the integration is made, for a folder that could never be made or written: a file in the
    way (the folder itself or one above it), or a first existing folder above it that cannot be written. (Found at
    the end of the run it lost the run's profile, and failed a training run that had finished.)"""
    if "\0" in os.fspath(path):
        raise ValueError(f"{owner}: {path_name} {path!r} holds a NUL character, which no path can")
    folder = Path(path)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ValueError(f"{owner}: {path_name} {str(folder)!r} cannot be a folder: {str(existing)!r} is a file; "
                         "give a folder to write the profile into")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{owner}: {path_name} {str(folder)!r} cannot be written ({str(existing)!r} is not "
                         "writable); give a folder to write the profile into")


def steps_done(value: Any) -> int:
    """A trainer's count of the steps it ran before this run (restored from a checkpoint it resumes from), for
    ``GapSchedule.around``: 0 where it is missing or not a positive int (a trainer without the attribute)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def next_run(folder: Path, stem: str) -> int:
    """The number of the next run's files in ``folder``, whose names are ``stem`` (a regular expression: one
    integration's, every rank's) then ``-<n>`` from the second run on, then ``.json`` or ``.txt``: 1 where the folder
    holds none, else one past the highest there. So a new profiler or callback pointed at a folder of an earlier
    run's files (a script run again) writes beside them rather than over them."""
    pattern = re.compile(rf"{stem}(?:-([0-9]+))?\.(?:json|txt)")
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_file()]  # (files: a folder is in the way)
    except OSError:  # no folder yet (made as the files are written), or none to read: no earlier run there
        return 1
    found = [pattern.fullmatch(name) for name in names]
    return max((int(match.group(1) or 1) for match in found if match is not None), default=0) + 1


def run_stem(folder: Path, name: str, run: int) -> Path:
    """The files' path without ``.json``/``.txt``: ``name`` for the first run, ``name-<run>`` after it."""
    return folder / (name + (f"-{run}" if run > 1 else ""))


def write_profile_files(profile: Any, stem: Path) -> list[Path]:
    """The profile's JSON and its annotated summary at ``stem`` + ``.json`` / ``.txt``, both or neither (each
    written beside its target, then both moved into place; an old pair is left as it was where one cannot be)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    targets = [stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".txt")]  # ("exp.v2-rank0.json")
    texts = [profile.to_json(), profile.layerwise_summary(footer=True) + "\n"]
    temporaries: list[Path] = []
    try:
        for target, text in zip(targets, texts):
            temporaries.append(temporary_beside(target))
            temporaries[-1].write_text(text, encoding="utf-8")
        move_all_into_place(list(zip(temporaries, targets)))
    finally:
        for temporary in temporaries:  # (moved ones are gone already)
            temporary.unlink(missing_ok=True)
    return targets


def written_or_warned(owner: str, kept: str, write: Callable[[], list[Path]]) -> list[Path]:
    """``write()``'s paths, or, where it fails (a full disk, a file in the way), none and a warning: the run it
    profiled is done, and its profile is still in ``kept``."""
    try:
        return write()
    except OSError as error:
        left = getattr(error, "left", None)  # (a MoveError whose undo could not put every old file back)
        extra = f" ({'; '.join(left)})" if left else ""
        warnings.warn(f"{owner} could not write the profile's files ({type(error).__name__}: {error}){extra}; the "
                      f"run is not failed for it, and the profile is in {kept}", RuntimeWarning, stacklevel=3)
        return []
