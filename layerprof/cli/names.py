"""The names ``--metrics``, ``--columns`` and ``--plot-metric`` accept, for ``--help``: read from the meter
registry and the field catalogue, so the help lists what the command accepts and nothing else."""
from __future__ import annotations

import textwrap

from ..collect.statistics import STAT_PASSES, STATISTICS
from ..metrics import METERS
from ..record.fields import FIELDS, canonical
from ..render.columns import column_names
from ..render.plot_metrics import plot_metric_names

__all__ = ["names_help"]

WIDTH = 112
TIMING = "timing"  # the fields no meter records: timing is always on
STEPS = "steps"  # the statistics over the recorded steps, beside the timing means


def _listed(head: str, text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=WIDTH, initial_indent=f"{indent}{head}",
                         subsequent_indent=indent + " " * len(head), break_on_hyphens=False)


def _meter_of(name: str) -> str:
    resolved = canonical(name)
    return (FIELDS[resolved].meter if resolved is not None else None) or TIMING


def _text_columns() -> list[str]:
    # Words, not numbers (``bound``): ``column_names`` leaves them out, as nothing sums or plots them, but a
    # summary column shows them.
    return [field.name for field in FIELDS.values() if field.unit == "text" and not field.detail]


def _statistics_columns() -> list[str]:
    """The statistics over the recorded steps, beside each pass's mean (``forward_ms_median``...)."""
    return [f"{name}_{statistic}" for name in STAT_PASSES for statistic in STATISTICS] + ["steps", "steps_run"]


def names_help() -> str:
    """The epilog section naming every meter, column and plot metric, columns grouped by their meter."""
    columns = column_names() + _text_columns()
    groups: dict[str, list[str]] = {TIMING: []}
    for name in columns:
        groups.setdefault(_meter_of(name), []).append(name)
    width = max(len(meter) for meter in [*groups, STEPS]) + 2
    lines = ["names (short names first, then the fields they stand for):"]
    lines += _listed("--metrics      ", ", ".join(sorted(METERS)), "  ")
    lines.append("  --columns      by the meter that records them (timing needs none):")
    for meter, names in groups.items():
        lines += _listed(f"{meter}:".ljust(width), ", ".join(names), "    ")
    statistics = _statistics_columns()
    lines += _listed(f"{STEPS}:".ljust(width), ", ".join(statistics), "    ")
    plottable = set(plot_metric_names())
    excluded = ", ".join(name for name in columns if name not in plottable)
    lines += _listed("--plot-metric  ", f"any column above but {excluded}, and none of the {STEPS} group", "  ")
    return "\n".join(lines) + "\n"
