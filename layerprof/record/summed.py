"""The one rule for a module that is never called itself: it counts as the sum of its children.

``nn.ModuleList`` and ``nn.ModuleDict`` are iterated, not called, so they have no time, FLOPs or activations of
their own, yet every transformer keeps its layers in one (``bert.encoder.layer``, ``transformer.h``,
``model.layers``). A profile's root may not run either (a trainer's step calls ``model.net(x)``). Such a module,
when modules under it ran, is *summed*: each inclusive cost it lacks is its children's combined (summed, or the
largest for a peak), and its self costs and per-call figures stay unmeasured. Its percentages then work, and the
root's totals are those of its top-level modules (a sibling called from inside another counts in both).

Summaries, tables, the report and the plots read values through ``TreeValues``, so they agree on the rule; a
summed container also takes no level of depth (``shown_depth``): ``bert.encoder.layer.0`` is at depth 2, as
``encoder.layer[0]`` reads, and its row in a timeline is not left empty.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from .fields import FIELDS, Field
from .records import ModuleRecord, preorder

__all__ = ["TreeValues", "summable", "ran", "counted_only"]

_SUMMED_UNITS = ("ms", "bytes", "flops", "macs", "count")


def summable(field: Field) -> bool:
    """A stored inclusive cost: what a container lacking it takes from its children (not ``calls``, not a
    ``self_*`` value, not a statistic over steps)."""
    return (not field.derived and field.cost and not field.detail and field.combine in ("sum", "max")
            and field.unit in _SUMMED_UNITS and not field.name.startswith("self_"))


def ran(record: ModuleRecord) -> bool:
    """Called at least once, re-run by activation checkpointing, or given times otherwise (an integration that
    bills a trainer's step to the root it did not call)."""
    return bool(record.calls) or any(value is not None for value in (
        record.forward_ms, record.backward_ms, record.recompute_ms))


_COUNTED = ("flops_forward", "saved_bytes", "activation_bytes", "shape_variants")


def counted_only(record: ModuleRecord) -> bool:
    """Whether a module with no timed call ran in the step the counting meters measured (FLOPs, memory, shapes),
    which the times leave out where other steps were recorded: generate()'s encoder call, in a profile stepped
    once a token. Its counts hold; it ran."""
    return not ran(record) and any(getattr(record, name, None) is not None for name in _COUNTED)


class _View:
    """A record seen through the rule: ``getattr`` gives a summed container its children's combined costs, so
    a catalogue field computes over it (``Field.value(view)``) as over a record."""

    __slots__ = ("_values", "_record")

    def __init__(self, values: TreeValues, record: ModuleRecord) -> None:
        self._values = values
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return self._values.stored(self._record, name)


class TreeValues:
    """Field values over one tree with summed containers; built once per rendering (values are cached).

    >>> from layerprof.record.records import ModuleRecord
    >>> root = ModuleRecord("", "Net"); layers = ModuleRecord("layers", "ModuleList", parent=root)
    >>> for i, ms in enumerate((2.0, 3.0)):
    ...     layer = ModuleRecord(f"layers.{i}", "Linear", parent=layers); layer.calls, layer.forward_ms = 1, ms
    >>> values = TreeValues(root)
    >>> values.value(layers, "forward_ms"), values.summed(layers), values.value(root, "forward_ms")
    (5.0, True, 5.0)
    >>> values.value(layers, "time_percent"), values.shown_depth(layers.children[0])
    (100.0, 1)
    """

    def __init__(self, root: ModuleRecord) -> None:
        self.root = root
        self._order = preorder(root)  # parents first; reversed, children first (no recursion: deep trees)
        self._summed: set[int] = set()
        for record in reversed(self._order):
            # (a module that ran only in the counted step is one that ran: its counts are its own)
            if (not ran(record) and not counted_only(record)
                    and any(ran(c) or counted_only(c) or id(c) in self._summed for c in record.children)):
                self._summed.add(id(record))
        self._depth: dict[int, int] = {id(root): 0}
        for record in self._order[1:]:
            parent = record.parent
            step = 0 if parent is not root and id(parent) in self._summed else 1
            self._depth[id(record)] = self._depth[id(parent)] + step
        self._combined: dict[str, dict[int, Any]] = {}
        self._views: dict[int, _View] = {}

    def summed(self, record: ModuleRecord) -> bool:
        """Never called itself, with modules under it that ran: it shows its children's totals."""
        return id(record) in self._summed

    def stored(self, record: ModuleRecord, name: str) -> Any:
        """A stored field of ``record``; for a summed container lacking it, the children's combined value."""
        own = getattr(record, name, None)
        if own is not None or id(record) not in self._summed:
            return own
        combined = self._combined.get(name)
        if combined is None:
            combined = self._combined[name] = self._combine(name)
        return combined.get(id(record))

    def _combine(self, name: str) -> dict[int, Any]:
        """The value of field ``name`` of every summed container that lacks it, children first."""
        field = FIELDS.get(name)
        if field is None or not summable(field) or not self._summed:
            return {}
        combined: dict[int, Any] = {}
        for record in reversed(self._order):
            if id(record) not in self._summed or getattr(record, name, None) is not None:
                continue
            values = [combined.get(id(c)) if id(c) in combined else getattr(c, name, None) for c in record.children]
            present = [v for v in values if v is not None]
            if present:
                combined[id(record)] = max(present) if field.combine == "max" else sum(present)
        return combined

    def counts(self, record: ModuleRecord, name: str) -> dict[str, Any]:
        """A ``{key: count}`` field of ``record`` (``unknown_ops``), most first; for a summed container, its
        children's that ran (or are summed) added key by key, as its costs are."""
        own = getattr(record, name, None)
        if own or id(record) not in self._summed:
            return dict(own or {})
        total: Counter[str] = Counter()
        for child in record.children:
            if ran(child) or counted_only(child) or id(child) in self._summed:
                total.update(self.counts(child, name))
        return dict(total.most_common())

    def view(self, record: ModuleRecord) -> Any:
        """``record`` itself, or for a summed container an object that reads like it with the summed values."""
        if not self.summed(record):
            return record
        view = self._views.get(id(record))
        if view is None:
            view = self._views[id(record)] = _View(self, record)
        return view

    def value(self, record: ModuleRecord, name: str) -> Any:
        """The catalogue field ``name`` of ``record`` (percentages of this tree's root), containers summed."""
        return FIELDS[name].value(self.view(record), self.view(self.root))

    def shown_depth(self, record: ModuleRecord) -> int:
        """The depth at which a reader meets ``record``: levels below the root, a summed container below the
        root not counted (its children sit at its own depth)."""
        return self._depth[id(record)]
