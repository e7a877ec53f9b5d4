"""Hugging Face Trainer: ``Trainer(..., callbacks=[LayerProfCallback()])`` profiles the model module by module.

A step is one optimizer step with all its micro-batches (``on_step_begin`` fires on the first micro-batch
only, ``on_step_end`` after the optimizer step); the time between steps (evaluation, logging, saving) is a step
with the hooks off, never recorded. ``schedule`` (``layerprof.schedule(...)``) counts the training's optimizer steps
(``state.global_step``: those before a checkpoint that ``train(resume_from_checkpoint=...)`` resumes from
included). At the end of training, ``layerprof.json`` and ``layerprof.txt`` (the annotated summary) go to
``output_dir`` (default:
``args.output_dir``), and, when TensorBoard is among ``args.report_to``, the scalars, figures and top table go
to the TensorBoard log folder too (``<output_dir>/runs/layerprof`` unless set). A later ``train()`` with the same
callback is profiled too, into ``layerprof-<n>.json`` for the n-th, or past the highest number already in the
folder (a new callback over an earlier run's files writes beside them, not over them).

The Trainer tells its callbacks nothing when ``train()`` raises. The callback notices that the run is over the
first time anything touches the model or the callback again (the model called, ``callback.profile`` read, another
``train()`` or ``LayerProf`` on the model, the interpreter exiting), and then takes every hook off and writes the
optimizer steps completed before the failure as a partial profile (``meta["partial"]``). Needs ``transformers``
and ``accelerate`` (``pip install transformers accelerate``).
"""
from __future__ import annotations

import atexit
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

from .._torch import add_call_wrapper, compiled_module_type, remove_call_wrapper
from ..collect.compiled import RefusedModel
from ..collect.profiler import LayerProf
from ..collect.schedule import Schedule
from ..distributed.comm import time_ddp_wrapper
from ..profile import Profile
from ._optional import require
from .steps import (GapSchedule, checked_options, next_run, run_stem, steps_done, write_profile_files,
                    written_or_warned)

_transformers = require("transformers", "transformers", "layerprof.integrations.transformers")

__all__ = ["LayerProfCallback"]

_OVER = "Trainer.train() ended before on_train_end: it raised or was interrupted"


def _train_frame() -> Any:
    """The frame of the running ``Trainer.train()`` (callbacks are called from inside it), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "train" and isinstance(frame.f_locals.get("self"), _transformers.Trainer):
            return frame
        frame = frame.f_back
    return None


def _on_a_stack(frame: Any) -> bool:
    """Whether ``frame`` is still executing: on this thread's stack, or another thread's."""
    current = sys._getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    for top in sys._current_frames().values():
        while top is not None:
            if top is frame:
                return True
            top = top.f_back
    return False


def _run_check(callback: weakref.ref, model: weakref.ref) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What makes a call wrapper (``add_call_wrapper``, outermost): a call of the model after the run ended (it
    raised) ends the callback's profile. Around every module call, not a hook on the model: a hook in the model's
    own dict went with every deep copy made during training (an EMA, a best-model snapshot), which kept it after
    the run, and no closure there pickles (``torch.save(model)`` in a callback raised); and not a global module
    hook, which sends every module call of the process down torch's hooked path. It holds weak references only."""

    def make(inner: Callable[..., Any]) -> Callable[..., Any]:
        def check(module: Any, /, *args: Any, **kwargs: Any) -> Any:
            if module is model():
                owner = callback()
                if owner is not None:
                    owner._end_if_over()
            return inner(module, *args, **kwargs)

        return check

    return make


_LIVE: weakref.WeakSet = weakref.WeakSet()  # callbacks, for the partial profiles of runs that raised, at exit


@atexit.register
def _end_runs_at_exit() -> None:
    for callback in list(_LIVE):
        callback._end_if_over()


def _tensorboard_dir(args: Any) -> str:
    """Where the Trainer's TensorBoard logs go: ``args.logging_dir`` (transformers 4), ``$TENSORBOARD_LOGGING_DIR``,
    else beside the Trainer's own runs, ``<output_dir>/runs/layerprof`` (one TensorBoard over ``runs`` shows both)."""
    return (getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
            or os.path.join(args.output_dir, "runs", "layerprof"))


def _refuse_compiled_training(args: Any) -> None:
    """Refuse a Trainer that compiles its model, before the first step. Its callbacks get the eager model while
    it trains a ``torch.compile`` wrapper of it, so dynamo would trace layerprof's hooks: graphs broken and
    recompiled at every hook, compilation counted as forward time (seconds per module), no error."""
    if getattr(args, "torch_compile", False):
        raise ValueError(
            "LayerProfCallback cannot profile a Trainer that compiles its model (TrainingArguments(torch_compile=True), "
            "also set by torch_compile_backend or torch_compile_mode): dynamo would trace layerprof's hooks, breaking "
            "the compiled graphs, and the times would include compilation. Profile with torch_compile=False (the "
            "eager model's module times), or train compiled without the callback.")


def _refuse_compiled_model(model: Any) -> None:
    """Refuse, before the first step, a Trainer handed a ``torch.compile``'d model (``Trainer(model=torch.compile(
    model))``): compiled graphs skip module hooks. LayerProf's own refusal, at the first step, told to profile
    ``LayerProf(compiled._orig_mod)``, which a Trainer's user does not write."""
    compiled = compiled_module_type()
    if compiled is not None and isinstance(model, compiled):
        inner = getattr(model, "_orig_mod", None)
        raise RefusedModel(
            f"LayerProfCallback cannot profile a Trainer handed a torch.compile'd model ({type(inner).__name__}): "
            "compiled graphs skip module hooks, so no module of it could be timed. Hand the Trainer the eager model "
            "(Trainer(model=model), not torch.compile(model)) to profile it, or train compiled without the callback.")


class LayerProfCallback(_transformers.TrainerCallback):
    """A TrainerCallback that runs LayerProf over the training steps.

    Args:
        output_dir: where the files go; default: the Trainer's ``args.output_dir``.
        schedule: a ``layerprof.schedule(...)`` over optimizer steps.
        metrics: meters beside timing, as for ``LayerProf(model, metrics=...)``.
    """

    def __init__(self, output_dir: str | Path | None = None, schedule: Schedule | None = None,
                 metrics: Iterable[str] | None = None) -> None:
        self.output_dir, self.schedule, self.metrics = checked_options(
            "LayerProfCallback", "output_dir", output_dir, schedule, metrics)
        self._prof: LayerProf | None = None
        self._run: Any = None  # the frame of the Trainer.train() being profiled
        self._context: tuple[Any, Any] | None = None  # its (args, state)
        self._check: Any = None  # the call wrapper that notices when the run is over (add_call_wrapper's key)
        self._profiles: list[Profile] = []
        self.paths: list[Path] = []
        _LIVE.add(self)

    @property
    def profile(self) -> Profile | None:
        """The last run's profile; None before a run recorded a step. A run that raised gives its partial one."""
        self._end_if_over()
        return self._profiles[-1] if self._profiles else None

    @property
    def profiles(self) -> list[Profile]:
        """One profile per ``train()`` that recorded a step, in order."""
        self._end_if_over()
        return list(self._profiles)

    def _trainer(self) -> Any:
        """The Trainer whose train() is being profiled (its frame's ``self``), or None."""
        return self._run.f_locals.get("self") if self._run is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is not None:  # an earlier run (or attempt, with auto_find_batch_size) that raised
            self._finish(partial=_OVER)
        _refuse_compiled_training(args)
        _refuse_compiled_model(kwargs.get("model"))
        self._run, self._context = _train_frame(), (args, state)
        handler = getattr(self._trainer(), "callback_handler", None)
        ours = [c for c in getattr(handler, "callbacks", ()) if isinstance(c, LayerProfCallback)]
        if len(ours) > 1:
            self._run = self._context = None
            raise ValueError(f"a Trainer takes one LayerProfCallback, and this one has {len(ours)}: a model is "
                             "profiled by one LayerProf at a time. Keep one (give it every option you need)")

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._prof is None:
            if self._context is None or model is None:
                return  # outside a train() this callback saw begin
            # The schedule counts the training's optimizer steps: a run resumed from a checkpoint
            # (resume_from_checkpoint) begins at the global step restored with it, and profiles the steps an
            # uninterrupted run would.
            first = steps_done(getattr(state, "global_step", 0))
            prof = LayerProf(model, metrics=self.metrics, schedule=GapSchedule.around(self.schedule, first))
            prof._give_way = self._give_way
            # Under torchrun the Trainer trains a DistributedDataParallel of the model: the ddp_comm meter times it.
            time_ddp_wrapper(prof.metrics, getattr(self._trainer(), "model_wrapped", None))
            prof.start()
            self._prof = prof
            self._check = add_call_wrapper(_run_check(weakref.ref(self), weakref.ref(model)), outermost=True)
        elif self._prof.running:  # not cancelled by hand (LayerProf.running_on(model).cancel())
            self._prof.step()  # the gap since the last optimizer step ends

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is not None and self._prof.running:
            self._prof.step()  # the optimizer step is done; hooks off until the next one

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish()

    def _end_if_over(self) -> None:
        """If the train() being profiled is no longer running (it raised), end its profile as partial."""
        if self._run is not None and not _on_a_stack(self._run):
            self._finish(partial=_OVER)

    def _give_way(self) -> bool:
        """A new profiler wants the model: this one ends if its run is over."""
        self._end_if_over()
        return self._prof is None

    def _finish(self, partial: str | None = None) -> None:
        prof, self._prof, self._run = self._prof, None, None
        context, self._context = self._context, None
        if self._check is not None:
            remove_call_wrapper(self._check)
            self._check = None
        if prof is None or context is None or not prof.running:
            return
        prof.stop(partial=partial)
        try:
            profile = prof.profile
        except RuntimeError:  # the run ended before a step was recorded
            return
        if not profile.meta.get("steps"):  # a schedule whose active steps the run never reached: no profile
            return
        args, state = context
        profile.meta["transformers"] = {"step": "optimizer step",
                                        "gradient_accumulation_steps": args.gradient_accumulation_steps,
                                        "global_step": state.global_step}
        self._profiles.append(profile)
        if state.is_world_process_zero:
            self._write(profile, args, state)

    def _write(self, profile: Profile, args: Any, state: Any) -> None:
        folder = Path(self.output_dir if self.output_dir is not None else args.output_dir)
        run = max(len(self._profiles), next_run(folder, "layerprof"))  # (world process zero alone writes)
        stem = run_stem(folder, "layerprof", run)
        self.paths = written_or_warned("LayerProfCallback", "callback.profiles",
                                       lambda: write_profile_files(profile, stem))
        report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
        if self.paths and ("tensorboard" in report_to or "all" in report_to):  # (after the pair, or not at all)
            logdir = Path(_tensorboard_dir(args))

            def board() -> list[Path]:
                profile.to_tensorboard(logdir, step=state.global_step)
                return [logdir]

            self.paths += written_or_warned("LayerProfCallback", "callback.profiles (its files are in "
                                            f"{self.paths[0].parent})", board)
