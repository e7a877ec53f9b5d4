"""Garbage collection paused while layerprof makes or reads thousands of its own objects (collecting, saving,
loading, planning), shared by the layers that do."""
from __future__ import annotations

import gc
from typing import Any

__all__ = ["gc_paused"]


class gc_paused:
    """No garbage collection while layerprof builds or reads its own records: the thousands of objects a large
    model's records take would trigger full collections (over the whole heap, the model's tensors included) that
    cost more than the work itself. Collection resumes as it was; nothing is collected here (collecting the young
    generation on the way out was tried: it promotes the live records, whose tree is a reference cycle, to older
    generations, where dropped profiles then wait for a rare full collection: 20 KB kept per one-shot profile).
    A class, not a ``contextlib.contextmanager``: a block's entry and exit each run it once, right after the step,
    when every line of code they touch is a cache miss (the generator's machinery cost about 6 µs a use on BERT)."""

    __slots__ = ("_enabled",)

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self._enabled:
            gc.enable()
