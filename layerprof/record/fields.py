"""The field catalogue: every quantity layerprof knows, declared once.

A field's name is its one name everywhere: the table and summary column, the plot metric (for a field that adds
up over modules), the compared metric, and for a stored field the record attribute and the row and JSON key. A
derived field is stored nowhere, on a record or in a row: what reads one computes it with ``Field.value`` (a
table asked for ``macs`` by name, the summary, a plot). Its declaration says its unit (which is how it is
printed), its label, how values of several modules combine, and, for a derived field, how it is computed from
stored ones.
Renderers, comparisons, aggregation and exports read this catalogue; meters declare their fields here as data
(``declare``), and never import a renderer.

A few short spellings are accepted where people type names (``columns=``, ``metric=``, ``--columns``): ``forward``
for ``forward_ms`` and so on (``ALIASES``). ``memory`` names whichever of ``saved_bytes`` or ``activation_bytes``
a profile holds. Outputs always use the canonical names.

>>> field("forward").name, field("forward_ms").unit, field("total_ms").parts
('forward_ms', 'ms', ('forward_ms', 'backward_ms'))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "Field", "FIELDS", "ALIASES", "STATISTICS", "STAT_PASSES", "declare", "field", "canonical", "stored_fields",
    "derived_fields", "detail_fields", "stat_fields", "UNITS",
]

# How a unit prints is units.py's business; this is the list of units a field may have.
UNITS = ("ms", "bytes", "flops", "flop/s", "macs", "count", "percent", "shapes", "text", "data", "flop/byte", "byte/s",
         "ratio")
COMBINES = ("sum", "max", "none")


@dataclass(frozen=True)
class Field:
    """One quantity.

    Attributes:
        name: the one name of the quantity.
        unit: one of ``UNITS``; says how values print.
        label: a short header for tables and the summary (``"Forward Time"``).
        combine: how values of several modules combine (aggregate by type): ``sum``, ``max`` (peaks), ``none``.
        parts: a derived field that is the sum of these stored fields (None where all are None).
        compute: a derived field computed from the record otherwise (``record -> value``).
        share_of: the field of the root that a percentage of this one is taken of (``"total_ms"``), if any.
        of: for a ``percent`` field, the field it shows as a share of the root's ``share_of`` (default: the same
            field): ``time_percent`` is ``total_ms`` of the root's ``total_ms``.
        cost: compared between profiles as a cost (lower is better); False for counts that place a module.
        detail: shown in tables and comparisons only when asked for by name (statistics over steps).
        always: every row carries it, measured or not (None); other stored fields only where a meter set them.
        meter: the meter that records it (its name in ``LayerProf(model, metrics=(...))``), None for timing.
        doc: one line on what it means.
        needs: how a profile comes to hold it, where neither a meter nor a plain training step does.
    """

    name: str
    unit: str
    label: str
    combine: str = "sum"
    parts: tuple[str, ...] = ()
    compute: Callable[[Any], Any] | None = None
    share_of: str | None = None
    of: str | None = None
    cost: bool = True
    detail: bool = False
    always: bool = False
    meter: str | None = None
    doc: str = ""
    needs: str = ""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"field {self.name!r}: unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        if self.combine not in COMBINES:
            raise ValueError(f"field {self.name!r}: combine must be one of {', '.join(COMBINES)}, got {self.combine!r}")

    @property
    def derived(self) -> bool:
        """Computed from other fields, never stored on a record."""
        return bool(self.parts) or self.compute is not None or self.of is not None

    def value(self, record: Any, root: Any = None) -> Any:
        """The field's value on a record (derived fields computed; ``percent`` shares need ``root``)."""
        if self.of is not None:
            whole = FIELDS[self.share_of or self.of].value(root) if root is not None else None
            part = FIELDS[self.of].value(record)
            return None if part is None or not whole else (100.0 if part == whole else 100.0 * part / whole)  # a whole of itself: exactly 100
        if self.parts:
            values = [getattr(record, part, None) for part in self.parts]
            known = [value for value in values if value is not None]
            return sum(known) if known else None
        if self.compute is not None:
            return self.compute(record)
        return getattr(record, self.name, None)

    @property
    def meters(self) -> tuple[str, ...]:
        """The meters that record this field before anything reads it: its own, and those of the stored fields it
        is made of (its parts, the field it is a share of); empty for times."""
        named = [self.meter, *(FIELDS[part].meter for part in self.parts if part in FIELDS)]
        if self.of is not None and self.of in FIELDS:
            named.append(FIELDS[self.of].meter)
        return tuple(dict.fromkeys(meter for meter in named if meter is not None))

    @property
    def hint(self) -> str:
        """How to get this field recorded."""
        if self.needs:
            return self.needs
        if self.meter is None:
            return "call the model (and .backward() for backward time) inside the `with LayerProf(model)` block"
        return f"run with LayerProf(model, metrics=({self.meter!r},))"


FIELDS: dict[str, Field] = {}
_stored: list[Field] = []  # cache of stored_fields(), emptied by declare
_version = [0]  # bumped by declare: caches of what the catalogue holds compare it
# Short spellings accepted at the boundary, to one canonical name or to candidates tried in order.
ALIASES: dict[str, tuple[str, ...]] = {}


def declare(*fields: Field, aliases: dict[str, str | tuple[str, ...]] | None = None) -> None:
    """Add fields (and short spellings of them) to the catalogue; a meter calls this for the fields it fills.
    Declaring a name again replaces it (a reloaded module declares the same fields)."""
    for new in fields:
        FIELDS[new.name] = new
    _stored.clear()
    _version[0] += 1
    for alias, target in (aliases or {}).items():
        ALIASES[alias] = (target,) if isinstance(target, str) else tuple(target)


def canonical(name: str, present: Callable[[str], bool] | None = None) -> str | None:
    """The canonical field name for ``name`` (itself, or the target of an alias; for an alias with several
    candidates, the first that ``present`` accepts). None for a name the catalogue does not know."""
    if name in FIELDS:
        return name
    targets = ALIASES.get(name)
    if targets is None:
        return None
    if present is not None:
        for target in targets:
            if present(target):
                return target
    return targets[0]


def catalogue_version() -> int:
    """A number that changes whenever a field is declared (for caches built from the catalogue)."""
    return _version[0]


def field(name: str) -> Field | None:
    """The declared field called ``name`` (or an alias of it), None if none."""
    resolved = canonical(name)
    return None if resolved is None else FIELDS.get(resolved)


def stored_fields() -> list[Field]:
    """Fields that records hold, in declaration order (the order of a row)."""
    if not _stored:
        _stored.extend(f for f in FIELDS.values() if not f.derived)
    return _stored


def derived_fields() -> list[Field]:
    return [f for f in FIELDS.values() if f.derived]


def detail_fields() -> list[str]:
    return [f.name for f in FIELDS.values() if f.detail]


# -- timing: always on ------------------------------------------------------------------------------------------
# Statistics over steps, beside the means: forward_ms_median, ..., backward_ms_p95.
STATISTICS = ("median", "std", "min", "max", "p95")
STAT_PASSES = ("forward_ms", "backward_ms")


def stat_fields() -> list[str]:
    return [f"{field_name}_{statistic}" for field_name in STAT_PASSES for statistic in STATISTICS]


def _per_call(record: Any) -> float | None:
    forward, calls = getattr(record, "forward_ms", None), getattr(record, "calls", 0)
    return None if forward is None or not calls else forward / calls


# A CPU profile lacks these: its clock is the host's, and there is no separate GPU time to set them beside.
_ON_GPU = "it is measured on a GPU, where CUDA events time the forward (sync=False): run the model on CUDA"

declare(
    Field("calls", "count", "Calls", cost=False, always=True,
          doc="forward calls per step (every call of a shared module or a recursive one)"),
    Field("forward_ms", "ms", "Forward Time", share_of="total_ms", always=True,
          doc="inclusive forward time per recorded step (0 in steps it did not run)"),
    Field("backward_ms", "ms", "Backward Time", share_of="total_ms", always=True,
          doc="inclusive backward time per recorded step, summed over backward passes"),
    Field("self_forward_ms", "ms", "Self Forward", share_of="total_ms", always=True,
          doc="forward time minus the calls made from inside this module's calls"),
    Field("self_backward_ms", "ms", "Self Backward", share_of="total_ms", always=True,
          doc="backward time minus the backward of the calls made from inside this module's calls"),
    Field("recompute_ms", "ms", "Recompute", share_of="total_ms", always=True,
          doc="forward re-run during backward by activation checkpointing (inside the enclosing backward)",
          needs="it is measured where modules run under activation checkpointing: wrap some in "
                "torch.utils.checkpoint, or apply a plan (prof.checkpoint_plan(budget).applied(model))"),
    Field("host_forward_ms", "ms", "Host Forward", detail=True, needs=_ON_GPU,
          doc="the host's wall time of the forward per recorded step where CUDA events timed it (the Python and "
              "launch side, hooks included), beside forward_ms, the GPU's elapsed time"),
    Field("host_forward_ms_median", "ms", "Host Forward median", combine="none", detail=True, needs=_ON_GPU,
          doc="median over steps of host_forward_ms"),
    Field("steps", "count", "Steps", cost=False, detail=True, always=True, combine="max",
          doc="profiled steps the figures are over"),
    Field("steps_run", "count", "Steps Run", cost=False, detail=True, always=True, combine="max",
          doc="of those steps, how many ran the module (figures count 0 for the others)"),
    *(Field(f"{p}_{s}", "ms", f"{'Forward' if p == 'forward_ms' else 'Backward'} {s}", combine="none",
            detail=True, always=True, doc=f"{s} over steps of {p}")
      for p in STAT_PASSES for s in STATISTICS),
    Field("total_ms", "ms", "Total Time", parts=("forward_ms", "backward_ms"), share_of="total_ms",
          doc="forward + backward time per step"),
    Field("self_total_ms", "ms", "Self Time", parts=("self_forward_ms", "self_backward_ms"), share_of="total_ms",
          doc="self forward + self backward time"),
    Field("forward_per_call_ms", "ms", "Forward/Call", compute=_per_call, combine="none",
          doc="forward time per call"),
    Field("time_percent", "percent", "Time", of="total_ms", combine="none", cost=False,
          doc="share of the step's time (forward + backward of the root)"),
    Field("self_percent", "percent", "Self", of="self_total_ms", share_of="total_ms", combine="none",
          cost=False, doc="self time as a share of the step's time"),
    Field("forward_percent", "percent", "Forward", of="forward_ms", combine="none", cost=False,
          doc="share of the root's forward time"),
    Field("backward_percent", "percent", "Backward", of="backward_ms", combine="none", cost=False,
          doc="share of the root's backward time"),
    aliases={
        "forward": "forward_ms", "backward": "backward_ms", "total": "total_ms", "self_forward": "self_forward_ms",
        "self_backward": "self_backward_ms", "recompute": "recompute_ms", "self_total": "self_total_ms",
        "mean_forward": "forward_per_call_ms",
    },
)

