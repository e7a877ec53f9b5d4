"""Calibrations on one CPU thread.

The host figures layerprof measures once per process (the profiler's hooks per module call, the checkpoint
wrapper's cost, the live-bytes reader's per op) are Python on the calling thread: the thread count does not change
them. Timed at several threads, a host whose cores are busy (data-loader workers, other jobs) adds the ops' thread
barriers to them: on a 2-core VM at a load of 9, two threads took the wrapper's calibration 30 s and read 0 ms a
call, and the hooks' 22 s, where one thread took 8 and 1 s and read what an idle host reads. So each calibration
runs on one thread, and the caller's count is put back after it. The count is the process's: calibrations of two
threads take turns (a lock), so that neither puts back the other's 1, and each calibration looks in its cache again
once it holds the lock (``calibrated``), so that two threads do not measure one figure twice. Other threads' torch
ops run on one thread while a calibration runs (a few seconds, once per process).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch

__all__ = ["one_thread", "calibrated"]

_TURN = threading.RLock()  # one calibration at a time in the process (re-entrant: one may call another)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """``torch.set_num_threads(1)`` for the block, the caller's count restored after it, even where it raised; one
    such block at a time in the process."""
    with _TURN:
        threads = torch.get_num_threads()
        if threads == 1:
            yield
            return
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def calibrated(cache: dict[Any, Any], key: Any, measure: Callable[[], Any]) -> Any:
    """``cache[key]``, measured by ``measure()`` on one thread where it is not there yet (looked up again once this
    thread's turn has come: another thread may have measured it meanwhile)."""
    found = cache.get(key)
    if found is None:
        with one_thread():
            found = cache.get(key)
            if found is None:
                found = cache[key] = measure()
    return found
