"""What a ``with LayerProf(model)`` block builds from the model's structure, kept for the next block on the same
model while nothing it was built from has changed: the walk of the model (names, unique modules, shared ones),
the check of its children for TorchScript and torch.compile, the name map, the shape of the record tree, and
figures that meters derive from it (the parameter figures).

A plan is keyed by a fingerprint of everything it was built from, read with C-level ``map`` calls over the
modules of the last walk, no Python loop per module: each module's class and forward pre-hook dict (which, and
how many hooks it holds), its children (names and identities, in order), its parameters and buffers (names and
identities), and each tensor's dtype, ``requires_grad`` and element count: what the figures derived from the plan
(the parameter figures: counts, bytes, dtypes, trainable) are made of. A shape changed under the same count (a
``.data`` swap to a transpose) changes none of them, and is not read: a shape costs a ``torch.Size`` per tensor,
twice what the count costs. An added, removed or replaced module or tensor, a child swapped by attribute or
written into ``_modules`` directly, a dtype change (``.half()`` swaps ``param.data`` under the same Parameter)
and freezing all change it, and the next block walks the model again. Nothing here holds the model: plans sit in a
``WeakKeyDictionary`` by model and refer to modules by weak reference, so a dropped model takes its plan with it,
and a module that died is a change (its address may be reused by a new one). A model with a lazy (uninitialized)
parameter gets no plan: its shapes are still to come.

From the second block on a plan, the key is not read again where CPython's dict versions say that nothing was
written into the tables since it last held (``table_versions``, read through torch's ``dict_version``): each of the
four tables reads the version it read then, so it holds the same entries, and only the classes and the tensors'
dtypes, ``requires_grad`` and counts are read (``Plan.unchanged``). A block's end does the same for its checks
(``written``): no attribute, child or parameter written since a block's end whose checks all passed. Right after a
step, each pass over the model's tables misses the cache, and the versions take one pass where the key takes a dozen.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, is_not, itemgetter
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from .._torch import dict_version, eager_forwards, fsdp1_wrapper, hooks_outputs_in_forward
from ..record.records import ModuleRecord, module_paths

__all__ = ["Entries", "Plan", "UNKNOWN", "plan_for", "known", "fingerprint", "table_versions", "written"]

# Read from each module's ``__dict__``: ``nn.Module`` defines ``__getattr__``, so every attribute read on a module
# goes through a slower path than a read of its dict (about 80 ns against 25 per module and field).
_own = attrgetter("__dict__")
_children = itemgetter("_modules")
_params = itemgetter("_parameters")
_buffers = itemgetter("_buffers")
_pre_hooks = itemgetter("_forward_pre_hooks")
_dtype_and_grad, _numel = attrgetter("dtype", "requires_grad"), torch.Tensor.numel
_flat = chain.from_iterable
_values, _keys = dict.values, dict.keys
_not_none = partial(is_not, None)
_LAZY = nn.parameter.UninitializedTensorMixin
_dereference = weakref.ref.__call__
# What ``Plan.first_parameter`` gives where the plan cannot tell.
UNKNOWN = object()
# A fingerprint piece's classes, pre-hook dict ids, children's counts and children's ids (``_piece``'s order).
_types, _hook_ids, _child_counts, _child_ids = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(4)
_tables = itemgetter("_modules", "_parameters", "_buffers", "_forward_pre_hooks")
_children_and_params = itemgetter("_modules", "_parameters")


# Modules per piece of a fingerprint: a piece's passes (tables, sizes, names, values, tensors) read the same few
# hundred modules' dicts and tables again while they are still in the cache; over ten thousand modules at once each
# pass misses on every one (measured cold: 19.6 ms whole, 13.3 in pieces of 512, 14.6 of 128, 13.8 of 2,048).
_PIECE = 512


def fingerprint(modules: list[nn.Module], owns: list[dict[str, Any]] | None = None
                ) -> list[tuple[Any, ...]] | None:
    """Everything a plan is built from, as plain values (ids, names, classes, dtypes, counts: no module or
    tensor), for ``modules`` in walk order (``owns``: their ``__dict__``, if read already), in pieces of
    ``_PIECE`` modules. None where a parameter or buffer is lazy, or a tensor's dtype or count cannot be read:
    such a model is not planned; so is one with a module whose ``__dict__`` lacks torch's tables."""
    if owns is None:
        owns = list(map(_own, modules))
    pieces = []
    for start in range(0, len(modules), _PIECE):
        piece = _piece(modules[start:start + _PIECE], owns[start:start + _PIECE])
        if piece is None:
            return None
        pieces.append(piece)
    return pieces


def _holds(modules: list[nn.Module], owns: list[dict[str, Any]], key: list[tuple[Any, ...]]) -> bool:
    """Whether ``fingerprint(modules, owns)`` would equal ``key``: each piece compared as soon as it is read, and
    dropped, so that the next piece's lists are made in the memory it leaves, still in the cache (cold, 10,000
    modules: 12.2 -> 11.8 ms), and a change stops the reading at its piece."""
    if len(key) != -(-len(modules) // _PIECE):
        return False
    for piece, start in zip(key, range(0, len(modules), _PIECE)):
        if _piece(modules[start:start + _PIECE], owns[start:start + _PIECE]) != piece:
            return False
    return True


def _piece(modules: list[nn.Module], owns: list[dict[str, Any]]) -> tuple[Any, ...] | None:
    """``fingerprint`` of a few modules: their classes, pre-hook dicts' ids, children (sizes, names, ids),
    parameters and buffers (sizes, names), tensors' ids, how many forward pre-hooks each has (a model whose hooks
    changed is not the one planned), and the tensors' (dtype, requires_grad) and element counts (two
    passes over the tensors: cold, 4 % less than three, and no ``torch.Size`` made per tensor)."""
    try:
        children = list(map(_children, owns))
        params = list(map(_params, owns))
        buffers = list(map(_buffers, owns))
        pre_hooks = list(map(_pre_hooks, owns))
    except KeyError:
        return None
    # Each table's size first, then names and values of the tables that hold any: most modules hold no child, no
    # parameter or no buffer, and each pass over ten thousand tables costs cache misses, not work.
    child_counts, param_counts = list(map(len, children)), list(map(len, params))
    buffer_counts = list(map(len, buffers))
    children, params, buffers = (list(compress(children, child_counts)), list(compress(params, param_counts)),
                                 list(compress(buffers, buffer_counts)))
    tensors = [*_flat(map(_values, params)), *_flat(map(_values, buffers))]
    present = list(filter(_not_none, tensors))
    for kind in set(map(type, present)):  # (a loop, not a generator: its frame is cold as a block starts)
        if issubclass(kind, _LAZY):
            return None
    try:
        tensor_keys = _tensors_read(present)
    except (RuntimeError, TypeError, AttributeError):
        return None
    return (
        list(map(type, modules)), list(map(id, pre_hooks)),
        child_counts, [*_flat(map(_keys, children))], list(map(id, _flat(map(_values, children)))),
        param_counts, [*_flat(map(_keys, params))],
        buffer_counts, [*_flat(map(_keys, buffers))],
        list(map(id, tensors)), list(map(len, pre_hooks)), *tensor_keys,
    )


# The most modules whose dicts' versions are read. Read cold, a version costs more than a length (about 0.2 µs
# against 0.05: a call through the argument parser, and a new int), and a model's tables are mostly empty: past a
# few hundred modules the key's passes, which read every table's length and the contents of the few that hold
# anything, cost less (the 1,501-module stack: 10 % more at a block's start with versions; 48-module BERT: 40 %
# less, 121 modules: 30 % less, 241: even).
_VERSIONED = 200


def table_versions(owns: list[dict[str, Any]]) -> list[int] | None:
    """The versions (``dict_version``) of the tables of the modules whose ``__dict__`` are ``owns``: children,
    parameters, buffers and forward pre-hooks, four per module. Equal readings mean that nothing was written into
    any of them in between: no module, tensor or hook added, removed or replaced. None where torch gives no
    versions, a module lacks torch's tables, or there are more than ``_VERSIONED`` modules."""
    if dict_version is None or len(owns) > _VERSIONED:
        return None
    try:
        return list(map(dict_version, _flat(map(_tables, owns))))
    except KeyError:
        return None


def written(owns: list[dict[str, Any]]) -> tuple[list[int], list[int]] | None:
    """The versions of what a block's end reads of the modules whose ``__dict__`` are ``owns``: each ``__dict__``
    (attributes: a compiled call or forward, what ``extra_repr`` formats), then its children and its parameters (a
    bias set to None). None as ``table_versions``."""
    if dict_version is None or len(owns) > _VERSIONED:
        return None
    try:
        return list(map(dict_version, owns)), list(map(dict_version, _flat(map(_children_and_params, owns))))
    except KeyError:
        return None


def _tensors_read(tensors: list[torch.Tensor]) -> tuple[list[Any], list[int]]:
    """What a fingerprint reads of tensors: each one's (dtype, requires_grad) and element count."""
    return list(map(_dtype_and_grad, tensors)), list(map(_numel, tensors))


class Entries(Sequence):
    """A block's modules with their first names, in walk order: ``(name, module)`` pairs, each made when read.
    Held as two lists, the plan's names and the block's modules: a block on ten thousand modules makes no ten
    thousand pairs (nor leaves them for the garbage collector to scan) where nothing reads them one by one."""

    __slots__ = ("names", "modules", "_shared")

    def __init__(self, names: list[str], modules: list[nn.Module]) -> None:
        self.names, self.modules = names, modules
        self._shared = True  # the lists are the plan's and the block's: copied before the first append

    def __len__(self) -> int:
        return len(self.modules)

    def __iter__(self) -> Any:
        return zip(self.names, self.modules)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(zip(self.names[index], self.modules[index]))
        return self.names[index], self.modules[index]

    def append(self, entry: tuple[str, nn.Module]) -> None:
        """A module that joined while profiling."""
        if self._shared:
            self.names, self.modules, self._shared = list(self.names), list(self.modules), False
        name, module = entry
        self.names.append(name)
        self.modules.append(module)


class Plan:
    """One walk of a model: its ``module_paths`` (a shared module once per name), the unique modules with their
    first names (``entries``), each module's record shape (class name, parent, other names), and ``values``:
    figures derived from the model while this plan holds (``layerprof._derived``)."""

    __slots__ = ("_refs", "_path_names", "_path_index", "names", "hook_names", "key", "types", "_child_counts",
                 "_child_ids", "_records", "_first_names", "_has_children", "values", "reprs",
                 "repr_groups", "classes", "_class_list", "_forwards", "_seen_tables", "_tensor_refs", "_tensor_reads",
                 "checked", "around", "_first", "_fsdp1",
                 "__weakref__")

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
        self.key = fingerprint(modules)
        key = self.key or []
        # Read from the key's pieces: each module's class, its children's count and the children's ids (the last
        # two for ``same_children``).
        self.types: list[type] = [*_flat(map(_types, key))]
        self._child_counts: list[int] = [*_flat(map(_child_counts, key))]
        self._child_ids: list[int] = [*_flat(map(_child_ids, key))]
        # The tracker's names (id of a module's forward pre-hook dict -> first name), which the key checks.
        self.hook_names = {} if self.key is None else dict(zip(_flat(map(_hook_ids, key)), by_name))
        self.values: dict[str, Any] = {}
        # Entry index -> the last block's extra_repr text and what it was made from (``collect/reprs.py``).
        self.reprs: dict[int, tuple[Any, ...]] = {}
        self.repr_groups: dict[type, list[int]] | None = None  # entry indices by class, made when first read
        self.classes = set(self.types)
        # The classes' forwards as ``eager`` last found them all eager, in the order of ``_class_list``.
        self._class_list = list(self.classes)
        self._forwards: list[Any] | None = None
        # The tables' versions when the key last held, with the tensors they held then (weakly) and what the key
        # reads of those (``unchanged``): kept from the first block that reuses the plan (a first block on a model
        # reads no more than before), none where torch gives no versions.
        self._seen_tables: list[int] | None = None
        self._tensor_refs: list[weakref.ref] = []
        self._tensor_reads: tuple[list[Any], list[int]] | None = None
        # ``written`` as the last block whose checks at its end all passed ended, where that block's entries were
        # this plan's.
        self.checked: tuple[list[int], list[int]] | None = None
        # Where the modules' calls skip the call wrapper (``_torch.calling_around``): indices, read with the checks.
        self.around: list[int] = []
        # (FSDP1's class when last asked, and whether one of the plan's classes is it or derives from it)
        self._fsdp1: tuple[type, bool] | None = None
        # The first parameter in walk order, weakly (``first_parameter``): None where the modules hold none,
        # UNKNOWN where it takes no weak reference, or where the plan has no key (the modules were not walked).
        self._first: Any = None if self.key is not None else UNKNOWN
        for table in map(_params, map(_own, modules)) if self.key is not None else ():
            first = next(filter(_not_none, table.values()), None)
            if first is not None:
                try:
                    self._first = weakref.ref(first)
                except TypeError:
                    self._first = UNKNOWN
                break

    def saw(self, owns: list[dict[str, Any]], tables: list[int] | None) -> None:
        """The key holds for the modules whose ``__dict__`` are ``owns``, whose tables read ``tables``
        (``table_versions``): kept, with their tensors and what the key reads of them, for ``unchanged``."""
        if tables is None:
            return
        tensors = list(filter(_not_none, chain(_flat(map(_values, map(_params, owns))),
                                               _flat(map(_values, map(_buffers, owns))))))
        try:
            self._tensor_refs = list(map(weakref.ref, tensors))
        except TypeError:  # a tensor without weak references: the key is read at every block
            return
        self._tensor_reads = _tensors_read(tensors)
        self._seen_tables = tables

    def unchanged(self, modules: list[nn.Module], tables: list[int]) -> bool:
        """Whether the key holds, told without reading the tables: they read ``tables`` (``table_versions``), as when it
        last held, so they hold the same modules, tensors and hooks; the classes are the plan's; and those tensors'
        dtypes, ``requires_grad`` and element counts are as then (``.half()`` or ``requires_grad_`` change a
        tensor, not a table)."""
        if tables != self._seen_tables or list(map(type, modules)) != self.types:
            return False
        # (alive: the same tables hold them)
        return _tensors_read(list(map(_dereference, self._tensor_refs))) == self._tensor_reads

    def eager(self) -> bool:
        """``eager_forwards(self.classes)``: whether no class of the plan has a compiled ``forward``, told without
        hashing the forwards where they are the functions it last found eager (a compiled forward is a new
        function): as a block starts and ends, about a third less, cold."""
        forwards = list(map(getattr, self._class_list, repeat("forward"), repeat(None)))
        try:
            if forwards == self._forwards:
                return True
        except Exception:  # noqa: BLE001 - a forward whose == raises: read as eager_forwards reads it
            pass
        if not eager_forwards(self.classes):
            return False
        self._forwards = forwards
        return True

    def hooks_outputs_in_forward(self) -> bool:
        """``_torch.hooks_outputs_in_forward(self.classes)``, kept while FSDP1's class is the one it was: read at
        every block's start, right after a step, the subclass checks over the classes are cache misses."""
        wrapper = fsdp1_wrapper()
        if wrapper is None:
            return False
        seen = self._fsdp1
        if seen is None or seen[0] is not wrapper:
            seen = self._fsdp1 = (wrapper, hooks_outputs_in_forward(self.classes))
        return seen[1]

    def first_parameter(self) -> Any:
        """The first parameter of the plan's modules in walk order (``next(model.parameters(), None)``, which the
        profile's environment reads the device and dtype of), as the plan was made: valid while the key holds and
        nothing was written into the tables since (a block's end that ``written`` finds unchanged). None where they
        hold no parameter; UNKNOWN where the plan cannot tell (the parameter takes no weak reference, or died)."""
        first = self._first
        if first is None or first is UNKNOWN:
            return first
        parameter = first()
        return UNKNOWN if parameter is None else parameter

    def modules(self) -> list[nn.Module] | None:
        """The unique modules in walk order, or None when one of them has died (the model changed)."""
        modules = list(map(_dereference, self._refs))
        return None if None in modules else modules

    def same_children(self, owns: list[dict[str, Any]]) -> bool:
        """Whether the modules whose ``__dict__`` are ``owns`` (this plan's, in order) still have the children they
        had when it was made: then the model holds no module the plan does not know."""
        if self.key is None:
            return False
        # In pieces, as the fingerprint: each piece's tables are still in the cache for the pass that reads the
        # children of those that hold any (cold, 10,000 modules: 4.3 ms whole, 3.2 in pieces of 512).
        counts: list[int] = []
        ids: list[int] = []
        try:
            for start in range(0, len(owns), _PIECE):
                children = list(map(_children, owns[start:start + _PIECE]))
                piece_counts = list(map(len, children))
                counts += piece_counts
                ids += map(id, _flat(map(_values, compress(children, piece_counts))))
        except KeyError:
            return False
        return counts == self._child_counts and ids == self._child_ids

    def paths(self, modules: list[nn.Module]) -> list[tuple[str, nn.Module]]:
        return list(zip(self._path_names, map(modules.__getitem__, self._path_index)))

    def entries(self, modules: list[nn.Module]) -> Entries:
        return Entries(self._first_names, modules)

    def records(self) -> tuple[ModuleRecord, dict[str, ModuleRecord]]:
        """A new record tree, as ``build_tree(reprs=False)`` makes it: root and records by name, in walk order.
        Linked by plain attribute stores, as ``attach`` does without anytree's checks: a record made by its
        ``__init__`` and written through attributes keeps its values inline (CPython 3.11+): cheaper to make
        and to free than a record whose ``__dict__`` was read and merged (the fills that read it pay a little)."""
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


# model -> its plan. Weak on the model; the plan refers to the modules weakly. Read through its dict of weak
# references (``data``, what its own methods read) with a reference made here: its ``get`` and ``__contains__`` are
# Python code, a frame each that is cache misses as a one-shot block starts, right after a step.
_PLANS: "weakref.WeakKeyDictionary[nn.Module, Plan]" = weakref.WeakKeyDictionary()
_BY_REFERENCE: dict[weakref.ref, Plan] = _PLANS.data  # type: ignore[assignment]
_reference = weakref.ref


def known(model: nn.Module) -> bool:
    """Whether ``model`` has a plan from an earlier block (still to be verified against the model)."""
    return _reference(model) in _BY_REFERENCE


def plan_for(model: nn.Module, check: Callable[[list[tuple[str, nn.Module]]], None]
             ) -> tuple[Plan, list[nn.Module], list[dict[str, Any]] | None]:
    """The model's plan, its modules and, where the plan was reused, their ``__dict__`` (for the caller's checks):
    the earlier block's if the model's fingerprint is unchanged, else a new walk, passed to ``check`` (which raises
    for a child that cannot be profiled) before it is planned."""
    plan = _BY_REFERENCE.get(_reference(model))
    if plan is not None:
        modules = plan.modules()
        if modules is not None and plan.key is not None:
            owns = list(map(_own, modules))
            tables = table_versions(owns)
            if tables is not None and plan.unchanged(modules, tables):
                return plan, modules, owns
            if _holds(modules, owns, plan.key):
                plan.saw(owns, tables)
                return plan, modules, owns
        del _PLANS[model]
    paths = module_paths(model)
    check(paths)
    plan = Plan(paths)
    modules = plan.modules()
    assert modules is not None  # they are all held by ``paths`` here
    if plan.key is not None:
        _PLANS[model] = plan
    return plan, modules, None
