"""Records: one node per module, in an anytree tree that mirrors ``named_modules()``. Numbers only.

Inclusive times are measured; self times are measured too, on the *call* stack rather than derived from the
module tree, because the two differ when a module is shared or called from a sibling's forward.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

from anytree import NodeMixin, PreOrderIter
from torch import nn

__all__ = ["CallTiming", "ModuleRecord", "build_tree", "TIME_FIELDS", "STAT_FIELDS", "METRIC_FIELDS", "register_fields"]

TIME_FIELDS = ("forward_ms", "backward_ms", "self_forward_ms", "self_backward_ms", "recompute_ms")
# Statistics over steps, beside the means: forward_ms_median, ..., backward_ms_p95.
STAT_FIELDS = tuple(f"{p}_{s}" for p in ("forward_ms", "backward_ms") for s in ("median", "std", "min", "max", "p95"))

# Fields that meters write onto records, in registration order. ``to_dict`` includes those a record carries, so a
# meter that did not run adds no column.
METRIC_FIELDS: dict[str, None] = {}


def register_fields(*names: str) -> None:
    """Declare record fields a meter fills (numbers, strings, and lists/dicts of them), for ``to_dict``."""
    for name in names:
        METRIC_FIELDS.setdefault(name)


@dataclass
class CallTiming:
    """One call of a module: start offsets are milliseconds from the start of profiling on the module's clock."""

    forward_start_ms: float
    forward_ms: float
    backward_start_ms: float | None = None
    backward_ms: float | None = None
    recompute: bool = False
    step: int = 0


class ModuleRecord(NodeMixin):
    """What was measured for one module. ``None`` means "not measured" (never 0 for a pass that did not run).

    ``forward_ms``/``backward_ms`` include children and are summed over the calls of a step, then averaged over
    the measured steps in which the module ran (``forward_ms_median``, ``..._std``, ``..._min``, ``..._max``,
    ``..._p95`` beside them); ``calls`` is calls per step; ``self_*`` exclude the time of
    the calls made from inside this module's calls. ``recompute_ms`` is forward time re-run during backward by
    activation checkpointing; it happens inside the backward of the enclosing modules and so is part of their
    ``backward_ms``.
    """

    def __init__(self, name: str, type: str, extra_repr: str = "", parent: ModuleRecord | None = None) -> None:
        self.name = name
        self.type = type
        self.extra_repr = extra_repr
        self.aliases: list[str] = []
        self.call_times: list[CallTiming] = []
        self.calls: int | float = 0
        self.forward_ms: float | None = None
        self.backward_ms: float | None = None
        self.self_forward_ms: float | None = None
        self.self_backward_ms: float | None = None
        self.recompute_ms: float | None = None
        self.steps = 0
        for field in STAT_FIELDS:
            setattr(self, field, None)
        self.parent = parent

    @property
    def short_name(self) -> str:
        """The attribute name under the parent ("" for the root)."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def total_ms(self) -> float | None:
        """Forward plus backward, where measured."""
        if self.forward_ms is None and self.backward_ms is None:
            return None
        return (self.forward_ms or 0.0) + (self.backward_ms or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The canonical row of this record: plain numbers and strings, JSON-serializable. Public attributes
        that meters set beyond the ones below (``params``, ``flops_forward``, ...) are part of the row too."""
        row = {
            "name": self.name,
            "type": self.type,
            "depth": self.depth,
            "parent": None if self.parent is None else self.parent.name,
            "calls": self.calls,
            **{field: getattr(self, field) for field in TIME_FIELDS},
            "steps": self.steps,
            **{field: getattr(self, field) for field in STAT_FIELDS},
            **{field: self.__dict__[field] for field in METRIC_FIELDS if field in self.__dict__},
            "aliases": list(self.aliases),
            "extra_repr": self.extra_repr,
            "call_times": [asdict(timing) for timing in self.call_times],
        }
        for key, value in vars(self).items():
            if key not in row and not key.startswith("_"):
                row[key] = value
        return row

    def __iter__(self) -> Iterator[ModuleRecord]:
        return iter(PreOrderIter(self))

    def __repr__(self) -> str:
        shown = self.name or "<root>"
        return f"ModuleRecord({shown!r}, {self.type}, calls={self.calls}, forward_ms={self.forward_ms}, backward_ms={self.backward_ms})"


def build_tree(model: nn.Module) -> tuple[ModuleRecord, dict[str, ModuleRecord], list[tuple[str, nn.Module]]]:
    """One record per unique module in ``named_modules()`` order; a module reachable under several names is
    one record, its other names kept in ``aliases``. Returns the root, records by name, and (name, module)."""
    records: dict[str, ModuleRecord] = {}
    entries: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        parent = records[name.rsplit(".", 1)[0] if "." in name else ""] if name else None
        records[name] = ModuleRecord(name, type(module).__name__, module.extra_repr(), parent)
        entries.append((name, module))
    first_name = {id(module): name for name, module in reversed(entries)}
    for name, module in model.named_modules(remove_duplicate=False):
        if name and first_name[id(module)] != name:
            records[first_name[id(module)]].aliases.append(name)
    return records[""], records, entries


def iter_records(root: ModuleRecord, maxdepth: int | None = None) -> Iterable[ModuleRecord]:
    """Records in ``named_modules()`` order, down to ``maxdepth`` (the root has depth 0)."""
    return PreOrderIter(root, maxlevel=None if maxdepth is None else maxdepth + 1)
