"""Calibrations on one CPU thread.

The host figures layerprof measures once per process (the profiler's hooks per module call, the checkpoint
wrapper's cost, the live-bytes reader's per op) are Python on the calling thread: the thread count does not change
them. Timed at several threads, a host whose cores are busy (data-loader workers, other jobs) adds the ops' thread
barriers to them: on a 2-core VM at a load of 9, two threads took the wrapper's calibration 30 s and read 0 ms a
call, and the hooks' 22 s, where one thread took 8 and 1 s and read what an idle host reads. So each calibration
runs on one thread, and the caller's count is put back after it.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["one_thread"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """``torch.set_num_threads(1)`` for the block, the caller's count restored after it, even where it raised."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
