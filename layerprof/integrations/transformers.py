"""Hugging Face Trainer: ``Trainer(..., callbacks=[LayerProfCallback()])`` profiles the model module by module.

A step is one optimizer step with all its micro-batches (``on_step_begin`` fires on the first micro-batch
only, ``on_step_end`` after the optimizer step); the time between steps (evaluation, logging, saving) is a step
with the hooks off, never recorded. ``schedule`` (``layerprof.schedule(...)``) counts optimizer steps. At the end
of training, ``layerprof.json`` and ``layerprof.txt`` (the annotated summary) go to ``output_dir`` (default:
``args.output_dir``), and, when TensorBoard is among ``args.report_to``, the scalars, figures and top table go
to the TensorBoard log folder too (``<output_dir>/runs/layerprof`` unless set). Needs ``transformers``
(``pip install "layerprof[transformers]"``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..collect.profiler import LayerProf
from ..collect.schedule import Schedule
from ..profile import Profile
from ._optional import require
from .steps import GapSchedule

_transformers = require("transformers", "transformers", "layerprof.integrations.transformers")

__all__ = ["LayerProfCallback"]


def _tensorboard_dir(args: Any) -> str:
    """Where the Trainer's TensorBoard logs go: ``args.logging_dir`` (transformers 4), ``$TENSORBOARD_LOGGING_DIR``,
    else beside the Trainer's own runs, ``<output_dir>/runs/layerprof`` (one TensorBoard over ``runs`` shows both)."""
    return (getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
            or os.path.join(args.output_dir, "runs", "layerprof"))


class LayerProfCallback(_transformers.TrainerCallback):
    """A TrainerCallback that runs LayerProf over the training steps.

    Args:
        output_dir: where the files go; default: the Trainer's ``args.output_dir``.
        schedule: a ``layerprof.schedule(...)`` over optimizer steps.
        metrics: meters beside timing, as for ``LayerProf(model, metrics=...)``.
    """

    def __init__(self, output_dir: str | Path | None = None, schedule: Schedule | None = None,
                 metrics: Iterable[str] | None = None) -> None:
        self.output_dir = output_dir
        self.schedule = schedule
        self.metrics = None if metrics is None else tuple(metrics)
        self._prof: LayerProf | None = None
        self.profile: Profile | None = None
        self.paths: list[Path] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._prof is None:
            if self.profile is not None or model is None:
                return
            self._prof = LayerProf(model, metrics=self.metrics, schedule=GapSchedule.around(self.schedule))
            self._prof.start()
        else:
            self._prof.step()  # the gap since the last optimizer step ends

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is not None:
            self._prof.step()  # the optimizer step is done; hooks off until the next one

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.stop()
        self.profile = prof.profile
        self.profile.meta["transformers"] = {"step": "optimizer step",
                                             "gradient_accumulation_steps": args.gradient_accumulation_steps,
                                             "global_step": state.global_step}
        if not state.is_world_process_zero:
            return
        folder = Path(self.output_dir if self.output_dir is not None else args.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.profile.to_json(folder / "layerprof.json")
        (folder / "layerprof.txt").write_text(self.profile.layerwise_summary(footer=True) + "\n", encoding="utf-8")
        self.paths = [folder / "layerprof.json", folder / "layerprof.txt"]
        report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
        if "tensorboard" in report_to or "all" in report_to:
            logdir = Path(_tensorboard_dir(args))
            self.profile.to_tensorboard(logdir, step=state.global_step)
            self.paths.append(logdir)
