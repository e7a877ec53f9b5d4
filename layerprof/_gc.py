"""Garbage collection paused while layerprof makes or reads thousands of its own objects (collecting, saving,
loading), shared by the layers that do."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection while layerprof builds or reads its own records: the thousands of objects a large
    model's records take would trigger full collections (over the whole heap, the model's tensors included) that
    cost more than the work itself. Collection resumes as it was; nothing is collected here (collecting the young
    generation on the way out was tried: it promotes the live records, whose tree is a reference cycle, to older
    generations, where dropped profiles then wait for a rare full collection: 20 KB kept per one-shot profile)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
