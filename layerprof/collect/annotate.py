"""Annotations for other profilers: a ``record_function`` range (and an NVTX range on CUDA) named after the module
around each forward call and each backward interval, so torch.profiler traces (Perfetto, HTA) and Nsight Systems
show module names around the ops and kernels. ``LayerProf(model, annotate=True)`` runs an ``Annotator``.

It is an observer on the tracker's existing hooks (``Meter.forward_pre``/``forward_post`` and
``backward_start``/``backward_end``), so the tracker knows nothing of it and it costs nothing when off.

Backward ranges need care: the tracker names a call in ``backward_end`` at each of its frontier nodes, and only
the last naming is its end, which is not known when it happens. So a named call is only marked *ending*; its
range closes when a call that is not inside it starts its backward, when the backward pass finishes (a callback
queued on the autograd engine), or at the end of the step, whichever comes first. Ranges are kept on one stack
so they always nest: closing a range closes the ranges opened inside it.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from .._torch import profiler_range, queue_backward_callback
from ..metrics.meter import Meter
from ..record.records import ModuleRecord

__all__ = ["Annotator", "BACKWARD_SUFFIX"]

# Backward ranges are "<module> (backward)"; forward ranges are the module's qualified name (the type for the root).
BACKWARD_SUFFIX = " (backward)"


def _inside(call: Any, outer: Any) -> bool:
    """Whether ``call`` was made from inside ``outer``'s call (or is it)."""
    while call is not None:
        if call is outer:
            return True
        call = call.parent
    return False


def _nesting(call: Any) -> int:
    """How many calls ``call`` was made inside."""
    count = 0
    while call.parent is not None:
        call, count = call.parent, count + 1
    return count


class _Range:
    """One open range: the record_function handle and, on CUDA, an NVTX range on the same thread's stack."""

    __slots__ = ("call", "handle", "nvtx", "ending")

    def __init__(self, call: Any, name: str, nvtx: bool) -> None:
        self.call = call
        self.handle = profiler_range(name)
        self.handle.__enter__()
        self.nvtx = nvtx
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        self.ending = False

    def close(self) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_pop()
        self.handle.__exit__(None, None, None)


class Annotator(Meter):
    """Opens and closes the ranges; not a metric (it records nothing), so it is not in ``METERS``."""

    name = "annotate"
    wants_forward_hooks = True
    wants_backward_hooks = True

    def __init__(self) -> None:
        self._labels: dict[str, str] = {}
        self._nvtx = False
        self._forward: list[_Range] = []
        self._backward: list[_Range] = []
        self._callback_queued = False

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: Sequence[tuple[str, nn.Module]]) -> None:
        self._labels = {name: name or record.type for name, record in records.items()}
        on_cuda = any(p.is_cuda for p in model.parameters())
        self._nvtx = on_cuda and torch.cuda.is_available()

    # -- forward: pre and post hooks pair up on one thread, so a stack suffices -----------------------------------
    def forward_pre(self, call: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
        self._forward.append(_Range(call, self._labels.get(call.name, call.name), self._nvtx))

    def forward_post(self, call: Any, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        # A call whose forward raised never reaches its post hook: close what it left open above it.
        while self._forward:
            top = self._forward.pop()
            top.close()
            if top.call is call:
                break

    # -- backward -----------------------------------------------------------------------------------------------
    def backward_start(self, calls: Sequence[Any]) -> None:
        if not self._callback_queued:
            self._callback_queued = queue_backward_callback(self._end_of_pass)
        for call in sorted(calls, key=_nesting):  # outer calls first, so that the stack nests
            self._close_ended_outside(call)
            self._backward.append(_Range(call, self._labels.get(call.name, call.name) + BACKWARD_SUFFIX, self._nvtx))

    def backward_end(self, calls: Sequence[Any]) -> None:
        for open_range in self._backward:
            if any(open_range.call is call for call in calls):
                open_range.ending = True

    def _close_ended_outside(self, call: Any) -> None:
        """``call`` starts its backward: a call marked ending that ``call`` is not inside has finished."""
        for index, open_range in enumerate(self._backward):
            if open_range.ending and not _inside(call, open_range.call):
                self._close_from(index)
                return

    def _close_from(self, index: int) -> None:
        while len(self._backward) > index:
            self._backward.pop().close()

    def _end_of_pass(self) -> None:
        self._callback_queued = False
        self._close_from(0)

    def _close_all(self) -> None:
        self._close_from(0)
        while self._forward:
            self._forward.pop().close()

    def end_step(self, recorded: bool) -> None:
        self._callback_queued = False
        self._close_all()

    def stop(self) -> None:
        self._close_all()
