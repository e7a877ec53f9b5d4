"""Cross-rank statistics: per module, the min, median and max over ranks, the slowest rank, the stragglers.

Pure functions of plain rows (``Profile.to_dict()`` of each rank), so they are tested without processes.

Names. Records keep the ``named_modules()`` names of the model that was profiled, so a DDP-wrapped model's
records are ``""`` (DistributedDataParallel), ``"module"`` (your model), ``"module.layer1"``... The cross-rank
view shows the names of *your* model: a wrapper's attribute (``module`` under DistributedDataParallel,
``_fsdp_wrapped_module`` under FSDP's FullyShardedDataParallel, ``_checkpoint_wrapped_module`` under
CheckpointWrapper) is removed from every name, and where a wrapper and the module it wraps then share a name,
the wrapped module's row is the one shown (its type is yours). The outermost record, wrapper included, is the
``step`` row: the whole step as each rank ran it. FSDP2 (``fully_shard``) adds no name, only a class
(``FSDPLinear`` for a sharded Linear): names are unchanged.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..record.fields import Field, declare

__all__ = ["Spread", "ModuleSpread", "spread", "shown_names", "cross_rank_stats", "straggler_floor", "stragglers", "WRAPPED_ATTRIBUTE", "wrapped_attribute",
           "PASSES"]

# Wrapper class name -> the attribute holding the wrapped module.
WRAPPED_ATTRIBUTE = {
    "DistributedDataParallel": "module",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
    "CheckpointWrapper": "_checkpoint_wrapped_module",
    "OffloadWrapper": "_checkpoint_wrapped_module",
}
# The class FSDP2's ``fully_shard`` gives a module it shards: ``FSDP`` + the module's class name.
_SHARDED_PREFIX = "FSDP"


def wrapped_attribute(type_name: str) -> str | None:
    """The attribute that holds the wrapped module of a wrapper of class ``type_name``, sharded by FSDP2 or not
    (``checkpoint_wrapper`` then ``fully_shard`` on a block: ``FSDPCheckpointWrapper``); None for any other."""
    found = WRAPPED_ATTRIBUTE.get(type_name)
    if found is None and type_name.startswith(_SHARDED_PREFIX):
        found = WRAPPED_ATTRIBUTE.get(type_name[len(_SHARDED_PREFIX):])
    return found


PASSES = ("forward_ms", "backward_ms", "total_ms")
# (attribute of a Spread, key suffix in a row)
_ROW_KEYS = (("min", "rank_min"), ("median", "rank_median"), ("max", "rank_max"),
             ("slowest_rank", "slowest_rank"), ("fastest_rank", "fastest_rank"))
declare(*(
    Field(f"{name}_{key}", "ms" if key.startswith("rank_") else "count",
          f"{name.removesuffix('_ms').capitalize()} {key.replace('_', ' ')}", combine="none",
          cost=key.startswith("rank_"), detail=True, doc=f"{key.replace('_', ' ')} of {name} across ranks")
    for name in PASSES for _, key in _ROW_KEYS
))


@dataclass
class Spread:
    """One quantity over ranks: ``values`` by rank (ranks where it was measured), their min, median and max, and
    the ranks that had the max (``slowest_rank``) and the min (``fastest_rank``); ties go to the lowest rank."""

    values: dict[int, float]
    min: float
    median: float
    max: float
    slowest_rank: int
    fastest_rank: int


def spread(values: Mapping[int, float | None]) -> Spread | None:
    """The spread of ``{rank: value}``, ignoring ranks where the value is None; None if none was measured.

    >>> s = spread({0: 1.0, 1: 4.0, 2: 2.0, 3: None})
    >>> s.min, s.median, s.max, s.slowest_rank, s.fastest_rank
    (1.0, 2.0, 4.0, 1, 0)
    """
    measured = {rank: float(value) for rank, value in sorted(values.items()) if value is not None}
    if not measured:
        return None
    numbers = list(measured.values())
    slowest = max(measured, key=lambda rank: (measured[rank], -rank))
    fastest = min(measured, key=lambda rank: (measured[rank], rank))
    return Spread(measured, min(numbers), statistics.median(numbers), max(numbers), slowest, fastest)


def stragglers(values: Spread | None, margin: float, min_ms: float = 0.0) -> list[int]:
    """Ranks whose value exceeds the median by more than ``margin`` (0.2 = 20 %) and by more than ``min_ms``."""
    if values is None:
        return []
    limit = values.median * (1.0 + margin)
    return [rank for rank, value in values.values.items() if value > limit and value - values.median > min_ms]


@dataclass
class ModuleSpread:
    """One module across ranks: a ``Spread`` per pass (``forward_ms``, ``backward_ms``, ``total_ms``, None where no
    rank measured it) and ``stragglers``, the ranks slower than the median on ``total_ms`` by the margin."""

    name: str
    type: str
    raw_name: str
    ranks: list[int]
    forward_ms: Spread | None = None
    backward_ms: Spread | None = None
    total_ms: Spread | None = None
    stragglers: list[int] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """Depth in the (unwrapped) module tree; the root is 0."""
        return self.name.count(".") + 1 if self.name else 0

    def to_dict(self) -> dict[str, Any]:
        """The canonical row: ``forward_ms_rank_min``, ``forward_ms_rank_median``, ``forward_ms_rank_max``,
        ``forward_ms_slowest_rank``... for each pass, plus ``stragglers``. Statistics over ranks are named
        ``_rank_*``, so they are never confused with a record's statistics over steps (``forward_ms_min``)."""
        row: dict[str, Any] = {"name": self.name, "type": self.type, "depth": self.depth, "raw_name": self.raw_name,
                               "ranks": list(self.ranks)}
        for name in PASSES:
            values = getattr(self, name)
            for statistic, key in _ROW_KEYS:
                row[f"{name}_{key}"] = None if values is None else getattr(values, statistic)
        row["stragglers"] = list(self.stragglers)
        return row


def shown_names(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{recorded name: name shown}``, wrapper attributes removed (see the module docstring).

    >>> rows = {"": {"type": "DistributedDataParallel"}, "module": {"type": "Net"}, "module.fc": {"type": "Linear"}}
    >>> shown_names(rows)
    {'': '', 'module': '', 'module.fc': 'fc'}
    """
    shown: dict[str, str] = {}
    for name in rows:
        parts = name.split(".") if name else []
        kept = []
        for index, part in enumerate(parts):
            parent = rows.get(".".join(parts[:index]))
            if parent is None or wrapped_attribute(parent["type"]) != part:
                kept.append(part)
        shown[name] = ".".join(kept)
    return shown


def _row_total(row: Mapping[str, Any]) -> float | None:
    forward, backward = row.get("forward_ms"), row.get("backward_ms")
    if forward is None and backward is None:
        return None
    return (forward or 0.0) + (backward or 0.0)


def _types(present: Mapping[int, Mapping[str, Any]]) -> str:
    """The module's class over the ranks that have it; where ranks built different models, each class once, in rank
    order, joined by " | " (``ReLU | Tanh``), so that the row says it compares different modules."""
    return " | ".join(dict.fromkeys(row["type"] for row in present.values()))


def _module_spread(name: str, raw_name: str, rows_by_rank: Mapping[int, Mapping[str, Mapping[str, Any]]],
                   margin: float, min_ms: float) -> ModuleSpread:
    present = {rank: rows[raw_name] for rank, rows in sorted(rows_by_rank.items()) if raw_name in rows}
    module = ModuleSpread(name, _types(present), raw_name, sorted(present))
    module.forward_ms = spread({rank: row.get("forward_ms") for rank, row in present.items()})
    module.backward_ms = spread({rank: row.get("backward_ms") for rank, row in present.items()})
    module.total_ms = spread({rank: _row_total(row) for rank, row in present.items()})
    module.stragglers = stragglers(module.total_ms, margin, min_ms)
    return module


def straggler_floor(step: ModuleSpread, min_ms: float | None) -> float:
    """The absolute part of the straggler rule: ``min_ms``, or by default (None) 1 % of the median step time, so
    that the jitter of microsecond modules is not flagged while anything that costs the step 1 % is."""
    if min_ms is not None:
        return float(min_ms)
    return 0.01 * step.total_ms.median if step.total_ms is not None else 0.0


def cross_rank_stats(rows_by_rank: Mapping[int, Mapping[str, Mapping[str, Any]]], margin: float = 0.2,
                     min_ms: float | None = None) -> tuple[ModuleSpread, dict[str, ModuleSpread]]:
    """The whole step and every module across ranks, from ``{rank: {recorded name: row}}``.

    Returns ``(step, modules)``: ``step`` is the outermost record (``""``, the wrapper if any) and ``modules``
    is keyed by shown name in the order of the lowest rank's rows, then any module only other ranks have. A rank
    is a straggler for a module when its ``total_ms`` exceeds the median over ranks by more than ``margin``
    (a fraction: 0.2 = 20 %) and by more than ``min_ms`` milliseconds (None: 1 % of the median step time, see
    ``straggler_floor``); with two ranks the median is their mean,
    so the slower is flagged when it is more than (1 + m) / (1 - m) times the faster (1.5 times for m = 0.2).
    """
    if not rows_by_rank:
        raise ValueError("no rank's rows to compare")
    if margin < 0:
        raise ValueError(f"margin is a fraction >= 0 (0.2 = 20 %), got {margin}")
    order: dict[str, None] = {}
    for rank in sorted(rows_by_rank):
        order.update(dict.fromkeys(rows_by_rank[rank]))
    if "" not in order:
        raise ValueError("the rows have no root record (name '')")
    merged_types = {}
    for rows in rows_by_rank.values():
        for name, row in rows.items():
            merged_types.setdefault(name, {"type": row["type"]})
    names = shown_names({name: merged_types[name] for name in order})
    chosen: dict[str, str] = {}  # shown name -> recorded name; the innermost (wrapped) record wins
    for raw_name in order:
        chosen[names[raw_name]] = raw_name
    step = _module_spread("", "", rows_by_rank, margin, 0.0)
    floor = straggler_floor(step, min_ms)
    step.stragglers = stragglers(step.total_ms, margin, floor)
    modules = {shown: _module_spread(shown, raw, rows_by_rank, margin, floor) for shown, raw in chosen.items()}
    return step, modules
