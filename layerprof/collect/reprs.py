"""Each record's class name and ``extra_repr``, read when a block stops (a lazy module shows what it materialised
as, as the model's own repr does), and the text kept for the next block on the same model where it cannot differ.

torch.nn's own ``extra_repr`` of its common layers (Linear, Conv, the norms, Embedding: a microsecond or more
each, most of it ``self.bias`` through ``nn.Module.__getattr__`` and ``str.format``; Dropout and the activations,
cheaper, but as many) formats a few plain attributes of the module and whether its bias is None. For the modules of
exactly such a class, the texts are kept with those values, held, and the biases' None-ness, a list per class.
The next block whose plan is the same (``collect/reuse.py``) reuses a class's texts (the same list) while every
value is the same object and each bias as it was, checked with a few C-level passes per class, and calls
``extra_repr`` of the modules whose values changed. Only immutable values (numbers, strings, None, tuples of them)
are kept: held, such a value cannot change in place nor give its address to another. A class not listed, a
subclass, an ``extra_repr`` set on the instance or replaced on the class, an attribute missing: called at every
block.
"""
from __future__ import annotations

from itertools import chain, repeat
from operator import attrgetter, contains, is_, itemgetter, methodcaller
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from ..record.records import ModuleRecord
from .reuse import Plan

__all__ = ["read_reprs", "write_reprs", "Reprs"]

_PLAIN_REPR = nn.Module.extra_repr
_MODULE_REPR = nn.Module.__repr__

# torch.nn's extra_repr function -> (a getter of the attributes it formats from a module's ``__dict__``, how many,
# whether it reads ``self.bias``), each read in torch's source.
_READS: dict[Callable[..., str], tuple[Callable[[dict[str, Any]], Any], int, bool]] = {}


def _reads(cls: type, names: tuple[str, ...], bias: bool) -> None:
    # (a getter of one name returns the value, of several a tuple, which ``_read_group`` flattens)
    assert cls.extra_repr is not _PLAIN_REPR, f"{cls.__name__} formats nothing"
    _READS[cls.extra_repr] = (itemgetter(*names), len(names), bias)


_reads(nn.Linear, ("in_features", "out_features"), True)
_reads(nn.Bilinear, ("in1_features", "in2_features", "out_features"), True)
_reads(nn.LayerNorm, ("normalized_shape", "eps", "elementwise_affine"), True)
_reads(nn.GroupNorm, ("num_groups", "num_channels", "eps", "affine"), True)
_reads(nn.BatchNorm1d, ("num_features", "eps", "momentum", "affine", "track_running_stats"), True)
_reads(nn.Embedding, ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "norm_type",
                      "scale_grad_by_freq", "sparse"), False)
_reads(nn.Conv1d, ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "output_padding",
                   "groups", "padding_mode"), True)
if hasattr(nn, "RMSNorm"):
    _reads(nn.RMSNorm, ("normalized_shape", "eps", "elementwise_affine"), False)
_reads(nn.Dropout, ("p", "inplace"), False)  # (_DropoutNd's: every Dropout class)
for _activation in (nn.ReLU, nn.ReLU6, nn.SiLU, nn.Mish):
    _reads(_activation, ("inplace",), False)
for _activation in (nn.Softmax, nn.LogSoftmax, nn.Softmin):
    _reads(_activation, ("dim",), False)
_reads(nn.GELU, ("approximate",), False)
_reads(nn.LeakyReLU, ("negative_slope", "inplace"), False)
_reads(nn.ELU, ("alpha", "inplace"), False)

# Exact class -> its torch.nn extra_repr: every torch.nn class whose extra_repr is one of the functions above (not
# the lazy ones: a lazy module becomes its plain class once it has run), and MultiheadAttention's out_proj Linear.
_KEPT: dict[type, Any] = {
    cls: cls.extra_repr
    for cls in (*(value for value in vars(nn).values() if isinstance(value, type)),
                nn.modules.linear.NonDynamicallyQuantizableLinear)
    if issubclass(cls, nn.Module) and not issubclass(cls, LazyModuleMixin) and cls.extra_repr in _READS
}

_own = attrgetter("__dict__")
_parameters = itemgetter("_parameters")
_flat = chain.from_iterable

_IMMUTABLE = frozenset({int, float, bool, str, bytes, complex, type(None), torch.Size})
_ABSENT = object()
_UNKEPT = object()  # held in place of a value that is not kept: no value read from a module is this object
_bias_of = methodcaller("get", "bias", _ABSENT)


def _immutable(value: Any) -> bool:
    kind = type(value)
    if kind in _IMMUTABLE:
        return True
    return kind is tuple and all(map(_immutable, value))


class _Kept:
    """What the last block read of a plan's modules of one kept class (in entry order): the extra_repr function,
    the values it formats, flat (``width`` per module; ``_UNKEPT`` for a value not kept), held, each bias's
    None-ness (None where the function does not read the bias), and the texts. Flat lists per class, not a tuple
    per module: the next block checks a class with a few C-level passes over contiguous lists."""

    __slots__ = ("function", "width", "values", "no_bias", "texts", "all_held")

    def __init__(self, function: Any, width: int, values: list[Any], no_bias: list[bool] | None,
                 texts: list[str]) -> None:
        self.function, self.width, self.values, self.no_bias, self.texts = function, width, values, no_bias, texts
        # Whether every value is held: then the texts hold while nothing is written into the modules.
        self.all_held = not any(map(is_, values, repeat(_UNKEPT)))


# What a block read of its modules' reprs: each module's class name where a class changed since the plan was made
# (None: the plan's names hold), and the extra_repr texts of the modules with an extra_repr of their own, as
# (entry indices, their texts) pairs: a class's pair is the last block's where its texts hold.
Reprs = tuple["list[str] | None", list[tuple[list[int], list[str]]]]


def read_reprs(modules: list[nn.Module], plan: Plan | None, owns: list[dict[str, Any]] | None = None,
               unchanged: bool = False) -> Reprs:
    """Each module's class name and ``extra_repr`` now (``modules``: the block's entries' modules, in order),
    written onto records by ``write_reprs``. ``plan``: the block's plan when its entries are the plan's, whose
    records have their modules' class names already and which keeps the texts for the next block (``owns``: the
    modules' ``__dict__``, if read already). ``unchanged``: the classes are the plan's and nothing was written
    into a module (``reuse.written``) since the plan's texts were last read, which then hold as they are. A module
    whose class and instance have no ``extra_repr`` of their own (containers) has nn.Module's, which is ""."""
    if unchanged:
        assert plan is not None
        types = plan.types
    else:
        types = list(map(type, modules))
        if plan is not None and plan.key is None:
            plan = None
        if plan is None or types != plan.types:
            return [kind.__name__ for kind in types], _read_each(modules, types)
        if owns is None:
            owns = list(map(_own, modules))
        if any(map(contains, owns, repeat("extra_repr"))):  # (set on an instance: written into its __dict__)
            return None, _read_each(modules, types)
    # The plan's modules by class, read a class at a time with C-level calls: no Python code per module where
    # the texts are the kept ones.
    groups = plan.repr_groups
    if groups is None:
        groups = plan.repr_groups = _by_class(types)
    kept: dict[type, _Kept] = plan.reprs
    texts: list[tuple[list[int], list[str]]] = []
    for kind, indices in groups.items():
        function = kind.extra_repr
        if function is _PLAIN_REPR:
            if _says_in_repr(kind):
                texts.append((indices, list(map(_inside_repr, map(modules.__getitem__, indices)))))
            continue
        if _KEPT.get(kind) is not function:
            texts.append((indices, list(map(function, map(modules.__getitem__, indices)))))
            continue
        known = kept.get(kind)
        if unchanged and known is not None and known.function is function and known.all_held:
            texts.append(known.texts)
            continue
        assert owns is not None
        read = _read_group(function, list(map(owns.__getitem__, indices)))
        if (known is not None and read is not None and known.function is function
                and all(map(is_, read[0], known.values)) and read[1] == known.no_bias):
            texts.append(known.texts)
            continue
        group = list(map(modules.__getitem__, indices))
        if read is None:  # an attribute missing, a bias that is not a parameter: each says what it says
            kept.pop(kind, None)
            texts.append((indices, list(map(function, group))))
            continue
        kept[kind] = now = _kept_anew(function, indices, group, read, known)
        texts.append(now.texts)
    return None, texts


def _by_class(types: list[type]) -> dict[type, list[int]]:
    """Entry indices by class, in entry order."""
    groups: dict[type, list[int]] = {}
    for index, kind in enumerate(types):
        groups.setdefault(kind, []).append(index)
    return groups


def _read_group(function: Any, owns: list[dict[str, Any]]) -> tuple[list[Any], list[bool] | None] | None:
    """What ``function`` (a kept extra_repr) formats of the modules whose ``__dict__`` are ``owns``: their values,
    flat, and whether each one's bias is None (None where it reads no bias); None where a module lacks an
    attribute or has a bias that torch's ``__getattr__`` would not find in ``_parameters``."""
    getter, width, reads_bias = _READS[function]
    try:
        values = list(map(getter, owns)) if width == 1 else [*_flat(map(getter, owns))]
    except KeyError:
        return None
    if not reads_bias:
        return values, None
    biases = list(map(_bias_of, map(_parameters, owns)))
    if any(map(is_, biases, repeat(_ABSENT))) or any(map(contains, owns, repeat("bias"))):
        return None
    return values, list(map(is_, biases, repeat(None)))


def _kept_anew(function: Any, indices: list[int], modules: list[nn.Module], read: tuple[list[Any], list[bool] | None],
               known: _Kept | None) -> _Kept:
    """A class's texts where some module's values changed since ``known`` (the last block's, if any): a module's
    kept text where its values are the same objects and its bias as it was, else its ``extra_repr()``; the
    values kept where they are immutable (held, such a value cannot change in place nor give its address to
    another)."""
    values, no_bias = read
    width = _READS[function][1]
    texts = []
    for position, module in enumerate(modules):
        mine = values[position * width:(position + 1) * width]
        if (known is not None and known.function is function
                and all(map(is_, mine, known.values[position * width:(position + 1) * width]))
                and (no_bias is None or no_bias[position] is known.no_bias[position])):
            texts.append(known.texts[1][position])
        else:
            texts.append(module.extra_repr())
    held = [value if _immutable(value) else _UNKEPT for value in values]
    return _Kept(function, width, held, no_bias, (indices, texts))


def _read_each(modules: list[nn.Module], types: list[type]) -> list[tuple[list[int], list[str]]]:
    """``read_reprs``'s texts, a module at a time: for a plan whose classes changed, or a module with an
    ``extra_repr`` of its own (the texts the plan keeps are left for the next block)."""
    indices = []
    texts = []
    plain = _PLAIN_REPR
    for index, module, kind in zip(range(len(modules)), modules, types):
        if kind.extra_repr is plain and "extra_repr" not in module.__dict__:
            if _says_in_repr(kind):
                indices.append(index)
                texts.append(_inside_repr(module))
            continue
        indices.append(index)
        texts.append(module.extra_repr())
    return [(indices, texts)]


def _says_in_repr(kind: type) -> bool:
    """Whether modules of ``kind`` say what they are in a ``__repr__`` of their own, not torch's: torch's
    containers define one (``ModuleList`` folds repeated children), which formats the whole subtree."""
    function = kind.__repr__
    return function is not _MODULE_REPR and not getattr(function, "__module__", "torch").startswith("torch.")


def _inside_repr(module: nn.Module) -> str:
    """What a leaf module whose class defines ``__repr__`` instead of ``extra_repr`` (PyTorch Geometric's
    ``Linear(16, 32, bias=True)``) shows between its parentheses, as ``extra_repr`` would give it; "" where the
    module has children (such a repr names them, timm's ``SelectAdaptivePool2d(pool_type=avg, flatten=Flatten(...))``,
    and the summary shows them on their own lines), or the repr is not one line ``Name(...)``, or raises."""
    if module._modules:
        return ""
    try:
        text = repr(module)
    except Exception:  # noqa: BLE001 - a repr that fails on this module: nothing to show, as nn.Module's own
        return ""
    start = text.find("(")
    if "\n" in text or start <= 0 or not text.endswith(")"):
        return ""
    return text[start + 1:-1]


def write_reprs(records: list[ModuleRecord], reprs: Reprs) -> None:
    """Write what ``read_reprs`` read onto ``records`` (the entries' records, in the same order)."""
    names, texts = reprs
    if names is not None:
        for record, name in zip(records, names):
            record.type = name
    for indices, group in texts:
        for index, text in zip(indices, group):
            records[index].extra_repr = text
