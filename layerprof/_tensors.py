"""Find the tensors inside a module's inputs or outputs, however they are nested."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import torch

__all__ = ["iter_tensors", "first_tensor"]

_MAX_DEPTH = 16


def iter_tensors(obj: Any, _depth: int = 0) -> Iterator[torch.Tensor]:
    """Yield every tensor in tuples, lists, dicts (ModelOutput included) and dataclasses, depth first."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif _depth >= _MAX_DEPTH or isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
        return
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item, _depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item, _depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, field.name, None), _depth + 1)


def first_tensor(*objs: Any) -> torch.Tensor | None:
    """The first tensor found in ``objs``, or None."""
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            return obj
        for tensor in iter_tensors(obj):
            return tensor
    return None
