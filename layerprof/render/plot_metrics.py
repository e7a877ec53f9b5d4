"""What a plot can show: any field of the catalogue (``record.fields``) that adds up over modules, stored, summed
over its parts, or computed from a record (``macs``, ``size``, ``frozen_params``).

Every field is an inclusive value (the module with its children); self values are derived over the tree by the
layout (``plot_layout.py``), never read from the records. A rate or a share (``flops_per_s``, ``time_percent``)
does not add up, and a plot's areas must add up to the model's: such a field is refused with the reason.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..record.fields import ALIASES, FIELDS, Field, canonical
from ..record.records import ModuleRecord
from .columns import Column
from .units import format_value

__all__ = ["PlotMetric", "resolve_metric", "backward_only", "how_to_record", "run_lacks", "saved_for_backward",
           "metric_meters", "root_of", "PLOTTABLE_UNITS", "plot_metric_names"]

PLOTTABLE_UNITS = ("ms", "bytes", "flops", "macs", "count")


class PlotMetric(Column):
    """A plottable quantity: a catalogue field (as a summary column shows it), and the stored fields summed
    into it."""

    @property
    def label(self) -> str:
        return self.field.label

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields read on a record: a summed field's parts, or the field itself (stored or computed)."""
        return self.field.parts or (self.field.name,)

    def format(self, value: float | None) -> str:
        return format_value(self.field.unit, value)

    def value(self, record: ModuleRecord, fields: tuple[str, ...] | None = None) -> float:
        """The record's inclusive value; a field that was not measured on this record counts as 0."""
        total = 0.0
        for name in fields or self.fields:
            value = _value(record, name)
            if value is not None:
                total += float(value)
        return total


def root_of(profile: object) -> ModuleRecord:
    """The root record of a Profile, a finished LayerProf, or a ModuleRecord itself."""
    if isinstance(profile, ModuleRecord):
        return profile.root
    tree = getattr(profile, "tree", None)
    if isinstance(tree, ModuleRecord):
        return tree
    raise TypeError(
        f"expected a Profile, a finished LayerProf or a ModuleRecord, got {type(profile).__name__}; "
        "plot after the `with LayerProf(model) as prof:` block has exited"
    )


def _value(record: object, name: str) -> object:
    # Through the catalogue: a computed field is no record attribute (and ``record.size`` is anytree's count of
    # the nodes under it, not the field ``size``).
    declared = FIELDS.get(name)
    return declared.value(record) if declared is not None else getattr(record, name, None)


def _recorded(records: Iterable[ModuleRecord], field: str) -> bool:
    return any(_value(record, field) is not None for record in records)


def _why_not(field: Field) -> str | None:
    """Why a field cannot be plotted, None if it can."""
    if field.unit in ("text", "data", "shapes"):
        return "it is not a number"
    if field.unit == "percent":
        return f"it is a share, and a plot shows each module's share already: plot {field.of!r}"
    if field.name.startswith("self_") and field.name[5:] in FIELDS:
        # A plot lays out inclusive values and draws each module's self part from them (what its children leave):
        # drawn as inclusive, the root's own 0.2 ms of a 45 ms forward held its children, scaled 200 times down.
        return (f"it is a module's own part, which a plot draws already from the inclusive values (the hatched "
                f"self part, the top-k bars): plot {field.name[5:]!r}")
    if field.detail or field.combine == "none" or field.unit not in PLOTTABLE_UNITS:
        return (f"its values ({field.unit}) do not add up over modules, as the areas of a plot must; plot an amount "
                "such as 'flops' or 'total'")
    return None


def plot_metric_names() -> list[str]:
    """Short names first (``forward``, ``total``, ``memory``...), then every field that adds up over modules."""
    fields = [f.name for f in FIELDS.values() if _why_not(f) is None]
    return [alias for alias, targets in ALIASES.items() if targets[0] in fields] + fields


def _plottable(name: str, resolved: str | None) -> PlotMetric:
    """The metric of the field ``resolved`` (``name`` as given); a ValueError naming the reason otherwise."""
    declared = FIELDS.get(resolved) if resolved is not None else None
    if declared is None:
        raise ValueError(f"unknown plot metric {name!r}; choose from: {', '.join(plot_metric_names())}")
    reason = _why_not(declared)
    if reason is not None:
        raise ValueError(f"cannot plot metric {name!r}: {reason}")
    return PlotMetric(declared)


def metric_meters(name: str) -> tuple[str, ...]:
    """The meters that record plot metric ``name`` (empty for times), before any profile exists: the command line
    checks ``--plot-metric`` against ``--metrics`` with it. A ValueError for an unknown name."""
    return _plottable(name, canonical(name)).field.meters


def resolve_metric(name: str, root: ModuleRecord) -> tuple[PlotMetric, tuple[str, ...]]:
    """The metric called ``name`` (a field name or a short one: ``total``, ``flops``, ``memory``) and the stored
    fields it reads on this tree.

    Raises ValueError for an unknown name (listing the known ones) and for a metric that this profile did not
    record (naming the missing field and how to record it).
    """
    records = [root, *root.descendants]
    metric = _plottable(name, canonical(name, present=lambda field: _recorded(records, field)))
    present = tuple(field for field in metric.fields if _recorded(records, field))
    if present:
        return metric, present
    targets = ALIASES.get(name) if name in ALIASES and len(ALIASES[name]) > 1 else metric.fields
    missing = " or ".join(repr(target) for target in targets)
    hint = how_to_record(metric.field, records, "this profile has", ", or plot a forward figure")
    raise ValueError(f"cannot plot metric {name!r}: no record of this profile holds the field {missing}; {hint}")


def how_to_record(field: Field, records: list[ModuleRecord], subject: str, instead: str = "") -> str:
    """How a profile (``records``) that lacks ``field`` would hold it: the field's hint (its meter); for a backward
    figure of a profile whose steps ran forward only, the backward pass it lacks (``subject`` "has no backward
    pass", then ``instead``: what else to do), and its meter too where that did not run either."""
    if not field.meters and any(record.calls for record in records) and not _recorded(records, "forward_ms"):
        # Modules ran and none has a time: a step on the meta device or fake tensors (``record/untimed.py``).
        return (f"{subject} no times: its step ran on the meta device or fake tensors, where ops compute nothing; "
                "use a counted figure (flops, params, saved_bytes), or profile on a device for times")
    if not (backward_only(field) and _recorded(records, "forward_ms") and not _recorded(records, "backward_ms")):
        return field.hint
    return (f"{subject} no backward pass (its steps ran forward only): call .backward() inside the block{instead}"
            + ("" if _meter_ran(field, records) else f"; and {field.hint}"))


def run_lacks(field: Field, records: list[ModuleRecord], meta: dict[str, Any] | None = None) -> bool:
    """Whether the run of a profile (``records``, ``meta``) left ``field`` out, not the model: its meter did not
    run, or it is a backward figure and the steps ran forward only. A CUDA figure of a CPU run (whose meter ran),
    recompute where nothing was checkpointed, FSDP figures of a model with no unit (the meter's meta notes it), are
    what the model gave."""
    forward_only = _recorded(records, "forward_ms") and not _recorded(records, "backward_ms")
    ran = _meter_ran(field, records) or any(meter in (meta or {}) for meter in field.meters)
    return not ran or (backward_only(field) and forward_only)


def _meter_ran(field: Field, records: list[ModuleRecord]) -> bool:
    """Whether the meters of ``field`` ran in the profile: a field of theirs that is not backward-only holds a
    value (times: always)."""
    return not field.meters or any(
        other.meters == field.meters and not backward_only(other) and _recorded(records, other.name)
        for other in FIELDS.values() if other.combine != "none" and not other.parts)


def backward_only(field: Field) -> bool:
    """Whether ``field`` reads only figures of the backward pass (``backward_ms``, ``flops_backward``, recompute),
    which a forward-only step never records."""
    return all("backward" in part or "recompute" in part for part in (field.parts or (field.name,)))


def saved_for_backward(field: Field) -> bool:
    """Whether ``field`` reads only what autograd saved for backward (``saved_bytes``), which a step without
    gradients (``torch.inference_mode``, ``torch.no_grad``) never saves: 0 on every module."""
    return all("saved" in part for part in (field.parts or (field.name,)))
