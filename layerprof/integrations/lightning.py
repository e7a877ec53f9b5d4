"""PyTorch Lightning: ``Trainer(profiler=LayerProfProfiler())`` profiles the LightningModule module by module.

Each ``run_training_batch`` action (the forward, backward and optimizer step of one batch) is one layerprof step;
the time between batches (validation, logging, data loading) is a step with the hooks off, so it costs nothing
and is never recorded. ``schedule`` (``layerprof.schedule(wait=, warmup=, active=, repeat=)``) counts batches.
At the end of the run each rank writes ``<filename>-rank<k>.json`` (``layerprof show`` reads it) and
``<filename>-rank<k>.txt`` (the annotated summary) into ``dirpath``, by default the trainer's log dir.
Needs ``lightning`` (``pip install "layerprof[lightning]"``).
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

_profilers = require("lightning.pytorch.profilers", "lightning", "layerprof.integrations.lightning")

__all__ = ["LayerProfProfiler"]

ACTION = "run_training_batch"


class LayerProfProfiler(_profilers.Profiler):
    """A Lightning profiler that runs LayerProf on ``trainer.lightning_module``, one step per training batch.

    Args:
        dirpath: where the files go; default: the trainer's log dir.
        filename: the files' stem: ``<filename>-rank<k>.json`` and ``.txt``.
        schedule: a ``layerprof.schedule(...)`` over training batches.
        metrics: meters beside timing, as for ``LayerProf(model, metrics=...)``.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str = "layerprof",
                 schedule: Schedule | None = None, metrics: Iterable[str] | None = None) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.schedule = schedule
        self.metrics = None if metrics is None else tuple(metrics)
        self._prof: LayerProf | None = None
        self._rank = 0
        self.profile_result: Profile | None = None
        self.paths: list[Path] = []

    def _module(self) -> Any:
        proxy = getattr(self, "_lightning_module", None)  # a weakref proxy, set by the trainer before setup
        if proxy is None:
            raise RuntimeError("LayerProfProfiler runs inside a Trainer: Trainer(profiler=LayerProfProfiler())")
        trainer = proxy.trainer
        self._rank = int(getattr(trainer, "global_rank", 0))
        return trainer.lightning_module  # the module itself: LayerProf keys its hooks by module

    def start(self, action_name: str) -> None:
        if action_name != ACTION:
            return
        if self._prof is None:
            if self.profile_result is not None:
                return  # a later stage (another fit) of the same profiler: the first profile stands
            self._prof = LayerProf(self._module(), metrics=self.metrics,
                                   schedule=GapSchedule.around(self.schedule))
            self._prof.start()
        else:
            self._prof.step()  # the gap since the last batch ends; this batch begins

    def stop(self, action_name: str) -> None:
        if action_name == ACTION and self._prof is not None:
            self._prof.step()  # this batch ends; the gap until the next one begins, hooks off

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.stop()
        self.profile_result = prof.profile
        self.profile_result.meta["lightning"] = {"rank": self._rank, "step": "run_training_batch"}
        dirpath = Path(self.dirpath if self.dirpath is not None else os.getcwd())
        dirpath.mkdir(parents=True, exist_ok=True)
        stem = dirpath / f"{self.filename}-rank{self._rank}"
        self.profile_result.to_json(stem.with_suffix(".json"))
        stem.with_suffix(".txt").write_text(self.summary() + "\n", encoding="utf-8")
        self.paths = [stem.with_suffix(".json"), stem.with_suffix(".txt")]

    def summary(self) -> str:
        """The annotated summary of the profiled batches ("" before any batch ran)."""
        if self._prof is not None:
            self._finish()
        if self.profile_result is None:
            return ""
        return self.profile_result.layerwise_summary(footer=True)

    def describe(self) -> None:
        """End of the run (Lightning calls it): stop profiling, write the files, log the summary on rank 0."""
        summary = self.summary()
        if summary:
            self._rank_zero_info("layerprof, per training batch:\n%s", summary)
        self.teardown(stage=self._stage)

    def teardown(self, stage: str | None) -> None:
        if self._prof is not None:
            self._finish()
        super().teardown(stage)
