"""Parameters and buffers per module: counts, bytes, dtypes, trainable vs frozen, and which parameters are shared.

Static: read from the model when profiling starts (and again when it stops if a lazy module was uninitialized),
no hook runs per call. Every inclusive total counts a tensor once however many modules hold it (tied embeddings,
shared blocks), because it walks ``module.parameters()``, which yields each tensor once.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..record.fields import Field, declare
from ..record.records import ModuleRecord
from .meter import Meter, register_meter

__all__ = ["ParamsMeter", "PARAM_FIELDS", "module_params"]

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _is_lazy(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, nn.parameter.UninitializedTensorMixin)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _own(module: nn.Module, attr: str) -> dict[int, torch.Tensor]:
    # ``_parameters``/``_buffers`` are what ``parameters()``/``buffers()`` walk, without their generator machinery.
    return {id(t): t for t in getattr(module, attr).values() if t is not None and not _is_lazy(t)}


def _inclusive(module: nn.Module, attr: str, memo: dict[int, dict[int, torch.Tensor]]) -> dict[int, torch.Tensor]:
    """Every tensor of ``attr`` in the subtree, by identity; ``memo`` shares subtrees between calls (a module
    reachable from several parents is read once)."""
    found = memo.get(id(module))
    if found is None:
        found = memo[id(module)] = _own(module, attr)
        for child in module._modules.values():
            if child is not None:
                found.update(_inclusive(child, attr, memo))
    return found


def module_params(module: nn.Module, holders: dict[int, list[str]] | None = None, name: str = "",
                  memo: dict[str, dict[int, dict[int, torch.Tensor]]] | None = None) -> dict[str, Any]:
    """The ``PARAM_FIELDS`` of one module. ``holders`` maps ``id(parameter)`` to the qualified names under which
    it is registered (one per holding module); without it ``shared_params`` is 0 and ``shared_with`` empty.
    ``memo`` (an empty dict to start) makes measuring every module of a model linear in its size.

    >>> module_params(nn.Linear(10, 20))["params"]  # 10*20 weights + 20 biases
    220
    """
    memo = {} if memo is None else memo
    params = _inclusive(module, "_parameters", memo.setdefault("_parameters", {})).values()
    buffers = _inclusive(module, "_buffers", memo.setdefault("_buffers", {})).values()
    own = params if not module._modules else _own(module, "_parameters").values()  # a leaf owns all it has
    dtypes: dict[str, int] = {}
    for param in params:
        key = _dtype_name(param.dtype)
        dtypes[key] = dtypes.get(key, 0) + param.numel()
    shared_with: dict[str, list[str]] = {}
    shared_params = 0
    if holders is not None:
        prefix = f"{name}." if name else ""
        for param_name, param in module._parameters.items():
            others = [held for held in holders.get(id(param), ()) if held != prefix + param_name]
            if others and param is not None and not _is_lazy(param):
                shared_with[param_name] = others
                shared_params += param.numel()
    return {
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
        "param_bytes": sum(_bytes(p) for p in params),
        "param_dtypes": dtypes,
        "own_params": sum(p.numel() for p in own),
        "own_param_bytes": sum(_bytes(p) for p in own),
        "shared_params": shared_params,
        "shared_with": shared_with,
        "buffers": sum(b.numel() for b in buffers),
        "buffer_bytes": sum(_bytes(b) for b in buffers),
    }


def _holders(entries: list[tuple[str, nn.Module]]) -> dict[int, list[str]]:
    """``id(parameter)`` -> every ``module.param`` name holding it, one name per module object (a module reachable
    under two names is one holder: that is module sharing, already shown as an alias)."""
    holders: dict[int, list[str]] = {}
    for name, module in entries:
        prefix = f"{name}." if name else ""
        for param_name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append(prefix + param_name)
    return holders


@register_meter
class ParamsMeter(Meter):
    """Parameter and buffer counts and bytes per module (own and inclusive), dtypes, sharing. No per-call cost."""

    name = "params"

    def __init__(self) -> None:
        self._entries: list[tuple[str, nn.Module]] = []
        self._values: dict[str, dict[str, Any]] = {}
        self._lazy = False
        self._measured = 0  # entries measured: the profiler appends modules registered while profiling

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: list[tuple[str, nn.Module]]) -> None:
        self._entries = entries
        self._measure()

    def _measure(self) -> None:
        holders = _holders(self._entries)
        memo: dict[str, dict[int, dict[int, torch.Tensor]]] = {}
        self._values = {name: module_params(module, holders, name, memo) for name, module in self._entries}
        self._lazy = any(_is_lazy(p) for _, module in self._entries for p in module._parameters.values())
        self._measured = len(self._entries)

    def stop(self) -> None:
        if self._lazy or len(self._entries) != self._measured:
            self._measure()  # lazy modules got their shapes on the first forward; new modules joined
        self._entries = []

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        for name, values in self._values.items():
            record = records[name]
            for field, value in values.items():
                setattr(record, field, value)


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
