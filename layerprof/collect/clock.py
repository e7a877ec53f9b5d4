"""Clocks that stamp module boundaries: wall clock on CPU, CUDA events (or synchronized wall clock) on GPU.

A clock hands out opaque stamps in the hooks and turns pairs of stamps into milliseconds only after the step,
so that no hook waits for the GPU unless ``sync=True`` asks for it.
"""
from __future__ import annotations

from time import perf_counter_ns
from typing import Any, Callable

import torch

from .._torch import cuda_event_record, cuda_raw_stream

__all__ = ["Clock", "CpuClock", "PausableClock", "CurrentStream", "CudaEventClock", "CudaSyncClock", "host_stamped",
           "make_clock"]


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

    def recycle(self) -> None:
        """The step's stamps have been read: their resources may be reused (CUDA events go back to the pool)."""


class CpuClock(Clock):
    """Wall clock. ``perf_counter_ns`` rather than ``process_time``: the latter bills every thread's CPU and misses waits."""

    kind = "wall"
    # The builtin itself: a stamp in a hook costs no Python frame.
    now = staticmethod(perf_counter_ns)

    def ms(self, start: int, end: int) -> float:
        return (end - start) / 1e6


class PausableClock(CpuClock):
    """A wall clock that can be stopped: while paused it stands still, and afterwards it runs on behind the wall
    clock by the time it stood. Every interval stamped with it then leaves out the paused time, whichever modules
    were open, so work done *for* the profile's subject but not *by* the open modules (FSDP's collectives, run
    from hooks between a module's calls and graph nodes) is in no module's time. Pauses nest; the time is
    counted from the outermost ``pause`` to its ``resume``. A Python method per stamp instead of the builtin:
    used only where something needs to pause it."""

    def __init__(self) -> None:
        self._depth = 0
        self._paused_at = 0
        self._behind_ns = 0  # how far this clock runs behind the wall clock
        super().__init__()

    def now(self) -> int:  # type: ignore[override]
        if self._depth:
            return self._paused_at - self._behind_ns
        return perf_counter_ns() - self._behind_ns

    def pause(self) -> None:
        if not self._depth:
            self._paused_at = perf_counter_ns()
        self._depth += 1

    def resume(self) -> None:
        if self._depth == 1:
            self._behind_ns += perf_counter_ns() - self._paused_at
        if self._depth:
            self._depth -= 1

    @property
    def paused_ms(self) -> float:
        """Milliseconds the clock has stood still so far (completed pauses)."""
        return self._behind_ns / 1e6


class CurrentStream:
    """``torch.cuda.current_stream(index)`` for a clock's stamps at the cost of one C call: the ``Stream`` object
    (about 3 µs to make, as much as recording the event) is made again only when the raw stream changes (a
    ``torch.cuda.stream`` block, or autograd's device thread on the forward's stream). ``raw`` and ``make``
    exist for tests without a GPU."""

    def __init__(self, index: int, raw: Callable[[int], int] | None = None,
                 make: Callable[[int], Any] | None = None) -> None:
        self._index = index
        self._raw_of = raw or cuda_raw_stream()
        self._make = make or torch.cuda.current_stream
        self._last: tuple[int | None, Any] = (None, None)  # (raw handle, Stream): one store, one read

    def __call__(self) -> Any:
        raw = self._raw_of(self._index)
        last = self._last
        if raw != last[0]:
            last = self._last = (raw, self._make(self._index))
        return last[1]


def _record(event: Any, stream: Any) -> None:
    event.record(stream)


_POOLS: dict[Any, list[Any]] = {}  # free timing events, per device (per event factory in tests): see CudaEventClock


class CudaEventClock(Clock):
    """CUDA events recorded on the current stream; read once after the step (one synchronize), never in a hook.

    Events come from a pool shared by every clock of the process on the device: a step records into events that
    earlier steps, of this block or of an earlier one, made and read, so a hook costs one ``record`` and no
    allocation, and a fresh ``with LayerProf(model)`` around one step makes one, for its clock's origin (kept by the
    clock, never recycled), once a block before it ran. A new event costs more than a recorded one, and its
    destruction more again: on an H100, a stamp took 4.5-7.7 µs with a new event against 2.9-3.9 from the pool, and
    a one-shot block around BERT-base's step cost 79 µs a module over the plain step with the shared pool against
    110 making its events anew, in the same run. Events go back only once read (``recycle``, after the step's
    synchronize): the pool holds as many as the steps read at once ever held, and lives as long as the process.
    The current stream is looked up by its raw handle (``CurrentStream``), and the event recorded by torch's C
    method, not through ``Event.record``'s Python wrapper. ``events`` and ``stream`` (callables making an event and
    giving the stream to record on) exist for tests without a GPU; clocks made with the same ``events`` share a
    pool as real ones do."""

    kind = "cuda_event"

    def __init__(self, device: torch.device, events: Callable[[], Any] | None = None,
                 stream: Callable[[], Any] | None = None) -> None:
        self.device = str(device)
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._new_event = events or (lambda: torch.cuda.Event(enable_timing=True))
        self._stream = stream or CurrentStream(self._index)
        # torch.cuda.Event.record only fills in the stream when none is given and calls this C method.
        self._record = _record if events is not None else cuda_event_record()
        self._free = _POOLS.setdefault(self._index if events is None else events, [])  # read in an earlier step
        self._used: list[Any] = []  # handed out since the last recycle
        super().__init__()
        self._used.clear()  # the origin is read by every step's offsets: never recycled

    def now(self) -> Any:
        try:  # (one pop: another thread's clock may take the last event between a test and a pop)
            event = self._free.pop()
        except IndexError:
            event = self._new_event()
        self._record(event, self._stream())
        self._used.append(event)
        return event

    def ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def settle(self) -> None:
        torch.cuda.synchronize(self._index)

    def recycle(self) -> None:
        self._free.extend(self._used)
        self._used.clear()

    @property
    def pool_size(self) -> int:
        """Events this clock holds or can take: in use, or free in its device's pool (the origin not counted)."""
        return len(self._free) + len(self._used)


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


def host_stamped(clock: Clock) -> Any:
    """A stamp of ``clock``; one that does not order itself (a CUDA event) with the host's nanoseconds beside it,
    as ``(ns, event)``. (The tracker's hooks, run for every call and graph node, do the same inline.)"""
    stamp = clock.now()
    return stamp if type(stamp) is int else (perf_counter_ns(), stamp)


def make_clock(device: torch.device, sync: bool) -> Clock:
    """The clock for tensors on ``device``; ``cuda`` and ``cuda:0`` name the same clock only once normalized."""
    if device.type == "cuda":
        return CudaSyncClock(device) if sync else CudaEventClock(device)
    return CpuClock()
