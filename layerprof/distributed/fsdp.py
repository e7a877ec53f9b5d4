"""FSDP2's communication, taken out of module times and put on the unit it serves: the ``fsdp_comm`` meter.

``torch.distributed.fsdp.fully_shard`` all-gathers a unit's parameters from hooks: in forward from a module
pre-hook that runs before layerprof's, in backward from a tensor hook on the unit's output, which the autograd
engine runs *before* the node's pre-hooks, that is inside the backward interval of whichever module's node ran
just before; it reduce-scatters the gradients from an autograd node on the unit's inputs (owned by the parent's
call) or, where no input needs a gradient, from its end-of-backward callback, which runs before layerprof's and
so inside the backward of the last module to run. Left alone, a small ``fc3`` showed a hundred times its plain
backward and a root-only unit's reduce-scatter landed in ``fc1``.

This meter stops the tracker's clock (a ``PausableClock``) for as long as FSDP2 runs any of its param groups'
``FSDP2_HOOK_POINTS`` (``_torch.py``): every interval stamped with that clock leaves out the collectives, so no
module's forward or backward holds communication, its own or another unit's. The time goes to the unit the param
group belongs to, split by pass (``comm_forward_ms``, ``comm_backward_ms``, per recorded step), with the bytes
of the all-gathers and reduce-scatters it issued. A unit's hook that prefetches another unit's parameters bills
that all-gather to the other unit. Since the clock stands still during communication, the root's time plus every
unit's communication is the step as it ran. Timelines (call start offsets, the trace) are on the paused clock:
communication shows as no gap between modules.

It runs by itself for every model with a ``fully_shard`` unit (``Meter.needed_by``). On CUDA, module boundaries
are CUDA events on the compute stream, which a host-side pause cannot stop; there the figures are the host time
FSDP spent issuing and waiting (FSDP's streams overlap the collectives with computation).
"""
from __future__ import annotations

import statistics
import warnings
from time import perf_counter_ns
from typing import Any, Callable

import torch
from torch import nn

from .._torch import fsdp2_comm_buffers, fsdp2_param_groups, graph_task_id, patch_fsdp2_group, process_group_initialized
from .._torch import unpatch_fsdp2_group
from ..metrics.meter import Meter, register_meter
from ..record.fields import Field, declare
from ..record.records import ModuleRecord

# Whether this torch was built with distributed support: fixed for the process, read once (``needed_by`` runs at
# every LayerProf, right after a step, where each frame of torch's Python code is cache misses).
_DISTRIBUTED = torch.distributed.is_available()

__all__ = ["FsdpCommMeter", "FSDP_FIELDS"]

FSDP_FIELDS = ("comm_forward_ms", "comm_backward_ms", "all_gather_bytes", "reduce_scatter_bytes")

# The meter times FSDP2 units only: on a model without any it runs and records nothing.
_SHARDED = ("run with LayerProf(model, metrics=('fsdp_comm',)) on a model whose units are sharded with "
            "torch.distributed.fsdp.fully_shard")

declare(
    Field("comm_forward_ms", "ms", "Comm Forward", meter="fsdp_comm", needs=_SHARDED,
          doc="FSDP2 communication for this unit in forward (all-gather, copy-out, reshard), in no module's time"),
    Field("comm_backward_ms", "ms", "Comm Backward", meter="fsdp_comm", needs=_SHARDED,
          doc="FSDP2 communication for this unit in backward (all-gather, reduce-scatter), in no module's time"),
    Field("all_gather_bytes", "bytes", "All-Gather", meter="fsdp_comm", needs=_SHARDED,
          doc="bytes this unit's all-gathers produced per step (every rank's shard)"),
    Field("reduce_scatter_bytes", "bytes", "Reduce-Scatter", meter="fsdp_comm", needs=_SHARDED,
          doc="bytes of gradients this unit's reduce-scatters took in per step (every rank's share)"),
    aliases={"comm_forward": "comm_forward_ms", "comm_backward": "comm_backward_ms"},
)


def _bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


class _Frame:
    """One FSDP2 method running: whose time it is, since when, in which pass."""

    __slots__ = ("unit", "since", "backward")

    def __init__(self, unit: str, since: int, backward: bool) -> None:
        self.unit, self.since, self.backward = unit, since, backward


@register_meter
class FsdpCommMeter(Meter):
    """``fsdp_comm``: FSDP2 communication out of module times and onto the ``fully_shard`` unit it serves.

    Per unit and recorded step: ``comm_forward_ms``, ``comm_backward_ms``, ``all_gather_bytes``,
    ``reduce_scatter_bytes``. ``profile.meta["fsdp_comm"]`` has the totals per step and ``per_step``."""

    name = "fsdp_comm"
    pauses_clock = True

    def __init__(self) -> None:
        self._clock: Any = None  # the profile's PausableClock
        self._patched: list[tuple[Any, dict[str, Any]]] = []
        self._stack: list[_Frame] = []
        self._step: dict[str, list[float]] = {}  # unit -> [forward ns, backward ns, all-gather B, reduce-scatter B]
        self.steps: list[dict[str, list[float]]] = []
        self.note: str | None = None

    @classmethod
    def needed_by(cls, model: nn.Module) -> bool:
        if not _DISTRIBUTED or not process_group_initialized():
            return False  # fully_shard needs a process group: no walk over the modules of a plain model
        return any(fsdp2_param_groups(module) for module in model.modules())

    def use_clock(self, clock: Any) -> None:
        self._clock = clock

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: list[tuple[str, nn.Module]]) -> None:
        names = {id(module): name for name, module in entries}
        patched: set[int] = set()
        for name, module in entries:
            for group in fsdp2_param_groups(module):
                # A unit of several modules (fully_shard([a, b])) is billed to the first, and its group, which each
                # of them holds, is wrapped once (twice, its bytes counted twice and a wrapper left on it).
                if id(group) in patched:
                    continue
                patched.add(id(group))
                modules = getattr(group, "modules", ()) or (module,)
                unit = names.get(id(modules[0]), name)
                self._patched.append((group, patch_fsdp2_group(group, self._timed(group, unit))))
        if not self._patched:
            self.note = f"no torch.distributed.fsdp.fully_shard unit in the model ({type(model).__name__})"
            warnings.warn(f"fsdp_comm: {self.note}: nothing to time", RuntimeWarning, stacklevel=4)

    def _timed(self, group: Any, unit: str) -> Callable[[str, Callable[..., Any]], Callable[..., Any]]:
        def wrap(point: str, method: Callable[..., Any]) -> Callable[..., Any]:
            counts_bytes = point in ("unshard", "post_backward")

            def timed(*args: Any, **kwargs: Any) -> Any:
                self._enter(unit)
                before = fsdp2_comm_buffers(group) if counts_bytes else None
                try:
                    return method(*args, **kwargs)
                finally:
                    if before is not None:
                        self._count_bytes(unit, point, before, fsdp2_comm_buffers(group))
                    self._exit()

            return timed

        return wrap

    def _enter(self, unit: str) -> None:
        now = perf_counter_ns()
        stack = self._stack
        if stack:  # another unit's method called this one (a prefetch): its time so far is its own
            self._bill(stack[-1], now)
        elif self._clock is not None:
            self._clock.pause()
        stack.append(_Frame(unit, now, graph_task_id() != -1))

    def _exit(self) -> None:
        now = perf_counter_ns()
        stack = self._stack
        self._bill(stack.pop(), now)
        if stack:
            stack[-1].since = now
        elif self._clock is not None:
            self._clock.resume()

    def _totals(self, unit: str) -> list[float]:
        totals = self._step.get(unit)
        if totals is None:
            totals = self._step[unit] = [0.0, 0.0, 0.0, 0.0]
        return totals

    def _bill(self, frame: _Frame, now: int) -> None:
        self._totals(frame.unit)[1 if frame.backward else 0] += now - frame.since

    def _count_bytes(self, unit: str, point: str, before: tuple[Any, Any], after: tuple[Any, Any]) -> None:
        totals = self._totals(unit)
        if point == "unshard":  # an all-gather issued now: its output is in flight
            if after[0] is not None and after[0] is not before[0]:
                totals[2] += _bytes(after[0])
        elif after[1] is not None and after[1] is not before[1]:  # post_backward appended a reduce-scatter
            totals[3] += _bytes(after[1])

    def end_step(self, recorded: bool) -> None:
        step, self._step = self._step, {}
        if recorded:
            self.steps.append(step)

    def stop(self) -> None:
        patched, self._patched = self._patched, []
        for group, saved in reversed(patched):  # (last wrapped, first unwrapped)
            unpatch_fsdp2_group(group, saved)
        self._stack.clear()

    def _means(self) -> dict[str, dict[str, float]]:
        """Per unit, the mean per recorded step of each field (a step without the unit's communication counts 0)."""
        count = len(self.steps)
        sums: dict[str, list[float]] = {}
        for step in self.steps:
            for unit, totals in step.items():
                known = sums.setdefault(unit, [0.0, 0.0, 0.0, 0.0])
                for index, value in enumerate(totals):
                    known[index] += value
        scale = (1e6, 1e6, 1.0, 1.0)  # ns -> ms, bytes stay bytes
        return {unit: {field: value / scale[index] / count for index, (field, value) in
                       enumerate(zip(FSDP_FIELDS, totals))} for unit, totals in sums.items()} if count else {}

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        for unit, values in self._means().items():
            record = records.get(unit)
            if record is not None:
                record.__dict__.update(values)

    def meta(self) -> dict[str, Any]:
        if self.note is not None:
            return {"note": self.note}
        per_step = [{field: sum(totals[index] for totals in step.values()) / (1e6 if index < 2 else 1.0)
                     for index, field in enumerate(FSDP_FIELDS)} for step in self.steps]
        summary: dict[str, Any] = {"steps": len(self.steps), "units": sorted(self._means())}
        for field in FSDP_FIELDS:
            summary[field] = statistics.fmean(step[field] for step in per_step) if per_step else None
        summary["per_step"] = per_step
        return summary
