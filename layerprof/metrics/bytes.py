"""Bytes moved by an aten op: one registry of overrides keyed by aten op, filled by ``register_bytes_formula``.

The default counts what an op reads and writes at its boundary, as a kernel that reads each input once and
writes each output once would (no cache reuse, no intermediate spills):

* reads: every tensor argument, each storage once per op (``x * x`` reads ``x`` once), a view by the elements it
  covers (``x[:, :8]`` reads its slice, not the whole storage), several views of one storage up to its size;
* writes: every tensor output, the same way; an in-place op (``relu_``) reads and writes its argument, an
  ``out=`` argument is written only;
* view ops (``view``, ``t``, ``expand``, ...), their in-place forms (``unsqueeze_``, ``t_``, ``as_strided_``:
  they change a tensor's sizes and strides, not its data) and allocations (``empty``) move nothing.

An override takes the op's arguments as they are (tensors, not shapes) plus ``out=`` (the op's result) and
returns the bytes. ``embedding`` reads only the rows it gathers; ``copy_`` and ``fill_`` do not read their
destination. An op decomposed for FLOP counting is counted by its parts (an upper bound of a fused kernel).

>>> import torch
>>> x = torch.zeros(4, 8)  # 32 float32 = 128 bytes
>>> op_bytes(torch.ops.aten.mul.Tensor, (x, x), {}, x * x)  # reads x once (128), writes 128
256
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .._torch import sparse_parts, storage_key
from .packed import packed_linear_bytes

__all__ = ["BYTES_FORMULAS", "register_bytes_formula", "op_bytes", "tensor_bytes", "BytesFormula"]

aten = torch.ops.aten

BytesFormula = Callable[..., int]

BYTES_FORMULAS: dict[Any, BytesFormula] = {}
_PLANS: dict[Any, tuple[BytesFormula | None, frozenset[str]]] = {}  # op overload -> (override, out= names)


def register_bytes_formula(*ops: Any) -> Callable[[BytesFormula], BytesFormula]:
    """Decorator: count the bytes of ``ops`` (packets or overloads) with the decorated function
    ``f(*args, out=result, **kwargs) -> int``; a later registration replaces an earlier one."""
    if not ops:
        raise TypeError("register_bytes_formula needs at least one op, e.g. @register_bytes_formula(torch.ops.aten.mm)")

    def register(formula: BytesFormula) -> BytesFormula:
        for op in ops:
            BYTES_FORMULAS[getattr(op, "overloadpacket", op)] = formula
        _PLANS.clear()
        return formula

    return register


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes of the elements a tensor (or view) covers."""
    return tensor.numel() * tensor.element_size()


def _stored_bytes(tensor: torch.Tensor) -> int:
    """The bytes a tensor without strides holds: a sparse one's indices and values (its dense size would count
    every zero: 1.6 KB for a 20-node ring of 40 edges, 800 bytes stored), else its elements."""
    parts = sparse_parts(tensor)
    return tensor_bytes(tensor) if parts is None else sum(map(tensor_bytes, parts))


def _tensors(values: Any, skip: frozenset[str] = frozenset(), kwargs: dict[str, Any] | None = None) -> list[Any]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, torch.Tensor))
    if kwargs:
        for key, value in kwargs.items():
            if key in skip:
                continue
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(item for item in value if isinstance(item, torch.Tensor))
    return found


def _read_bytes(tensor: torch.Tensor) -> int:
    """The bytes of the elements a view reads: an expanded dimension (stride 0) reads its one element once, as an
    op that broadcasts the unexpanded tensor does."""
    try:
        strides = tensor.stride()
    except (RuntimeError, NotImplementedError):  # (sparse: no strides)
        return _stored_bytes(tensor)
    if 0 not in strides or not tensor.numel():
        return tensor_bytes(tensor)
    covered = tensor.element_size()
    for size, stride in zip(tensor.shape, strides):
        if stride:
            covered *= size
    return covered


def _view_bytes(tensor: torch.Tensor) -> int:
    """``_read_bytes``, at most the storage's size: a view whose elements overlap (``unfold``'s windows) reads its
    storage once, as several views of one storage do (``_unique_bytes``)."""
    read = _read_bytes(tensor)
    try:
        if tensor.is_contiguous():  # (no overlap: read as it is, without a look at the storage)
            return read
        return min(read, tensor.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # no storage (sparse, functional wrappers): its elements
        return read


def _unique_bytes(tensors: list[Any]) -> int:
    """Each storage once, several distinct views of it summed up to the storage's size."""
    if len(tensors) == 1:
        tensor = tensors[0]
        return 0 if tensor.is_nested else _view_bytes(tensor)
    per_storage: dict[int, list[Any]] = {}
    total = 0
    for tensor in tensors:
        if tensor.is_nested:
            continue
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no storage (sparse, functional wrappers): its elements
            total += _stored_bytes(tensor)
            continue
        key = storage_key(storage)
        seen = per_storage.get(key)
        view = (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if seen is None:
            per_storage[key] = [storage.nbytes(), min(storage.nbytes(), _read_bytes(tensor)), {view}]
        elif view not in seen[2]:
            seen[2].add(view)
            seen[1] = min(seen[0], seen[1] + _read_bytes(tensor))
    return total + sum(size for _, size, _ in per_storage.values())


def _plan(op: Any) -> tuple[BytesFormula | None, frozenset[str]]:
    plan = _PLANS.get(op)
    if plan is None:
        schema = getattr(op, "_schema", None)
        outs = frozenset(
            argument.name for argument in (schema.arguments if schema is not None else ())
            if argument.kwarg_only and argument.alias_info is not None and argument.alias_info.is_write
        )
        formula = BYTES_FORMULAS.get(getattr(op, "overloadpacket", op))
        if formula is None and _changes_only_metadata(op):
            formula = nothing
        plan = _PLANS[op] = (formula, outs)
    return plan


def _changes_only_metadata(op: Any) -> bool:
    """An in-place view (``unsqueeze_``, ``transpose_``, ``as_strided_``): it mutates its self's sizes, strides or
    offset, no element. Torch tags these ``inplace_view``; an untagged op counts when it writes only its self and
    its out-of-place form of the same overload is a view (``foo_`` of a ``foo`` that returns an alias)."""
    if torch.Tag.inplace_view in getattr(op, "tags", ()):
        return True
    schema = getattr(op, "_schema", None)
    packet = getattr(op, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if schema is None or not name.endswith("_") or name.startswith("__"):
        return False
    written = [argument.name for argument in schema.arguments
               if argument.alias_info is not None and argument.alias_info.is_write]
    if written != ["self"]:
        return False
    namespace, _, _ = getattr(packet, "_qualified_op_name", "").partition("::")
    functional = getattr(getattr(torch.ops, namespace, None), name[:-1], None) if namespace else None
    overload = getattr(op, "_overloadname", None)
    if functional is None or overload not in functional.overloads():
        return False
    return bool(getattr(getattr(functional, overload), "is_view", False))


def op_bytes(op: Any, args: Any, kwargs: dict[str, Any], out: Any) -> int:
    """Bytes an op reads plus bytes it writes (see the module's docstring)."""
    formula, outs = _plan(op)
    if formula is not None:
        return int(formula(*args, out=out, **kwargs))
    reads = _tensors(args, outs, kwargs)
    writes = _tensors((out,))
    return (_unique_bytes(reads) if reads else 0) + (_unique_bytes(writes) if writes else 0)


# -- overrides ---------------------------------------------------------------------------------------------
def _written(out: Any) -> int:
    writes = _tensors((out,))
    return _unique_bytes(writes) if writes else 0


def nothing(*args: Any, **kwargs: Any) -> int:
    """Moves no data: an allocation, an alias or a query of metadata."""
    return 0


for _name in ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "alias",
              "lift_fresh", "detach", "set_", "resize_", "_resize_output_", "_assert_async",
              "_assert_tensor_metadata", "_fused_sdp_choice", "_has_compatible_shallow_copy_type", "sym_size",
              "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_nested_tensor_size", "is_coalesced"):
    if hasattr(aten, _name):
        register_bytes_formula(getattr(aten, _name))(nothing)
register_bytes_formula(torch.ops.prim.device)(nothing)


def written_only(template: Any, *args: Any, out: Any = None, **kwargs: Any) -> int:
    """An allocation filled from its arguments (``zeros_like``, ``new_ones``): the template tensor gives only its
    shape, dtype and device, so nothing is read; the result is written."""
    return _written(out)  # template: [*dims] (not read) -> out: written


for _name in ("zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_zeros",
              "new_ones", "new_full"):
    if hasattr(aten, _name):
        register_bytes_formula(getattr(aten, _name))(written_only)


@register_bytes_formula(aten.copy_, aten._copy_from, aten._copy_from_and_resize)
def copy_bytes(destination: torch.Tensor, source: Any, *args: Any, out: Any = None, **kwargs: Any) -> int:
    """Reads the source, writes the destination (whose old values are not read)."""
    if not isinstance(source, torch.Tensor):
        read = 0
    else:  # (an expanded or overlapping source read once; a nested one by its elements)
        read = tensor_bytes(source) if source.is_nested else _view_bytes(source)
    return read + tensor_bytes(destination)  # src: [*dims] -> dst: [*dims]


@register_bytes_formula(aten.fill_, aten.zero_, aten.normal_, aten.uniform_, aten.bernoulli_, aten.random_,
                        aten.exponential_)
def fill_bytes(destination: torch.Tensor, *args: Any, out: Any = None, **kwargs: Any) -> int:
    """Writes every element of the destination; a tensor fill value is read too."""
    values = args[0] if args and isinstance(args[0], torch.Tensor) else None
    return tensor_bytes(destination) + (tensor_bytes(values) if values is not None else 0)


@register_bytes_formula(aten.embedding)
def embedding_bytes(weight: torch.Tensor, indices: torch.Tensor, *args: Any, out: Any = None, **kwargs: Any) -> int:
    """A lookup reads its indices and only the rows they gather, and writes those rows."""
    # weight: [num, dim], indices: [*idx] -> out: [*idx, dim]; rows read = rows written
    return tensor_bytes(indices) + 2 * _written(out)


@register_bytes_formula(aten.index_select)
def index_select_bytes(source: torch.Tensor, dim: int, index: torch.Tensor, *args: Any, out: Any = None,
                       **kwargs: Any) -> int:
    """Reads the index and the slices it selects, writes them."""
    return tensor_bytes(index) + 2 * _written(out)  # source: [..., n, ...], index: [k] -> out: [..., k, ...]


for _name, _itemsize in (("linear_dynamic", 1), ("linear_relu_dynamic", 1), ("linear_dynamic_fp16", 2),
                         ("linear_relu_dynamic_fp16", 2)):
    # A dynamically quantized Linear's weight is packed in an object, no tensor: priced from the shapes it multiplies.
    if hasattr(torch.ops.quantized, _name):
        register_bytes_formula(getattr(torch.ops.quantized, _name))(packed_linear_bytes(_itemsize))
