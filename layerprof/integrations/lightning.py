"""PyTorch Lightning: ``Trainer(profiler=LayerProfProfiler())`` profiles the LightningModule module by module.

Each ``run_training_batch`` action (the forward, backward and optimizer step of one batch) is one layerprof step;
the time between batches (validation, logging, data loading) is a step with the hooks off, so it costs nothing
and is never recorded. ``schedule`` (``layerprof.schedule(wait=, warmup=, active=, repeat=)``) counts the training's
batches, those before a checkpoint that ``fit(ckpt_path=...)`` resumes from included.
The LightningModule (the root) is timed over ``training_step``, up to the loss, and the trainer's backward call,
whether ``training_step`` calls ``self(x)`` or ``self.net(x)``.

At the end of the run each rank writes ``<filename>-rank<k>.json`` (``layerprof show`` reads it) and
``<filename>-rank<k>.txt`` (the annotated summary) into ``dirpath``, by default the trainer's log dir, and rank 0
logs one line saying where (``profiler.summary()`` returns the summary, to print once); a later
``fit`` is profiled too, into ``<filename>-rank<k>-<n>.json`` for the n-th, or past the highest number already in
``dirpath`` (a new profiler over an earlier run's files writes beside them, not over them). A run that ends
on an exception or an interrupt takes every hook off at once and writes the batches completed before it as a
partial profile (``meta["partial"]`` says why): the profiler's actions see an exception in a batch or between
batches, and a callback it adds to the trainer (``on_exception``) one outside the epoch's batches (an epoch's end
hooks, ``on_train_end``). Needs ``lightning`` (``pip install lightning``).
"""
from __future__ import annotations

import os
import re
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterable

from ..collect.profiler import LayerProf
from ..collect.schedule import Schedule
from ..collect.stepcall import RootStep
from ..distributed.comm import time_ddp_wrapper
from ..profile import Profile
from ..render.units import format_counted
from ._optional import require
from .steps import (GapSchedule, checked_options, next_run, run_stem, steps_done, write_profile_files,
                    written_or_warned)

_profilers = require("lightning.pytorch.profilers", "lightning", "layerprof.integrations.lightning")
_callbacks = require("lightning.pytorch.callbacks", "lightning", "layerprof.integrations.lightning")

__all__ = ["LayerProfProfiler"]

ACTION = "run_training_batch"
EPOCH = "run_training_epoch"  # around every batch, and the gaps between them (fetching, validation)
_STOPPED = "the trainer stopped without ending the profile"


def _watched(action_name: str) -> bool:
    return action_name in (ACTION, EPOCH) or (action_name.startswith("[Strategy]")
                                             and action_name.endswith(".training_step"))


class _EndOnException(_callbacks.Callback):
    """Ends its profiler's profile when the run raises: Lightning tells its callbacks (not its profiler) of an
    exception, and outside the training epoch's batches (``on_train_epoch_end``, a scheduler stepped at an epoch's
    end, ``on_train_end``) no action of the profiler sees it. It also tells the profiler when training is over
    (``on_train_end``): until then no batch is known to be the last, and ``summary()`` leaves the profile running."""

    def __init__(self, profiler: LayerProfProfiler) -> None:
        self.profiler = profiler

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.profiler._training_over = True  # (first of the callbacks: a summary() in a later one ends the profile)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.profiler._prof is not None:  # else: ended by the action it was raised in, or never begun
            self.profiler._finish(partial=f"{type(exception).__name__} raised outside the training epoch's batches",
                                  error=exception)


def _checked_stem(filename: Any) -> str:
    """The files' stem: a non-empty name without a folder in it; None for the default, as Lightning's own take."""
    if filename is None or filename == "":
        return "layerprof"
    if (not isinstance(filename, str) or os.sep in filename or (os.altsep or os.sep) in filename
            or "\0" in filename):
        raise ValueError(f"LayerProfProfiler: filename must be a file name stem such as 'layerprof' (no folder: "
                         f"give the folder as dirpath), or None, got {filename!r}")
    return filename


def _batches_done(trainer: Any) -> int:
    """The training batches the trainer ran before this one: 0 in a new run, those of the checkpoint in a run
    resumed with ``fit(ckpt_path=...)`` (its loop's progress, restored with it), so that the schedule counts the
    batches of the whole training, as an uninterrupted run does."""
    progress = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "batch_progress", None)
    return steps_done(getattr(getattr(progress, "total", None), "completed", 0))


class LayerProfProfiler(_profilers.Profiler):
    """A Lightning profiler that runs LayerProf on ``trainer.lightning_module``, one step per training batch.

    Args:
        dirpath: where the files go; default: the trainer's log dir.
        filename: the files' stem: ``<filename>-rank<k>.json`` and ``.txt``.
        schedule: a ``layerprof.schedule(...)`` over training batches.
        metrics: meters beside timing, as for ``LayerProf(model, metrics=...)``.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = "layerprof",
                 schedule: Schedule | None = None, metrics: Iterable[str] | None = None) -> None:
        # Checked once the object is whole: a half-made one's __del__ (Lightning's teardown) reads these.
        super().__init__(dirpath=None, filename="layerprof")
        self.schedule: Schedule | None = None
        self.metrics: tuple[str, ...] | None = None
        self._prof: LayerProf | None = None
        self._root: RootStep | None = None
        self._handling: dict[str, BaseException | None] = {}  # per watched action, the exception handled at its start
        self._trainer: Any = None  # a weak reference to the trainer of the run being profiled
        self._training_over = False  # the run's training ended (on_train_end began): no batch follows
        self._rank = 0
        self._run = 1  # the number of the run being profiled, in its files' names
        self.profiles: list[Profile] = []  # one per run (fit) that recorded a batch, in order
        self.profile_result: Profile | None = None  # the last of them
        self.paths: list[Path] = []
        self.dirpath, self.schedule, self.metrics = checked_options("LayerProfProfiler", "dirpath", dirpath,
                                                                    schedule, metrics)
        self._given_dirpath = self.dirpath  # None: each run's trainer's log dir (Lightning's setup sets it)
        self.filename = _checked_stem(filename)

    def _module(self) -> Any:
        proxy = getattr(self, "_lightning_module", None)  # a weakref proxy, set by the trainer before setup
        if proxy is None:
            raise RuntimeError("LayerProfProfiler runs inside a Trainer: Trainer(profiler=LayerProfProfiler())")
        trainer = proxy.trainer
        self._rank = int(getattr(trainer, "global_rank", 0))
        self._trainer = weakref.ref(trainer)
        return trainer.lightning_module  # the module itself: LayerProf keys its hooks by module

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """A run begins (Lightning calls it): a profile left running by an earlier run that raised ends first."""
        # Lightning's setup keeps a dirpath already set: without one given, each run's log dir (not the first's),
        # unless the user set one by hand since the last run.
        from_log_dir = getattr(self, "_from_log_dir", None)
        if from_log_dir is not None and self.dirpath == from_log_dir:
            self.dirpath = getattr(self, "_given_dirpath", None)
        before = self.dirpath
        super().setup(stage, local_rank=local_rank, log_dir=log_dir)
        self._from_log_dir = self.dirpath if not before and self.dirpath else None
        if self._prof is not None:
            self._finish(partial=_STOPPED)
        proxy = getattr(self, "_lightning_module", None)
        callbacks = proxy.trainer.callbacks if proxy is not None else None
        if callbacks is not None and not any(isinstance(c, _EndOnException) for c in callbacks):
            callbacks.insert(0, _EndOnException(self))  # first: a user's on_exception that raises skips the rest

    def _raised(self, action_name: str) -> BaseException | None:
        """The exception leaving this action, if it raised: ``stop`` runs in the action's ``finally``, where
        ``sys.exc_info()`` holds it; an exception that was being handled when the action began (a fit run from
        an ``except`` block, retrying) is not the action's."""
        error = sys.exc_info()[1]
        return None if error is None or error is self._handling.pop(action_name, None) else error

    def start(self, action_name: str) -> None:
        if _watched(action_name):
            self._handling[action_name] = sys.exc_info()[1]
        if action_name == ACTION:
            if self._prof is None:
                self._begin()
            elif self._prof.running:  # not cancelled by hand (LayerProf.running_on(model).cancel())
                self._prof.step()  # the gap since the last batch ends; this batch begins
        elif self._root is not None:
            # The root's backward: the strategy's backward call, less the hooks that Lightning runs around the
            # backward pass inside it (on_before_backward, on_after_backward), which are Lightning's time.
            if action_name.startswith("[Strategy]") and action_name.endswith(".training_step"):
                self._root.forward_begins()
            elif action_name.startswith("[Strategy]") and action_name.endswith(".backward"):
                self._root.backward_begins()
            elif action_name.endswith(".on_after_backward"):
                self._root.backward_ends()

    def stop(self, action_name: str) -> None:
        if self._prof is None:
            return
        if action_name in (ACTION, EPOCH):
            error = self._raised(action_name)
            if error is not None and not isinstance(error, StopIteration):
                where = "a training batch" if action_name == ACTION else "the training epoch, between batches"
                self._finish(partial=f"{type(error).__name__} raised in {where}", error=error)
            elif action_name == ACTION and self._prof.running:
                assert self._root is not None
                self._root.fold()
                self._prof.step()  # this batch ends; the gap until the next one begins, hooks off
        elif self._root is not None:
            if action_name.startswith("[Strategy]") and action_name.endswith(".training_step"):
                self._root.forward_ends(failed=self._raised(action_name) is not None)
            elif action_name.endswith(".on_before_backward"):
                self._root.backward_begins()  # the backward pass begins after the last of these hooks
            elif action_name.startswith("[Strategy]") and action_name.endswith(".backward"):
                self._root.backward_ends()

    def _begin(self) -> None:
        module = self._module()
        trainer = self._trainer() if self._trainer is not None else None
        prof = LayerProf(module, metrics=self.metrics, schedule=GapSchedule.around(self.schedule,
                                                                                   _batches_done(trainer)))
        prof._give_way = self._give_way
        self._training_over = False
        # Under DDP the strategy trains a DistributedDataParallel of the LightningModule: the ddp_comm meter times it.
        time_ddp_wrapper(prof.metrics, getattr(getattr(trainer, "strategy", None), "model", None))
        prof.start()
        self._prof, self._root = prof, prof.root_step()
        # Numbered as the run begins, by every rank alike: at its end one rank's files could already be there.
        self._run = max(len(self.profiles) + 1, next_run(self._folder(), rf"{re.escape(self.filename)}-rank[0-9]+"))

    def _folder(self) -> Path:
        return Path(self.dirpath if self.dirpath is not None else os.getcwd())

    def _still_training(self) -> bool:
        """Whether the run being profiled may still train batches: its trainer runs, before ``on_train_end``."""
        trainer = self._trainer() if self._trainer is not None else None
        status = getattr(getattr(trainer, "state", None), "status", None)
        return not self._training_over and status is not None and getattr(status, "value", status) == "running"

    def _give_way(self) -> bool:
        """A new profiler wants the model: end this one if its trainer is no longer running (it stopped on an
        exception that neither an action of this profiler nor its trainer's ``on_exception`` told it of)."""
        trainer = self._trainer() if self._trainer is not None else None
        status = getattr(getattr(trainer, "state", None), "status", None)
        if status is not None and getattr(status, "value", status) == "running":
            return False
        self._finish(partial=_STOPPED)
        return True

    def _finish(self, partial: str | None = None, error: BaseException | None = None) -> None:
        """End the profile; ``error``: the exception that ended the run, which gets layerprof's notes (the module
        whose backward raised it) as it goes on to the user."""
        prof, self._prof, self._root = self._prof, None, None
        self._trainer = None  # a weak reference does not pickle (ddp_spawn pickles the profiler for the next run)
        if prof is None or not prof.running:
            return
        prof.stop(partial=partial, error=error)
        try:
            profile = prof.profile
        except RuntimeError:  # nothing recorded before the run ended
            return
        if not profile.meta.get("steps"):  # a schedule whose active batches the run never reached: no profile
            return
        profile.meta["lightning"] = {"rank": self._rank, "step": "run_training_batch"}
        self.profiles.append(profile)
        self.profile_result = profile
        stem = run_stem(self._folder(), f"{self.filename}-rank{self._rank}", self._run)
        self.paths = written_or_warned("LayerProfProfiler", "profiler.profiles",
                                       lambda: write_profile_files(profile, stem))

    def summary(self) -> str:
        """The annotated summary of the last run's profiled batches ("" before any batch ran). Called while the
        trainer is still training (from a callback at an epoch's end), it is the last finished run's ("" in the
        first), with a warning: ending the running profile there would split the run into two profiles."""
        if self._prof is not None:
            if self._still_training():
                warnings.warn("LayerProfProfiler.summary() was called while the trainer is still training: this "
                              "run's profile is made when its training ends, and ending it here would split the run "
                              "in two. It returns the last finished run's summary (\"\" before the first ends); call "
                              "it after trainer.fit returns (or from an on_train_end hook)", RuntimeWarning,
                              stacklevel=2)
            else:
                self._finish()
        if self.profile_result is None:
            return ""
        return self.profile_result.layerwise_summary(footer=True)

    def describe(self) -> None:
        """End of the run (Lightning calls it): stop profiling, write the files, and log on rank 0 where they
        are. The summary itself is not logged: a script that prints ``profiler.summary()`` would show it twice."""
        runs = len(self.profiles)
        if self._prof is not None:
            self._finish()
        if len(self.profiles) > runs and self.profile_result is not None and self.paths:  # recorded, written
            json_path, text_path = self.paths
            batches = format_counted(self.profile_result.meta.get("steps") or 0, "training batch", "training batches")
            self._rank_zero_info(f"layerprof: {batches} profiled; the summary is in {text_path} "
                                 f"(profiler.summary() returns it), the profile in {json_path} (layerprof show reads it)")
        self.teardown(stage=self._stage)

    def __del__(self) -> None:
        # Lightning's __del__ tears down; a profiler whose __init__ never ran (an unknown argument: the TypeError
        # has told the user) has nothing to tear down, and would add an AttributeError's traceback to that.
        ending = getattr(super(), "__del__", None)
        if ending is not None and hasattr(self, "_stage"):
            ending()

    def teardown(self, stage: str | None) -> None:
        if self._prof is not None:
            self._finish()
        super().teardown(stage)
