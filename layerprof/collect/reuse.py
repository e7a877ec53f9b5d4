"""What a ``with LayerProf(model)`` block builds from the model's structure, kept for the next block on the same
model while nothing it was built from has changed: the walk of the model (names, unique modules, shared ones),
the check of its children for TorchScript and torch.compile, the name map, the shape of the record tree, and
figures that meters derive from it (the parameter figures).

A plan is keyed by a fingerprint of everything it was built from, checked with C-level ``map`` calls over the
modules of the last walk, no Python loop per module: each module's class and forward pre-hook dict, its children,
parameters and buffers (names, and identities by weak reference: compared with ``is``, so no object's address is
mistaken for a dead one's), and each tensor's dtype, ``requires_grad`` and shape. An added, removed or replaced
module or tensor, a child swapped by attribute or written into ``_modules`` directly, a dtype change (``.half()``
swaps ``param.data`` under the same Parameter) and freezing all change it, and the next block walks the model
again. Nothing here holds the model: plans sit in a ``WeakKeyDictionary`` by model and refer to modules and
tensors by weak reference, so a dropped model takes its plan with it, and a module or tensor that died is a
change. A model with a lazy (uninitialized) parameter gets no plan: its shapes are still to come.
"""
from __future__ import annotations

import weakref
from itertools import chain, repeat
from operator import attrgetter, is_, is_not
from functools import partial
from typing import Any, Callable

from torch import nn

from ..record.records import ModuleRecord, module_paths

__all__ = ["Plan", "plan_for", "known", "Fingerprint"]

_children = attrgetter("_modules")
_params = attrgetter("_parameters")
_buffers = attrgetter("_buffers")
_pre_hooks = attrgetter("_forward_pre_hooks")
_dtype, _requires_grad, _shape = attrgetter("dtype"), attrgetter("requires_grad"), attrgetter("shape")
_flat = chain.from_iterable
_values, _keys = dict.values, dict.keys
_not_none = partial(is_not, None)
_LAZY = nn.parameter.UninitializedTensorMixin
_dereference = weakref.ref.__call__


_is_none = partial(is_, None)


def _held(children: list[Any], params: list[Any], buffers: list[Any]) -> list[Any]:
    """What the modules hold, in order: every child, then every parameter, then every buffer (None entries too)."""
    return [*_flat(map(_values, children)), *_flat(map(_values, params)), *_flat(map(_values, buffers))]


class Fingerprint:
    """Everything a plan is built from, for ``modules`` in walk order: their classes and forward pre-hook dicts
    (by ``id``: the tracker's keys), the names in their ``_modules``, ``_parameters`` and ``_buffers``, what those
    hold (which entries are None, the others by weak reference) and each tensor's dtype, ``requires_grad`` and
    shape. ``Fingerprint.of`` gives None where a parameter or buffer is lazy, or a tensor has no plain shape
    (nested) or takes no weak reference."""

    __slots__ = ("types", "hook_keys", "child_counts", "counts", "names", "none_at", "refs", "children_held",
                 "dtypes", "grads", "shapes")

    @classmethod
    def of(cls, modules: list[nn.Module]) -> Fingerprint | None:
        children = list(map(_children, modules))
        params = list(map(_params, modules))
        buffers = list(map(_buffers, modules))
        held = _held(children, params, buffers)
        key = cls()
        key.child_counts = list(map(len, children))
        key.none_at = list(map(_is_none, held))
        present = list(filter(_not_none, held))
        key.children_held = sum(map(len, children)) - sum(key.none_at[:sum(key.child_counts)])
        tensors = present[key.children_held:]
        if any(issubclass(kind, _LAZY) for kind in set(map(type, tensors))):
            return None
        try:
            key.refs = list(map(weakref.ref, present))
            key.dtypes, key.grads, key.shapes = _tensor_facts(tensors)
        except (RuntimeError, TypeError, AttributeError):
            return None
        key.types = list(map(type, modules))
        key.hook_keys = list(map(id, map(_pre_hooks, modules)))
        key.counts = [*key.child_counts, *map(len, params), *map(len, buffers)]
        key.names = [*_flat(map(_keys, children)), *_flat(map(_keys, params)), *_flat(map(_keys, buffers))]
        return key

    def matches(self, modules: list[nn.Module]) -> bool:
        """Whether ``modules`` (the plan's, alive) are as they were. Identities are compared with ``is`` against
        the references, and a held object that died reads None: never ``is`` an entry that is not None."""
        if list(map(type, modules)) != self.types:
            return False
        if list(map(id, map(_pre_hooks, modules))) != self.hook_keys:
            return False
        children = list(map(_children, modules))
        params = list(map(_params, modules))
        buffers = list(map(_buffers, modules))
        if [*map(len, children), *map(len, params), *map(len, buffers)] != self.counts:
            return False
        if [*_flat(map(_keys, children)), *_flat(map(_keys, params)), *_flat(map(_keys, buffers))] != self.names:
            return False
        held = _held(children, params, buffers)
        if list(map(_is_none, held)) != self.none_at:
            return False
        present = list(filter(_not_none, held))  # as many as the references: the same entries are None
        if not all(map(is_, present, map(_dereference, self.refs))):
            return False
        try:
            return _tensor_facts(present[self.children_held:]) == (self.dtypes, self.grads, self.shapes)
        except (RuntimeError, TypeError, AttributeError):
            return False

    def same_children(self, modules: list[nn.Module]) -> bool:
        """Whether ``modules`` still hold the children they held: then the model holds no module it did not."""
        children = list(map(_children, modules))
        if list(map(len, children)) != self.child_counts:
            return False
        held = [*_flat(map(_values, children))]
        return (list(map(_is_none, held)) == self.none_at[:len(held)]
                and all(map(is_, filter(_not_none, held), map(_dereference, self.refs[:self.children_held]))))


def _tensor_facts(tensors: list[Any]) -> tuple[list[Any], list[bool], list[Any]]:
    return list(map(_dtype, tensors)), list(map(_requires_grad, tensors)), list(map(_shape, tensors))


class Plan:
    """One walk of a model: its ``module_paths`` (a shared module once per name), the unique modules with their
    first names (``entries``), each module's record shape (class name, parent, other names), and ``values``:
    figures derived from the model while this plan holds (``layerprof._derived``)."""

    __slots__ = ("_refs", "_path_names", "_path_index", "names", "hook_names", "key", "_records", "_first_names",
                 "_has_children", "values", "__weakref__")

    def __init__(self, paths: list[tuple[str, nn.Module]]) -> None:
        index: dict[int, int] = {}  # id(module) -> entry index
        by_name: dict[str, int] = {}  # first name -> entry index
        modules: list[nn.Module] = []
        path_index = []
        records: list[tuple[str, str, int, list[str]]] = []  # name, class name, parent's entry index, aliases
        for name, module in paths:
            known_at = index.get(id(module))
            if known_at is not None:
                records[known_at][3].append(name)
                path_index.append(known_at)
                continue
            index[id(module)] = len(modules)
            path_index.append(len(modules))
            parent = by_name[name.rpartition(".")[0]] if name else -1  # as build_tree attaches records
            by_name[name] = len(modules)
            modules.append(module)
            records.append((name, type(module).__name__, parent, []))
        self._refs = [weakref.ref(module) for module in modules]
        self._path_names = [name for name, _ in paths]
        self._path_index = path_index
        self.names = dict(zip(map(id, modules), by_name))  # id(module) -> its first name
        self._records = records
        self._first_names = list(by_name)
        self._has_children = [False] * len(records)  # whether a record is some record's parent
        for _, _, parent, _ in records:
            if parent >= 0:
                self._has_children[parent] = True
        self.key = Fingerprint.of(modules)
        # The tracker's names (id of a module's forward pre-hook dict -> first name), which the key checks.
        self.hook_names = {} if self.key is None else dict(zip(self.key.hook_keys, by_name))
        self.values: dict[str, Any] = {}

    def modules(self) -> list[nn.Module] | None:
        """The unique modules in walk order, or None when one of them has died (the model changed)."""
        modules = list(map(_dereference, self._refs))
        return None if None in modules else modules

    def same_children(self, modules: list[nn.Module]) -> bool:
        """Whether ``modules`` (this plan's, in order) still have the children they had when it was made: then the
        model holds no module the plan does not know."""
        return self.key is not None and self.key.same_children(modules)

    def paths(self, modules: list[nn.Module]) -> list[tuple[str, nn.Module]]:
        return list(zip(self._path_names, map(modules.__getitem__, self._path_index)))

    def entries(self, modules: list[nn.Module]) -> list[tuple[str, nn.Module]]:
        return list(zip(self._first_names, modules))

    def records(self) -> tuple[ModuleRecord, dict[str, ModuleRecord]]:
        """A new record tree, as ``build_tree(reprs=False)`` makes it: root and records by name, in walk order.
        Linked by plain attribute stores, as ``attach`` does without anytree's checks: a record made by its
        ``__init__`` and written only through attributes keeps its values inline (CPython 3.11+), which is
        cheaper to make, fill and free than a record whose ``__dict__`` was read."""
        made: list[ModuleRecord] = []
        record_type = ModuleRecord
        for (name, type_name, parent, aliases), parents in zip(self._records, self._has_children):
            record = record_type(name, type_name)
            if aliases:
                record.aliases = list(aliases)
            if parent >= 0:
                holder = made[parent]
                record._NodeMixin__parent = holder
                holder._NodeMixin__children.append(record)
            if parents:
                record._NodeMixin__children = []
            made.append(record)
        return made[0], dict(zip(self._first_names, made))


# model -> its plan. Weak on the model; the plan refers to the modules weakly.
_PLANS: "weakref.WeakKeyDictionary[nn.Module, Plan]" = weakref.WeakKeyDictionary()
def known(model: nn.Module) -> bool:
    """Whether ``model`` has a plan from an earlier block (still to be verified against the model)."""
    return model in _PLANS


def plan_for(model: nn.Module, check: Callable[[list[tuple[str, nn.Module]]], None]
             ) -> tuple[Plan, list[nn.Module]]:
    """The model's plan and its modules: the earlier block's if the model's fingerprint is unchanged, else a new
    walk, passed to ``check`` (which raises for a child that cannot be profiled) before it is planned."""
    plan = _PLANS.get(model)
    if plan is not None:
        modules = plan.modules()
        if modules is not None and plan.key is not None and plan.key.matches(modules):
            return plan, modules
        del _PLANS[model]
    paths = module_paths(model)
    check(paths)
    plan = Plan(paths)
    modules = plan.modules()
    assert modules is not None  # they are all held by ``paths`` here
    if plan.key is not None:
        _PLANS[model] = plan
    return plan, modules
