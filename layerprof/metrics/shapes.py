"""Shapes and dtypes of every module call's input and output tensors, however they are nested.

What a record holds (numbers and strings only; no tensor is kept, only ``torch.Size`` and ``torch.dtype``):

- ``input_shapes``: the shapes of the tensors of the module's first call, flattened depth first: positional
  arguments, then keyword arguments in the order given; inside them list/tuple items in order, dict (and Hugging
  Face ``ModelOutput``) values in insertion order, dataclass and named tuple fields in declaration order (a named
  tuple's paths name its fields: ``"0.data"`` for a ``PackedSequence`` argument), a Hugging Face key/value cache's
  tensors by its attributes (``"cache.layers.0.keys"``, read when the call starts and when it ends, so
  a growing cache shows both lengths). Non-tensor values are skipped. ``Linear`` on a ``[4, 10]`` input:
  ``[[4, 10]]``; on a nested tensor of a ``[3, 4]`` and a ``[2, 4]``, ``[[2, None, 4]]`` (None for a ragged
  dimension; the summary shows ``?``).
- ``input_dtypes``: the dtype of each of those tensors, e.g. ``["float32"]``.
- ``input_paths``: where each tensor sat, as keys joined by dots: ``"0"`` is the first positional argument,
  ``"attention_mask"`` a keyword argument, ``"1.hidden.0"`` item 0 of field ``hidden`` of the second argument.
- ``output_shapes``, ``output_dtypes``, ``output_paths``: the same for the return value; a bare tensor output has
  the path ``""``, a ``ModelOutput`` its field names (``"logits"``, ``"cache.layers.0.keys"``).
- ``shape_variants``: how many distinct (inputs, outputs) signatures the module's calls had; 1 when every call
  looked like the first (a loop, a shared block), more when shapes changed (e.g. a growing KV cache). Counting
  stops at ``MAX_VARIANTS``.

Calls re-run by activation checkpointing during backward are skipped: they repeat a forward call.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from .._tensors import iter_tensor_paths
from .._torch import nested_sizes
from ..record.fields import Field, declare
from ..record.records import ModuleRecord
from .meter import Meter, register_meter

__all__ = ["ShapesMeter", "SHAPE_FIELDS", "tensor_specs", "MAX_VARIANTS"]

SHAPE_FIELDS = (
    "input_shapes", "input_dtypes", "input_paths",
    "output_shapes", "output_dtypes", "output_paths",
    "shape_variants",
)
declare(
    *(Field(f"{side}_{kind}", "shapes" if kind == "shapes" else "data", f"{label}{'' if kind == 'shapes' else ' ' + kind}",
            combine="none", cost=False, meter="shapes", doc=f"{kind} of the tensors in the first call's {side}")
      for side, label in (("input", "In"), ("output", "Out")) for kind in ("shapes", "dtypes", "paths")),
    Field("shape_variants", "count", "Shape variants", combine="max", cost=False, meter="shapes",
          doc="distinct input/output signatures seen (at most MAX_VARIANTS)"),
)

MAX_VARIANTS = 64

# One tensor's entry: (path keys, shape, dtype). Shapes and dtypes hold no reference to the tensor; a nested
# tensor's shape is a tuple with None for each ragged dimension.
Spec = tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype]


def _spec(path: tuple[Any, ...], tensor: torch.Tensor) -> Spec:
    try:
        if tensor.is_nested:
            return path, _nested_shape(tensor), tensor.dtype
        return path, tensor.shape, tensor.dtype
    except RuntimeError:  # a tensor subclass with no shape to read
        return path, torch.Size(), tensor.dtype


def _nested_shape(tensor: torch.Tensor) -> tuple[int | None, ...]:
    """A nested tensor's shape: its number of components, then each dimension, None where the components differ
    (a strided one has no ``shape``; a jagged one has a symbolic size where they differ)."""
    if tensor.layout == torch.jagged:
        return tuple(size if type(size) is int else None for size in tensor.shape)
    sizes = nested_sizes(tensor)
    return (len(sizes), *(column[0] if len(set(column)) == 1 else None for column in zip(*sizes)))


def tensor_specs(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> tuple[Spec, ...]:
    """``(path, shape, dtype)`` of every tensor in ``args`` then ``kwargs``, depth first (see the module doc).

    >>> tensor_specs((torch.zeros(4, 10),), {"mask": [torch.zeros(2, dtype=torch.bool)]})
    (((0,), torch.Size([4, 10]), torch.float32), (('mask', 0), torch.Size([2]), torch.bool))
    """
    specs = [_spec(path, tensor) for path, tensor in iter_tensor_paths(args)]
    if kwargs:
        specs.extend(_spec(path, tensor) for path, tensor in iter_tensor_paths(kwargs))
    return tuple(specs)


def output_specs(output: Any) -> tuple[Spec, ...]:
    """``tensor_specs`` of a return value; a bare tensor has the empty path."""
    return tuple(_spec(path, tensor) for path, tensor in iter_tensor_paths(output))


def _path_text(path: tuple[Any, ...]) -> str:
    return ".".join(str(key) for key in path)


def _fields(prefix: str, specs: tuple[Spec, ...]) -> dict[str, Any]:
    return {
        f"{prefix}_shapes": [list(shape) for _, shape, _ in specs],
        f"{prefix}_dtypes": [str(dtype).removeprefix("torch.") for _, _, dtype in specs],
        f"{prefix}_paths": [_path_text(path) for path, _, _ in specs],
    }


@register_meter
class ShapesMeter(Meter):
    """Input and output shapes, dtypes and paths of each module's calls (see the module doc for the layout)."""

    name = "shapes"
    wants_forward_hooks = True

    def __init__(self) -> None:
        self._pending: dict[int, tuple[Spec, ...]] = {}  # id(call) -> input specs, until its forward ends
        self._variants: dict[str, dict[tuple[Any, ...], None]] = {}  # name -> signatures, first call first
        # The top-level calls' signatures of the step running, of the first step, and how many steps had each:
        # where most steps differ from the first (lengths bucketed per batch, a short first batch), a meter that
        # counts one step describes its shapes only, while times are over every timed step.
        self._step: list[tuple[str, Any]] = []
        self._first: tuple[tuple[str, Any], ...] | None = None
        self._steps: dict[tuple[tuple[str, Any], ...], int] = {}

    def start(self, model: nn.Module, records: dict[str, ModuleRecord], entries: Sequence[tuple[str, nn.Module]]) -> None:
        self._step, self._first, self._steps = [], None, {}

    def forward_pre(self, call: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not call.recompute:
            self._pending[id(call)] = tensor_specs(args, kwargs)

    def forward_post(self, call: Any, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        inputs = self._pending.pop(id(call), None)
        if inputs is None:
            return
        signature = (inputs, output_specs(output))
        if call.parent is None:
            # The step's workload: each top-level call's first input tensor (the batch, the sequence); a recurrent
            # state that is None in a first step and a tensor after it changes no shape of the work.
            self._step.append((call.name, inputs[0] if inputs else None))
        variants = self._variants.get(call.name)
        if variants is None:
            self._variants[call.name] = {signature: None}
        elif len(variants) < MAX_VARIANTS and signature not in variants:
            variants[signature] = None

    def end_step(self, recorded: bool) -> None:
        if self._step:
            seen = tuple(self._step)
            self._step = []
            if self._first is None:
                self._first = seen
            self._steps[seen] = self._steps.get(seen, 0) + 1

    def stop(self) -> None:
        self._pending.clear()  # calls whose forward raised
        self.end_step(True)  # the block's last step, where it ended without prof.step()

    def meta(self) -> dict[str, Any]:
        """``steps_with_other_shapes``: the steps whose top-level calls' shapes differ from the first step's, where
        they are most steps (a last short batch of an epoch is not: the first step's shapes are the workload's)."""
        steps = sum(self._steps.values())
        other = steps - self._steps.get(self._first, 0) if self._first is not None else 0
        return {"steps_with_other_shapes": other} if other and 2 * other > steps else {}

    def fill(self, records: dict[str, ModuleRecord]) -> None:
        for name, record in records.items():  # (every record's: modules made while profiling joined after the start)
            variants = self._variants.get(name)
            if variants is None:
                for field in SHAPE_FIELDS:
                    setattr(record, field, None)
                continue
            inputs, outputs = next(iter(variants))
            for field, value in {**_fields("input", inputs), **_fields("output", outputs)}.items():
                setattr(record, field, value)
            record.shape_variants = len(variants)  # type: ignore[attr-defined]


