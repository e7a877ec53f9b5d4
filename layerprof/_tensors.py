"""Find the tensors inside a module's inputs or outputs, however they are nested; what backward starts from."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator

import torch

__all__ = ["children", "iter_tensors", "iter_tensor_paths", "first_tensor", "loss_of", "is_lazy"]

_MAX_DEPTH = 16
_LEAVES = (str, bytes, int, float, bool, type(None))


def is_lazy(tensor: Any) -> bool:
    """Whether ``tensor`` is a lazy module's parameter or buffer not made yet (``nn.LazyLinear`` before its first
    call): it has no storage, version or dtype to read."""
    return isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin)


def children(obj: Any) -> Iterable[tuple[Any, Any]] | None:
    """``(key, value)`` pairs of a container (tuple, list, dict, ModelOutput, dataclass), None for anything else.
    A named tuple's keys are its field names (a ``PackedSequence``'s ``data``), as a dataclass's are; so are those of
    a struct sequence (``torch.max(x, 1)``'s ``values`` and ``indices``), which names them in ``__match_args__``."""
    if isinstance(obj, tuple) and type(obj) is not tuple:
        fields = getattr(type(obj), "_fields", None) or getattr(type(obj), "__match_args__", None)
        if isinstance(fields, tuple) and len(fields) == len(obj):
            return zip(fields, obj)
    if isinstance(obj, (list, tuple)):
        return enumerate(obj)
    if isinstance(obj, dict):
        return obj.items()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return ((field.name, getattr(obj, field.name, None)) for field in dataclasses.fields(obj))
    return None


def _values(obj: Any) -> Iterable[Any] | None:
    """The values ``children`` pairs with keys, without the keys: what ``iter_tensors`` walks in every module
    call's output, where a tuple's field names (looked up for the shapes meter's paths) are not read."""
    if isinstance(obj, (list, tuple)):
        return obj
    if isinstance(obj, dict):
        return obj.values()
    items = children(obj)
    return None if items is None else [value for _, value in items]


def _is_key_value_cache(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face key/value cache or one of its layers (``DynamicCache``,
    ``EncoderDecoderCache``, ``DynamicLayer``): plain objects, not containers, that hold the cached tensors in
    their attributes, some levels down. Told by name, so that nothing imports transformers."""
    kind = type(obj)
    return kind.__module__.startswith("transformers.") and any(
        base.__name__ in ("Cache", "CacheLayerMixin") for base in kind.__mro__)


def _attributes(obj: Any) -> Iterable[tuple[str, Any]] | None:
    """The public attributes, in the order they were set, of a plain object that holds tensors in them: one that
    holds a tensor in an attribute (torchvision's ``ImageList``: ``tensors``, the padded batch, and
    ``image_sizes``) or a key/value cache (``layers.0.keys``, ``self_attention_cache...``: its first layer's);
    None for anything else.
    A module's (its parameters) are not read."""
    if isinstance(obj, (torch.nn.Module, type)):
        return None
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict):
        return None
    if _is_key_value_cache(obj):
        # Its first layer stands for every layer's (in a plain cache, each holds keys and values of one shape): the
        # cache is handed to every decoder layer's calls, and reading each layer's at each would make a forward's
        # cost grow with the square of the depth (193 µs a call for 32 layers, 12 without the cache).
        return [(key, value[:1] if key == "layers" and isinstance(value, list) else value)
                for key, value in attributes.items() if not key.startswith("_")]
    if not any(isinstance(value, torch.Tensor) for value in attributes.values()):
        return None
    return [(key, value) for key, value in attributes.items() if not key.startswith("_")]


def iter_tensor_paths(obj: Any, _path: tuple[Any, ...] = (), _depth: int = 0,
                      _within: frozenset[int] = frozenset()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """Like ``iter_tensors``, with each tensor's path of keys: ``((0,), t)``, ``(("mask", 0), m)``; it also reads
    the public attributes of a plain object that holds tensors in them (``((0, "tensors"), batch)`` of an
    ``ImageList``, ``("cache", "layers", 0, "keys")`` of a Hugging Face key/value cache), which ``iter_tensors``
    leaves alone. An object already open on the way down (``child.parent``, ``self.owner = self``) is not read
    again: such a reference leads back up, and the walk would list the tensors above it again and again."""
    if isinstance(obj, torch.Tensor):
        yield _path, obj
        return
    if _depth >= _MAX_DEPTH or isinstance(obj, _LEAVES):
        return
    items = children(obj)
    if items is None:
        if id(obj) in _within:
            return
        items = _attributes(obj)
        if items is not None:
            _within = _within | {id(obj)}
    if items is not None:
        for key, item in items:
            yield from iter_tensor_paths(item, (*_path, key), _depth + 1, _within)


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Yield every tensor in ``obj`` and its containers, depth first (``iter_tensor_paths``' order, without
    the paths or a generator per level: the tracker reads every module call's output with it)."""
    if isinstance(obj, torch.Tensor):
        return iter((obj,))
    # A flat container (a tuple of tensors and Nones, a ModelOutput of tensors): its tensors in order, without
    # the stack of the general walk (half the time: the tracker reads every call's output).
    kind = type(obj)
    values = obj if kind is tuple or kind is list else obj.values() if isinstance(obj, dict) else None
    if values is not None:
        flat = []
        for value in values:
            if isinstance(value, torch.Tensor):
                flat.append(value)
            elif value is not None:
                break
        else:
            return iter(flat)
    found: list[torch.Tensor] = []
    stack = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif depth < _MAX_DEPTH and not isinstance(item, _LEAVES):
            values = _values(item)
            if values is not None:
                stack.extend([(value, depth + 1) for value in values][::-1])
    return iter(found)


def first_tensor(*objs: Any) -> torch.Tensor | None:
    """The first tensor found in ``objs``, or None."""
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            return obj
        for tensor in iter_tensors(obj):
            return tensor
    return None


def loss_of(output: Any) -> torch.Tensor | None:
    """What backward starts from: ``output.loss`` where the model computed one (Hugging Face models given
    labels), else the sum of every floating output tensor that requires grad; None when there is none."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    parts = [t.sum().float() for t in iter_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        return None
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]
