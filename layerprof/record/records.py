"""Records: one node per module, in an anytree tree that mirrors ``named_modules()``. Numbers only.

Inclusive times are measured; self times are measured too, on the *call* stack rather than derived from the
module tree, because the two differ when a module is shared or called from a sibling's forward.
"""
from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, fields
from functools import partial
from itertools import repeat, starmap
from operator import add, attrgetter, methodcaller
from typing import Any, Iterator

from anytree import NodeMixin, PreOrderIter
from torch import nn

from .._torch import submodules
from .fields import FIELDS, catalogue_version, stat_fields, stored_fields

__all__ = ["CallTiming", "ModuleRecord", "build_tree", "tree_rows", "preorder", "attach", "release_tree"]

_STAT_FIELDS = tuple(stat_fields())


@dataclass(slots=True)
class CallTiming:
    """One call of a module: start offsets are milliseconds from the start of profiling on the module's clock."""

    forward_start_ms: float
    forward_ms: float
    backward_start_ms: float | None = None
    backward_ms: float | None = None
    recompute: bool = False
    step: int = 0
    # Made inside a call of the same module (recursion): its time is inside that call's, so the module's
    # inclusive time does not add it again.
    recursive: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (what ``dataclasses.asdict`` gives, without its deep copy: ten times faster)."""
        return dict(zip(_CALL_FIELDS, _call_values(self)))


class ModuleRecord(NodeMixin):
    """What was measured for one module. ``None`` means "not measured" (never 0 for a pass that did not run).

    ``forward_ms``/``backward_ms`` include children and are summed over the calls of a step, then averaged over
    all ``steps`` recorded, a step in which the module did not run counting 0 (``forward_ms_median``,
    ``..._std``, ``..._min``, ``..._max``, ``..._p95`` beside them); ``steps_run`` is the number of those steps
    in which it ran; ``calls`` is calls per step; ``self_*`` exclude the time of
    the calls made from inside this module's calls. ``recompute_ms`` is forward time re-run during backward by
    activation checkpointing; it happens inside the backward of the enclosing modules and so is part of their
    ``backward_ms``.
    """

    # Every call's timing, as CallTiming field tuples (what collection writes), made into ``call_times`` when that
    # is first read: a summary or a table never reads them, and a row is made from the tuples.
    _timings: list[tuple[Any, ...]] | tuple[()] = ()
    _call_times: list[CallTiming] | None = None
    # Not measured until a fill writes them: the class's None, so a new record sets none of them (a record's own
    # dict is read with its class's defaults by attribute, and as None by a row).
    forward_ms: float | None = None
    backward_ms: float | None = None
    self_forward_ms: float | None = None
    self_backward_ms: float | None = None
    recompute_ms: float | None = None

    def __init__(self, name: str, type: str, extra_repr: str = "", parent: ModuleRecord | None = None) -> None:
        self.name = name
        self.type = type
        self.extra_repr = extra_repr
        self.aliases: list[str] = []
        self.calls: int | float = 0
        self.steps = 0
        self.steps_run = 0
        if parent is not None:
            self.parent = parent

    @property
    def call_times(self) -> list[CallTiming]:
        """Every call of the module in the last recorded step, in call order."""
        made = self._call_times
        if made is None:
            made = self._call_times = list(starmap(CallTiming, self._timings))
        return made

    @call_times.setter
    def call_times(self, timings: list[CallTiming]) -> None:
        self._call_times = timings

    @property
    def short_name(self) -> str:
        """The attribute name under the parent ("" for the root)."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def total_ms(self) -> float | None:
        """Forward plus backward, where measured (the catalogue's ``total_ms``)."""
        return FIELDS["total_ms"].value(self)

    def to_dict(self) -> dict[str, Any]:
        """The canonical row of this record: plain numbers and strings, JSON-serializable. Public attributes
        that meters set beyond the ones below (``params``, ``flops_forward``, ...) are part of the row too."""
        parent = self.parent
        return self._row(self.depth, None if parent is None else parent.name)

    def _row(self, depth: int, parent_name: str | None) -> dict[str, Any]:
        own = self.__dict__
        stored, extras = _row_plan(tuple(own))
        row: dict[str, Any] = {"name": self.name, "type": self.type, "depth": depth, "parent": parent_name}
        row.update(zip(stored, map(own.get, stored)))
        row["aliases"] = list(self.aliases)
        row["extra_repr"] = self.extra_repr
        made = self._call_times
        row["call_times"] = (list(map(dict, map(_call_items, self._timings))) if made is None
                             else [timing.to_dict() for timing in made])
        if extras:
            row.update(zip(extras, map(own.get, extras)))
        return row

    def __iter__(self) -> Iterator[ModuleRecord]:
        return iter(PreOrderIter(self))

    def __repr__(self) -> str:
        shown = self.name or "<root>"
        return f"ModuleRecord({shown!r}, {self.type}, calls={self.calls}, forward_ms={self.forward_ms}, backward_ms={self.backward_ms})"


_CALL_FIELDS = tuple(f.name for f in fields(CallTiming))
_call_values = attrgetter(*_CALL_FIELDS)
_call_items = partial(zip, _CALL_FIELDS)

# Statistics over steps default to "not measured" on the class, so that a new record sets none of them.
for _field in _STAT_FIELDS:
    setattr(ModuleRecord, _field, None)


# The keys a row takes from a record, by the record's attribute names: records of one model share a few shapes.
_ROW_PLANS: dict[tuple[str, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}
_ROW_PLANS_VERSION = [-1]
_OWN_KEYS = ("name", "type", "depth", "parent", "aliases", "extra_repr", "call_times")


def _row_plan(attributes: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the catalogue's stored fields in its order: every ``always`` one and the others the record has; then the
    record's other public attributes in the order they were set) for a record with these attribute names,
    worked out once per shape and state of the catalogue (a row is built for every record of every export)."""
    if _ROW_PLANS_VERSION[0] != catalogue_version() or len(_ROW_PLANS) > 256:
        _ROW_PLANS.clear()
        _ROW_PLANS_VERSION[0] = catalogue_version()
    plan = _ROW_PLANS.get(attributes)
    if plan is None:
        present = set(attributes)
        stored = tuple(f.name for f in stored_fields() if f.always or f.name in present)
        taken = {*_OWN_KEYS, *stored}
        extras = tuple(key for key in attributes if key not in taken and not key.startswith("_"))
        plan = _ROW_PLANS[attributes] = (stored, extras)
    return plan


def tree_rows(root: ModuleRecord) -> list[dict[str, Any]]:
    """``[record.to_dict() for record in PreOrderIter(root)]`` in one walk that carries each record's depth and
    parent down, instead of anytree walking up to the root for every record's ``depth``."""
    parent = root.parent
    rows: list[dict[str, Any]] = []
    stack = [(root, root.depth, None if parent is None else parent.name)]
    while stack:
        record, depth, parent_name = stack.pop()
        rows.append(record._row(depth, parent_name))
        children = record.__dict__.get("_NodeMixin__children")
        if children:
            stack.extend((child, depth + 1, record.name) for child in reversed(children))
    return rows


def preorder(root: ModuleRecord) -> list[ModuleRecord]:
    """``[root, *root.descendants]`` (anytree's pre-order) reading the children lists directly, without an
    iterator object and a property call per record."""
    found: list[ModuleRecord] = []
    stack = [root]
    while stack:
        record = stack.pop()
        found.append(record)
        children = record.__dict__.get("_NodeMixin__children")
        if children:
            stack.extend(reversed(children))
    return found


def attach(child: ModuleRecord, parent: ModuleRecord) -> None:
    """``child.parent = parent`` without anytree's checks for loops and duplicates, which scan the parent's
    children and make building a wide tree quadratic; a tree built from ``named_modules()`` has neither."""
    child.__dict__["_NodeMixin__parent"] = parent
    parent.__dict__.setdefault("_NodeMixin__children", []).append(child)


def _argument_references() -> int:
    """What ``sys.getrefcount`` adds, called through ``map`` over a list, to an object's count: the list's
    reference and the argument's."""
    held = object()
    return list(map(sys.getrefcount, [held]))[0] - 1  # less the local variable's


_ARGUMENT_REFERENCES = _argument_references()
_children_of = methodcaller("get", "_NodeMixin__children", ())
_drop_children = methodcaller("pop", "_NodeMixin__children", None)
_own = attrgetter("__dict__")


def release_tree(root: ModuleRecord, records: dict[str, ModuleRecord]) -> bool:
    """Break the parent/children reference cycles of the tree under ``root`` (whose records are ``records``, one
    per record, as a Profile holds them) if nothing else refers to any of its records: the caller is dropping
    its last references, and the tree is then freed at once instead of waiting, with every record, for a full
    garbage collection (a one-shot profile per step would leave one such tree per step, and the collections that
    free them walk the whole heap). Returns whether it did. A record held anywhere else (a variable, a list, a
    loaded or a selected record) leaves the tree as it is: its parent and children stay whole."""
    found = list(records.values())
    if not found or found[0] is not root:
        return False
    children = list(map(_children_of, map(_own, found)))
    # References each record has from the tree and the caller: ``records``, ``found``, the parent's children
    # list (not the root's), its children's parents; the root also from the caller's ``root``.
    expected = list(map(add, map(len, children), repeat(_ARGUMENT_REFERENCES + 2)))
    expected[0] += 1
    if list(map(sys.getrefcount, found)) != expected:
        return False
    deque(map(_drop_children, map(_own, found)), maxlen=0)
    return True


def module_paths(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every (qualified name, module), parents first, a module reachable under several names once per name:
    ``named_modules(remove_duplicate=False)``, walked with a stack instead of a generator per level."""
    found: list[tuple[str, nn.Module]] = []
    stack = [("", model)]
    pop, push, add = stack.pop, stack.append, found.append
    while stack:
        entry = pop()
        add(entry)
        name, module = entry
        children = submodules(module)
        if children:
            prefix = f"{name}." if name else ""
            for key, child in reversed(children.items()):
                if child is not None:
                    push((prefix + key, child))
    return found


def build_tree(model: nn.Module, reprs: bool = True, paths: list[tuple[str, nn.Module]] | None = None
               ) -> tuple[ModuleRecord, dict[str, ModuleRecord], list[tuple[str, nn.Module]]]:
    """One record per unique module in ``named_modules()`` order; a module reachable under several names is
    one record, its other names kept in ``aliases``. Returns the root, records by name, and (name, module).
    ``reprs=False`` leaves ``extra_repr`` empty, for a caller that reads it later (the profiler does, after the
    run, so that lazy modules show what they became). ``paths``: the model's ``module_paths``, if at hand."""
    records: dict[str, ModuleRecord] = {}
    entries: list[tuple[str, nn.Module]] = []
    first_name: dict[int, str] = {}
    for name, module in module_paths(model) if paths is None else paths:
        known = first_name.get(id(module))
        if known is not None:
            records[known].aliases.append(name)
            continue
        first_name[id(module)] = name
        record = ModuleRecord(name, type(module).__name__, module.extra_repr() if reprs else "")
        if name:
            attach(record, records[name.rpartition(".")[0]])
        records[name] = record
        entries.append((name, module))
    return records[""], records, entries

