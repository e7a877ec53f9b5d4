"""Parameters and buffers per module: counts, bytes, dtypes, trainable vs frozen, and which parameters are shared.

Static: read from the model when profiling starts (and again when it stops if a lazy module was uninitialized),
no hook runs per call. Every inclusive total counts a tensor once however many modules hold it (tied embeddings,
shared blocks); ``measure_params`` does so in time linear in the model's size.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from .._derived import derived
from .._tensors import is_lazy
from ..record.fields import Field, declare
from ..record.records import ModuleRecord
from .meter import Meter, register_meter
from .packed import packed_tensors

__all__ = ["ParamsMeter", "PARAM_FIELDS", "module_params", "measure_params"]

_DTYPE_NAMES: dict[torch.dtype, str] = {}
_PACKED = "packed"  # a weight packed in a torch.ScriptObject (a quantized layer's): counted as a frozen parameter


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _tensors(table: dict[str, Any]) -> dict[int, torch.Tensor]:
    # ``_parameters``/``_buffers`` are what ``parameters()``/``buffers()`` walk, without their generator machinery.
    return {id(t): t for t in table.values() if t is not None and not is_lazy(t)}


class _Totals:
    """Inclusive sums of one module: parameters (all, trainable, bytes, by dtype) and buffers."""

    __slots__ = ("params", "trainable", "param_bytes", "dtypes", "buffers", "buffer_bytes")

    def __init__(self) -> None:
        self.params = self.trainable = self.param_bytes = self.buffers = self.buffer_bytes = 0
        self.dtypes: dict[str, int] = {}

    def add_param(self, param: torch.Tensor, trainable: bool = True) -> None:
        count = param.numel()
        self.params += count
        if trainable and param.requires_grad:
            self.trainable += count
        self.param_bytes += count * param.element_size()
        key = _dtype_name(param.dtype)
        self.dtypes[key] = self.dtypes.get(key, 0) + count

    def add_buffer(self, buffer: torch.Tensor) -> None:
        self.buffers += buffer.numel()
        self.buffer_bytes += _bytes(buffer)

    def add(self, other: _Totals) -> None:
        self.params += other.params
        self.trainable += other.trainable
        self.param_bytes += other.param_bytes
        self.buffers += other.buffers
        self.buffer_bytes += other.buffer_bytes
        for key, count in other.dtypes.items():
            self.dtypes[key] = self.dtypes.get(key, 0) + count


def measure_params(entries: Sequence[tuple[str, nn.Module]]) -> dict[str, dict[str, Any]]:
    """The ``PARAM_FIELDS`` of every module in ``entries`` (unique modules, parents before children, as
    ``named_modules()`` gives them), in time linear in the model's size.

    A tensor held by one module, under one path from the root, is added up the tree once. A tensor held by
    several modules (tied weights) or by a module reachable under several names (a shared block) is added to
    every module above any of its holders, once each: inclusive totals count each tensor once."""
    index = {id(module): i for i, (_, module) in enumerate(entries)}
    parents: list[list[int]] = [[] for _ in entries]
    for i, (_, module) in enumerate(entries):
        for child in module._modules.values():
            j = index.get(id(child)) if child is not None else None
            if j is not None and i not in parents[j]:
                parents[j].append(i)
    # A module whose every ancestor has one parent sits in a plain tree: its sums can simply be added upwards.
    single = [True] * len(entries)
    for j in range(1, len(entries)):
        single[j] = len(parents[j]) == 1 and single[parents[j][0]]
    holders: dict[int, list[int]] = {}
    tensors: dict[int, tuple[torch.Tensor, Any]] = {}  # id -> (tensor, is a parameter; _PACKED: a packed weight)
    own = []
    own_packed: dict[int, list[torch.Tensor]] = {}
    for i, (_, module) in enumerate(entries):
        params = _tensors(module._parameters) if module._parameters else {}
        buffers = _tensors(module._buffers) if module._buffers else {}
        own.append(params)
        for key, tensor in params.items():
            holders.setdefault(key, []).append(i)
            tensors[key] = (tensor, True)
        for key, tensor in buffers.items():
            holders.setdefault(key, []).append(i)
            tensors[key] = (tensor, False)
        packed = packed_tensors(module)
        if packed:  # (a quantized layer's weights, held alive in ``tensors`` while their ids key it)
            own_packed[i] = packed
            for tensor in packed:
                holders.setdefault(id(tensor), []).append(i)
                tensors[id(tensor)] = (tensor, _PACKED)
    totals = [_Totals() for _ in entries]  # tensors added upwards, child to parent
    shared: dict[int, _Totals] = {}  # tensors added to each module above their holders directly
    for key, held_by in holders.items():
        tensor, is_param = tensors[key]
        if len(held_by) == 1 and single[held_by[0]]:
            targets = [totals[held_by[0]]]
        else:
            targets = [shared.setdefault(i, _Totals()) for i in _ancestors(held_by, parents)]
        for target in targets:
            if is_param is _PACKED:
                target.add_param(tensor, trainable=False)  # (no optimizer sees it: not in parameters())
            else:
                (target.add_param if is_param else target.add_buffer)(tensor)
    for j in range(len(entries) - 1, 0, -1):  # children after parents: a child's sums are final here
        if single[j] and totals[j].params | totals[j].buffers:
            totals[parents[j][0]].add(totals[j])
    for i, extra in shared.items():
        totals[i].add(extra)
    names = [name for name, _ in entries]
    values = {}
    for i, (name, module) in enumerate(entries):
        mine = own[i]
        shared_with: dict[str, list[str]] = {}
        shared_params = 0
        counted: list[torch.Tensor] = []
        table = module._parameters if module._parameters else {}
        one_name_each = len(mine) == sum(1 for t in table.values() if t is not None and not is_lazy(t))
        for param_name, param in table.items():
            if param is None or is_lazy(param):
                continue
            held_by = holders[id(param)]
            if len(held_by) == 1 and one_name_each:
                continue  # one holder, under one name: nothing shared (the common case, checked cheaply)
            others = [f"{names[h]}.{n}" if names[h] else n for h in held_by for n in
                      _param_names(entries[h][1], param) if h != i or n != param_name]
            if others:
                shared_with[param_name] = others
                # Elements another module holds too, each tensor once (one held under two names here counts
                # where another module holds it, once).
                if any(h != i for h in held_by) and not any(param is seen for seen in counted):
                    counted.append(param)
                    shared_params += param.numel()
        total = totals[i]
        values[name] = {
            "params": total.params,
            "trainable_params": total.trainable,
            "param_bytes": total.param_bytes,
            "param_dtypes": dict(total.dtypes),
            "own_params": sum(p.numel() for p in (*mine.values(), *own_packed.get(i, ()))),
            "own_param_bytes": sum(_bytes(p) for p in (*mine.values(), *own_packed.get(i, ()))),
            "shared_params": shared_params,
            "shared_with": shared_with,
            "buffers": total.buffers,
            "buffer_bytes": total.buffer_bytes,
        }
    return values


def _param_names(module: nn.Module, param: torch.Tensor) -> list[str]:
    return [name for name, held in module._parameters.items() if held is param]


def _ancestors(held_by: list[int], parents: list[list[int]]) -> list[int]:
    """The holders and every module above any of them, each once."""
    seen = set(held_by)
    todo = list(held_by)
    while todo:
        for parent in parents[todo.pop()]:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return sorted(seen)


def module_params(module: nn.Module) -> dict[str, Any]:
    """The ``PARAM_FIELDS`` of one module.

    >>> module_params(nn.Linear(10, 20))["params"]  # 10*20 weights + 20 biases
    220
    """
    return measure_params(list(module.named_modules()))[""]


def _measure(entries: Sequence[tuple[str, nn.Module]]) -> tuple[dict[str, dict[str, Any]], bool]:
    """The figures, and whether a parameter or buffer is lazy (then they are measured again once it has run)."""
    lazy = any(is_lazy(t) for _, module in entries for table in (module._parameters, module._buffers)
               for t in table.values() if t is not None)
    return measure_params(entries), lazy


@register_meter
class ParamsMeter(Meter):
    """Parameter and buffer counts and bytes per module (own and inclusive), dtypes, sharing. No per-call cost."""

    name = "params"
    deferrable = True  # start measures the entries; fill copies those figures

    def __init__(self) -> None:
        self._entries: Sequence[tuple[str, nn.Module]] = []
        self._values: dict[str, dict[str, Any]] = {}
        self._lazy = False
        self._measured = 0  # entries measured: the profiler appends modules registered while profiling

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: Sequence[tuple[str, nn.Module]]) -> None:
        self._entries = entries
        self._measure()

    def _measure(self) -> None:
        # Measured once per model while nothing it holds changes: the profiler's check of the model at the start
        # of a block covers every tensor's identity, dtype, size and requires_grad (``_derived``, ``collect/reuse``).
        entries = self._entries
        if entries:
            self._values, self._lazy = derived(entries[0][1], "params", lambda: _measure(entries))
        else:
            self._values, self._lazy = {}, False
        self._measured = len(self._entries)

    def modules_added(self, entries: Sequence[tuple[str, nn.Module]]) -> None:
        # Each module once, at its latest name, after its parent (as ``measure_params`` reads them): one that moved
        # into a module registered in its place (a Linear wrapped by an adapter, now ``0.base``) leaves its old
        # place. Kept as a list of this meter's own: the profiler's may be made anew as modules leave.
        joined = {id(module) for _, module in entries}
        self._entries = [entry for entry in self._entries if id(entry[1]) not in joined] + list(entries)
        self._measured = -1  # (measured again as the block stops)

    def stop(self) -> None:
        if self._lazy or len(self._entries) != self._measured:
            self._measure()  # lazy modules got their shapes on the first forward; new modules joined
        self._entries = []

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        for name, values in self._values.items():
            own = records[name].__dict__
            own.update(values)
            # Figures may be shared with another profile of the same model: its records get their own containers.
            own["param_dtypes"] = dict(values["param_dtypes"])
            shared = values["shared_with"]
            own["shared_with"] = {key: list(names) for key, names in shared.items()} if shared else {}


def _frozen(record: ModuleRecord) -> float | None:
    params, trainable = getattr(record, "params", None), getattr(record, "trainable_params", None)
    return None if params is None or trainable is None else params - trainable


def _size(record: ModuleRecord) -> float | None:
    params = getattr(record, "param_bytes", None)
    return None if params is None else params + (getattr(record, "buffer_bytes", None) or 0)


declare(
    Field("params", "count", "Params", share_of="params", meter="params",
          doc="elements of every parameter in the subtree, each tensor once"),
    Field("trainable_params", "count", "Trainable", meter="params", doc="of which requires_grad"),
    Field("param_bytes", "bytes", "Param Size", share_of="param_bytes", meter="params",
          doc="bytes of those parameters"),
    Field("param_dtypes", "data", "Param dtypes", meter="params", doc="{dtype name: elements}"),
    Field("own_params", "count", "Own Params", cost=False, meter="params",
          doc="elements of the parameters registered on this module itself"),
    Field("own_param_bytes", "bytes", "Own Param Size", cost=False, meter="params"),
    Field("shared_params", "count", "Shared Params", meter="params",
          doc="elements of own parameters that another module also holds (tied or shared)"),
    Field("shared_with", "data", "Shared With", meter="params",
          doc="{own parameter name: [qualified names of the same tensor elsewhere]}"),
    Field("buffers", "count", "Buffers Elements", meter="params", doc="elements of every buffer in the subtree"),
    Field("buffer_bytes", "bytes", "Buffers", meter="params", doc="bytes of those buffers"),
    Field("frozen_params", "count", "Frozen", compute=_frozen, meter="params", doc="params - trainable_params"),
    Field("size", "bytes", "Size", compute=_size, share_of="size", meter="params", doc="param_bytes + buffer_bytes"),
)
PARAM_FIELDS = ("params", "trainable_params", "param_bytes", "param_dtypes", "own_params", "own_param_bytes",
                "shared_params", "shared_with", "buffers", "buffer_bytes")
