"""Each record's class name and ``extra_repr``, read when a block stops (a lazy module shows what it materialised
as, as the model's own repr does), and the text kept for the next block on the same model where it cannot differ.

torch.nn's own ``extra_repr`` of its costlier layers (Linear, Conv, the norms, Embedding: a microsecond or more
each, most of it ``self.bias`` through ``nn.Module.__getattr__`` and ``str.format``) formats a few plain
attributes of the module and whether its bias is None. For a module of exactly such a class, the text is kept with
those values, held, and the bias's None-ness. The next block whose plan is the same (``collect/reuse.py``) reuses
the text while every value is the same object and the bias as it was, and calls ``extra_repr`` otherwise. Only
immutable values (numbers, strings, None, tuples of them) are kept: held, such a value cannot change in place nor
give its address to another. A class not listed, a subclass, an ``extra_repr`` set on the instance or replaced
on the class, an attribute missing: called at every block, as are the cheap ones (Dropout, activations).
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

# torch.nn's extra_repr function -> (a getter of the attributes it formats, whether it reads ``self.bias``), each
# read in torch's source.
_READS: dict[Callable[..., str], tuple[Callable[[dict[str, Any]], tuple[Any, ...]], bool]] = {}


def _reads(cls: type, names: tuple[str, ...], bias: bool) -> None:
    assert len(names) > 1, "a getter of one name returns the value, not a tuple (``_kept_group`` flattens tuples)"
    _READS[cls.extra_repr] = (itemgetter(*names), bias)


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
_values_of, _text_of, _no_bias_of, _function_of = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
_flat = chain.from_iterable

_IMMUTABLE = frozenset({int, float, bool, str, bytes, complex, type(None), torch.Size})
_ABSENT = object()
_bias_of = methodcaller("get", "bias", _ABSENT)


def _immutable(value: Any) -> bool:
    kind = type(value)
    if kind in _IMMUTABLE:
        return True
    return kind is tuple and all(map(_immutable, value))


# (the values formatted, held; the text; whether the bias was None, None where not read; the extra_repr function)
_Kept = tuple[tuple[Any, ...], str, "bool | None", Any]


def _kept_text(module: nn.Module, own: dict[str, Any], function: Any, known: _Kept | None) -> tuple[str, _Kept | None]:
    """The text of a module of a kept class (``own``: its ``__dict__``): ``known``'s when made from the same
    values, else its ``extra_repr()``; and what to keep for the next block (None: nothing)."""
    getter, reads_bias = _READS[function]
    try:
        values = getter(own)
    except KeyError:  # an attribute deleted: extra_repr says what it says
        return module.extra_repr(), None
    no_bias = None
    if reads_bias:
        bias = own["_parameters"].get("bias", _ABSENT)
        if bias is _ABSENT or "bias" in own:  # not a parameter that torch's __getattr__ would find
            return module.extra_repr(), None
        no_bias = bias is None
    if known is not None and known[3] is function and known[2] is no_bias and all(map(is_, values, known[0])):
        return known[1], known
    text = module.extra_repr()
    return text, ((values, text, no_bias, function) if all(map(_immutable, values)) else None)


# What a block read of its modules' reprs: each module's class name where a class changed since the plan was made
# (None: the plan's names hold), and entry index -> extra_repr text for the modules with an extra_repr of their own.
Reprs = tuple["list[str] | None", dict[int, str]]


def read_reprs(modules: list[nn.Module], plan: Plan | None, owns: list[dict[str, Any]] | None = None) -> Reprs:
    """Each module's class name and ``extra_repr`` now (``modules``: the block's entries' modules, in order),
    written onto records by ``write_reprs``. ``plan``: the block's plan when its entries are the plan's, whose
    records have their modules' class names already and which keeps the texts for the next block (``owns``: the
    modules' ``__dict__``, if read already). A module whose class and instance have no ``extra_repr`` of their own
    (containers) has nn.Module's, which is ""."""
    types = list(map(type, modules))
    if plan is not None and plan.key is None:
        plan = None
    if plan is None or types != plan.types:
        return [kind.__name__ for kind in types], _read_each(modules, types, plan)
    if owns is None:
        owns = list(map(_own, modules))
    if any(map(contains, owns, repeat("extra_repr"))):
        return None, _read_each(modules, types, plan)
    # The plan's modules by class, read a class at a time with C-level calls: no Python code per module where
    # the texts are the kept ones.
    groups = plan.repr_groups
    if groups is None:
        groups = plan.repr_groups = _by_class(types)
    kept = plan.reprs
    fresh: dict[int, _Kept] = {}
    texts: dict[int, str] = {}
    for kind, indices in groups.items():
        function = kind.extra_repr
        if function is _PLAIN_REPR:
            continue
        if _KEPT.get(kind) is not function:
            texts.update(zip(indices, map(function, map(modules.__getitem__, indices))))
            continue
        found = _kept_group(function, indices, list(map(owns.__getitem__, indices)), kept)
        if found is not None:
            texts.update(zip(indices, map(_text_of, found)))
            fresh.update(zip(indices, found))
            continue
        for index in indices:
            text, keep = _kept_text(modules[index], owns[index], function, kept.get(index))
            if keep is not None:
                fresh[index] = keep
            texts[index] = text
    plan.reprs = fresh
    return None, texts


def _by_class(types: list[type]) -> dict[type, list[int]]:
    """Entry indices by class, in entry order."""
    groups: dict[type, list[int]] = {}
    for index, kind in enumerate(types):
        groups.setdefault(kind, []).append(index)
    return groups


def _kept_group(function: Any, indices: list[int], owns: list[dict[str, Any]], kept: dict[int, _Kept]
                ) -> list[_Kept] | None:
    """What was kept for the modules at ``indices`` (all of one kept class, whose extra_repr is ``function``;
    ``owns``: their ``__dict__``) when each still holds the same values, and its bias as it was; else None (then
    each is read on its own)."""
    known = list(map(kept.get, indices))
    if any(map(is_, known, repeat(None))) or not all(map(is_, map(_function_of, known), repeat(function))):
        return None
    getter, reads_bias = _READS[function]
    try:
        values = list(map(getter, owns))
    except KeyError:
        return None
    if reads_bias:
        biases = list(map(_bias_of, map(_parameters, owns)))
        if (any(map(is_, biases, repeat(_ABSENT))) or any(map(contains, owns, repeat("bias")))
                or list(map(is_, biases, repeat(None))) != list(map(_no_bias_of, known))):
            return None
    # Every getter reads two names or more, so that each module's values are a tuple of one length.
    if not all(map(is_, _flat(values), _flat(map(_values_of, known)))):
        return None
    return known


def _read_each(modules: list[nn.Module], types: list[type], plan: Plan | None) -> dict[int, str]:
    """``read_reprs``'s texts, a module at a time: for a plan whose classes changed, or a module with an
    ``extra_repr`` of its own."""
    kept = plan.reprs if plan is not None else {}
    fresh: dict[int, _Kept] = {}
    texts: dict[int, str] = {}
    plain = _PLAIN_REPR
    kept_classes = _KEPT
    for index, module, kind in zip(range(len(modules)), modules, types):
        function = kind.extra_repr
        own = module.__dict__
        if function is plain and "extra_repr" not in own:
            continue
        if plan is None or kept_classes.get(kind) is not function or "extra_repr" in own:
            text = module.extra_repr()
        else:
            text, keep = _kept_text(module, own, function, kept.get(index))
            if keep is not None:
                fresh[index] = keep
        texts[index] = text
    if plan is not None:
        plan.reprs = fresh
    return texts


def write_reprs(records: list[ModuleRecord], reprs: Reprs) -> None:
    """Write what ``read_reprs`` read onto ``records`` (the entries' records, in the same order)."""
    names, texts = reprs
    if names is not None:
        for record, name in zip(records, names):
            record.type = name
    for index, text in texts.items():
        records[index].extra_repr = text
