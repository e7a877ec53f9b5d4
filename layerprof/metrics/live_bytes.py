"""Live tensor bytes on the CPU, counted exactly: the reader behind ``metrics=("live_memory",)``.

The CPU allocator keeps no statistics, so ``LiveBytesReader`` counts for it: a ``TorchDispatchMode`` sees every
op's outputs, and each output storage that is new (not one the op was handed: a view, an in-place or ``out=`` op
returns its input's) adds its ``nbytes``; a weak reference on the storage takes them off when it is freed (torch
keeps a storage's Python object as long as the storage lives, so the callback runs when the storage itself goes).
Only storages made while the reader is open count: parameters and the tensors that lived before are the
baseline, 0. ``read`` gives (bytes live now, the most live since the last ``reset_peak``), as
``CudaMemoryReader`` does for the CUDA allocator, so the memory meter's per-call deltas and peaks, and the step's
peak, exist on the CPU too.

What it sees: the tensors ops return, forward and backward (autograd runs a CPU backward on the calling thread, and
carries the modes over to the threads it uses, so gradients count), the recomputation of a
``torch.utils.checkpoint`` region, the ops the FLOP meter's mode runs below it; a tensor without a storage of its
own by what holds its data (a DTensor's local shard, a sparse tensor's indices and values). What it does not: a
kernel's own scratch buffers (allocated below the dispatcher, freed before the op returns), tensors made on other
threads, and devices other than the CPU. A dispatch mode is its thread's own: the reader ``covers`` the CPU on the
thread that opened it only, so a module call (or a whole step) run on another thread reads unknown (None), as the
plain memory meter's CPU calls do, not the 0 bytes the reader saw of it.

A mode on every op slows the step (tens of µs an op), so it is opt-in: ``LayerProf(model,
metrics=("live_memory",))`` is the memory meter with this reader on CPU calls (and the CUDA reader on CUDA ones).

>>> import torch
>>> reader = LiveBytesReader()
>>> reader.open()
>>> a = torch.ones(256)                  # 1 KiB
>>> b = (a * 2).view(16, 16)             # a new 1 KiB storage; the view adds nothing
>>> del a
>>> reader.close()
>>> reader.read("cpu")                   # 1 KiB live, 2 KiB at the most
(1024, 2048)
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch

from .._tensors import iter_tensors
from .._torch import TorchDispatchMode, inner_tensors, ready_mode, storage_key
from .._version import check_live_bytes_torch
from ..record.fields import Field, declare
from .memory import CudaMemoryReader, MemoryMeter, MemoryReader
from .meter import register_meter

__all__ = ["LiveBytesReader", "DeviceReaders", "LiveMemoryMeter", "read_step"]

declare(
    # The reader's own time in a profiled forward is this count times ``layerprof.collect.live_op_cost``: the
    # checkpoint planner takes it off a recomputation's price where the reader ran in the timed step.
    Field("live_forward_ops", "count", "Live Ops", meter="live_memory", detail=True, cost=False,
          doc="ops the live-bytes reader saw in the module's forward calls (children included), CPU calls only"),
)


class _Watch(TorchDispatchMode):
    """Hands every op's output tensors to the reader. As the FLOP meter's mode (``flops._CountingMode``): a
    higher-order op (flex attention) is run as it is, and a torch.compile'd function in a forward runs compiled, as
    it does unprofiled (else dynamo skips its frames under the mode, and a ``fullgraph=True`` compile raises)."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, reader: LiveBytesReader) -> None:
        super().__init__()
        self.reader = reader

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.reader.ops += 1
        out = func(*args, **kwargs)
        if type(out) is torch.Tensor:
            self.reader.see((out,), (args, kwargs))
        elif isinstance(out, (tuple, list)):
            self.reader.see(out, (args, kwargs))
        elif isinstance(out, torch.Tensor):  # a subclass (a DTensor)
            self.reader.see((out,), (args, kwargs))
        return out


class LiveBytesReader(MemoryReader):
    """Bytes of the CPU storages made since ``open()`` that are still alive, and their peak (see the module doc)."""

    def __init__(self) -> None:
        self.current = self.peak = 0
        self.ops = 0  # ops seen since open(): the memory meter reads it at module boundaries, for the planner
        self._live: dict[int, list[Any]] = {}  # storage key -> [bytes, weak reference]
        self._mode: _Watch | None = None
        self._thread: int | None = None  # the thread whose ops the mode sees, while open

    def covers(self, device: str) -> bool:
        return device == "cpu" and self._thread == threading.get_ident()

    def read(self, device: str) -> tuple[int, int]:
        return self.current, self.peak

    def reset_peak(self, device: str) -> None:
        self.peak = self.current

    def op_count(self, device: str) -> int | None:
        return self.ops if device == "cpu" else None

    def open(self) -> None:
        if self._mode is None:
            ready_mode(_Watch)
            self._mode = _Watch(self)
            self._mode.__enter__()
            self._thread = threading.get_ident()

    def close(self) -> None:
        mode, self._mode = self._mode, None
        self._thread = None
        if mode is not None:
            mode.__exit__(None, None, None)
        # Frees after this would change numbers already read: stop counting them. Clearing drops the weak
        # references, so their callbacks never run and hold nothing (each one's default argument is this dict).
        live, self._live = self._live, {}
        live.clear()

    def see(self, outputs: Any, inputs: Any) -> None:
        """Count the new storages among an op's output tensors (``inputs``: the op's arguments)."""
        handed: set[int] | None = None
        for tensor in outputs:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
                continue
            if type(tensor) is not torch.Tensor and _held_inside(tensor, self.see, inputs):
                continue
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested or wrapper tensors
                _held_inside(tensor, self.see, inputs)
                continue
            key = storage_key(storage)
            size = storage.nbytes()
            entry = self._live.get(key)
            if entry is not None:  # a storage counted before, handed back (a view) or resized (an out= op)
                if size != entry[0]:
                    self._add(size - entry[0])
                    entry[0] = size
                continue
            if handed is None:
                handed = _input_storages(inputs)
            if key in handed:
                continue
            live = self._live
            self._live[key] = [size, weakref.ref(storage, lambda _, key=key, live=live: self._free(live, key))]
            self._add(size)

    def _add(self, size: int) -> None:
        self.current += size
        if self.current > self.peak:
            self.peak = self.current

    def _free(self, live: dict[int, list[Any]], key: int) -> None:
        if live is self._live:  # not a storage of a reader since closed
            entry = live.pop(key, None)
            if entry is not None:
                self.current -= entry[0]


def _input_storages(inputs: Any) -> set[int]:
    """Keys of the CPU storages among an op's arguments (a wrapper tensor without a storage is skipped)."""
    keys = set()
    for tensor in iter_tensors(inputs):
        if tensor.device.type != "cpu":
            continue
        inner = inner_tensors(tensor) if type(tensor) is not torch.Tensor or tensor.layout != torch.strided else ()
        if inner:  # (a view of a DTensor returns a view of its shard)
            keys |= _input_storages(inner)
            continue
        try:
            keys.add(storage_key(tensor.untyped_storage()))
        except (RuntimeError, NotImplementedError, TypeError):
            continue
    return keys


def _held_inside(tensor: torch.Tensor, see: Callable[[Any, Any], None], inputs: Any) -> bool:
    """Hands ``see`` the tensors that hold ``tensor``'s data where others do: a wrapper subclass's inner tensors (a
    DTensor's shard: the wrapper's own storage is a placeholder, freed as soon as it is read, so a tensor-parallel
    step's activations and gradients counted 0), a sparse tensor's indices and values. False for a plain one."""
    inner = inner_tensors(tensor)
    if inner:
        see(inner, inputs)
    return bool(inner)


def read_step(step: Callable[[], Any]) -> LiveBytesReader:
    """Run ``step()`` with a reader open; the reader, closed: ``peak`` (the most bytes of tensors made in the step
    alive at once) and ``current`` (those left at its end)."""
    reader = LiveBytesReader()
    reader.open()
    try:
        step()
    finally:
        reader.close()
    return reader


class DeviceReaders(MemoryReader):
    """The live-bytes reader on the CPU, the CUDA allocator's on CUDA devices."""

    def __init__(self) -> None:
        self.cpu = LiveBytesReader()
        self.cuda = CudaMemoryReader()

    def _for(self, device: str) -> MemoryReader:
        return self.cpu if device == "cpu" else self.cuda

    def covers(self, device: str) -> bool:
        return self._for(device).covers(device)

    def read(self, device: str) -> tuple[int, int]:
        return self._for(device).read(device)

    def reset_peak(self, device: str) -> None:
        self._for(device).reset_peak(device)

    def op_count(self, device: str) -> int | None:
        return self._for(device).op_count(device)

    def open(self) -> None:
        self.cpu.open()

    def close(self) -> None:
        self.cpu.close()


@register_meter
class LiveMemoryMeter(MemoryMeter):
    """The memory meter with the CPU's live tensor bytes counted too (``LiveBytesReader``): the per-call deltas
    and peaks, and the step's peak, on CPU calls. Use it instead of ``"memory"``, not beside it."""

    name = "live_memory"
    replaces = "memory"
    reader_factory: Any = DeviceReaders

    def __init__(self) -> None:
        check_live_bytes_torch(torch.__version__)  # (made with the LayerProf: refused before any step runs)
        super().__init__()
