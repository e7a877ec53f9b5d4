"""Clocks that stamp module boundaries: wall clock on CPU, CUDA events (or synchronized wall clock) on GPU.

A clock hands out opaque stamps in the hooks and turns pairs of stamps into milliseconds only after the step,
so that no hook waits for the GPU unless ``sync=True`` asks for it.
"""
from __future__ import annotations

from time import perf_counter_ns
from typing import Any

import torch

__all__ = ["Clock", "CpuClock", "CudaEventClock", "CudaSyncClock", "make_clock"]


class Clock:
    """Stamps instants on one device; ``ms(a, b)`` is the time from stamp ``a`` to stamp ``b``."""

    kind = "abstract"
    device = "cpu"

    def __init__(self) -> None:
        self.origin = self.now()

    def now(self) -> Any:
        raise NotImplementedError

    def ms(self, start: Any, end: Any) -> float:
        raise NotImplementedError

    def offset_ms(self, stamp: Any) -> float:
        """Milliseconds from the clock's creation (the start of profiling) to ``stamp``."""
        return self.ms(self.origin, stamp)

    def settle(self) -> None:
        """Make every stamp handed out so far readable (a no-op except for CUDA events)."""


class CpuClock(Clock):
    """Wall clock. ``perf_counter_ns`` rather than ``process_time``: the latter bills every thread's CPU and misses waits."""

    kind = "wall"

    def now(self) -> int:
        return perf_counter_ns()

    def ms(self, start: int, end: int) -> float:
        return (end - start) / 1e6


class CudaEventClock(Clock):
    """CUDA events recorded on the current stream; read once after the step, never synchronized in a hook."""

    kind = "cuda_event"

    def __init__(self, device: torch.device) -> None:
        self.device = str(device)
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        super().__init__()

    def now(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._index))
        return event

    def ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end))

    def settle(self) -> None:
        torch.cuda.synchronize(self._index)


class CudaSyncClock(CpuClock):
    """Wall clock after ``torch.cuda.synchronize`` at every boundary (``LayerProf(sync=True)``): exact, slower."""

    kind = "cuda_sync"

    def __init__(self, device: torch.device) -> None:
        self.device = str(device)
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        super().__init__()

    def now(self) -> int:
        torch.cuda.synchronize(self._index)
        return perf_counter_ns()


def make_clock(device: torch.device, sync: bool) -> Clock:
    """The clock for tensors on ``device``; ``cuda`` and ``cuda:0`` name the same clock only once normalized."""
    if device.type == "cuda":
        return CudaSyncClock(device) if sync else CudaEventClock(device)
    return CpuClock()
