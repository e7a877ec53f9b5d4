"""The annotated model repr: ``nn.Module.__repr__`` rebuilt from the records, one stats block per module.

Built from records alone (type, extra_repr, children), so it needs no model, patches no module, and works on a
loaded profile as well as a live one.
"""
from __future__ import annotations

from typing import Any, Iterable

from .._check import check_int
from ..record.records import ModuleRecord
from ..record.summed import TreeValues, counted_only, ran
from ..record.untimed import reads_time, untimed_note
from .columns import Column, counted_columns, resolve_columns
from .footer import summary_footer
from .plot_metrics import how_to_record, run_lacks
from .units import format_count, format_counted, format_ms

__all__ = ["annotated_repr", "summary_header", "partial_note", "unknown_ops_note", "run_note", "SUMMED_NOTE",
           "COUNTED_ONLY_NOTE", "NOT_RUN_NOTE"]

# Marks a module never called itself (a ModuleList) that shows the totals of its children (``record/summed.py``).
SUMMED_NOTE = "sum of its children: not called itself"
# Marks a module that ran only in the step its FLOPs, memory and shapes were counted in (``counted_only``).
COUNTED_ONLY_NOTE = "ran only in the counted step, which the times leave out"
# Marks a module never called in the profiled steps (an unused branch, a holder of packed weights).
NOT_RUN_NOTE = "not run"


def steps_note(record: ModuleRecord) -> str | None:
    """``ran in 2 of 3 steps`` for a module that some recorded steps did not run (its figures count 0 there)."""
    steps, steps_run = getattr(record, "steps", 0), getattr(record, "steps_run", 0)
    return f"ran in {steps_run} of {steps} steps" if steps and 0 < steps_run < steps else None


def run_note(record: ModuleRecord, values: TreeValues) -> str | None:
    """How a module ran, where its figures alone would mislead: not run, only in the counted step, or in some
    steps only; None for a module run in every step and for a summed container (its own note says it)."""
    if values.summed(record):
        return None
    if not ran(record):
        return COUNTED_ONLY_NOTE if counted_only(record) else NOT_RUN_NOTE
    return steps_note(record)


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


def _annotation(record: ModuleRecord, values: TreeValues, columns: list[Column]) -> str:
    if not columns:  # columns=(): nn.Module.__repr__ of the records (a class's own __repr__ is not kept)
        return ""
    summed = values.summed(record)
    if not summed and not ran(record) and not counted_only(record):
        return f"【{NOT_RUN_NOTE}】"
    parts = [column.text(values.view(record), values.view(values.root)) for column in columns]
    if summed:
        parts.append(SUMMED_NOTE)
    elif not ran(record):
        parts.append(COUNTED_ONLY_NOTE)
    if record.calls not in (0, 1) and all(column.name != "calls" for column in columns):
        parts.append(f"{format_count(record.calls)} calls")
    some_steps = steps_note(record)
    if some_steps is not None:  # its figures count 0 in the other steps: say so where they are read
        parts.append(some_steps)
    return "【" + " | ".join(parts) + "】"


def _render(record: ModuleRecord, values: TreeValues, columns: list[Column], depth: int | None,
            aliases: dict[str, list[tuple[str, ModuleRecord]]]) -> str:
    lines = record.extra_repr.split("\n") if record.extra_repr else []
    # A summed container takes no level: its children are at its depth, shown wherever it is.
    shown = values.shown_depth(record)
    expand = depth is None or shown < depth or (shown == depth and values.summed(record) and record.parent is not None)
    if expand:
        entries: list[tuple[str, str]] = []
        for child in record.children:
            child_text = _render(child, values, columns, depth, aliases)
            entries.append((child.short_name, f"({child.short_name}): " + _indent(child_text, 2)))
        for key, target in aliases.get(record.name, ()):
            note = f"same module as '{target.name}'"
            line = f"({key}): {target.type}【{note}, counted there】()" if columns else f"({key}): {target.type}({note})"
            _insert_in_order(entries, key, line)
        lines.extend(line for _, line in entries)
    elif record.children:
        lines.append(f"... {format_counted(len(record.children), 'child', 'children')}")
    head = record.type + _annotation(record, values, columns) + "("
    if not lines:
        return head + ")"
    # An extra_repr of one line goes inside the parentheses; a shared module's line is a child's, on its own.
    if len(lines) == 1 and not record.children and not (expand and aliases.get(record.name)):
        return head + lines[0] + ")"
    return head + "\n  " + "\n  ".join(lines) + "\n)"


def _insert_in_order(entries: list[tuple[str, str]], key: str, line: str) -> None:
    """Put an alias line among its siblings: before the first one with a larger index when the keys are indices
    (Sequential, ModuleList), so that ``(0)`` comes before ``(1)``; after them otherwise (records keep no other
    order of a module's attributes)."""
    if key.isdigit():
        for index, (other, _) in enumerate(entries):
            if other.isdigit() and int(other) > int(key):
                entries.insert(index, (key, line))
                return
    entries.append((key, line))


def _alias_positions(root: ModuleRecord) -> dict[str, list[tuple[str, ModuleRecord]]]:
    positions: dict[str, list[tuple[str, ModuleRecord]]] = {}
    for record in root.descendants:
        for alias in record.aliases:
            parent, _, key = alias.rpartition(".")
            positions.setdefault(parent, []).append((key, record))
    return positions


def partial_note(meta: dict) -> str | None:
    """What a partial profile (a run that ended early) says of itself, ``Partial profile (3 steps recorded): why``,
    for the summary's first line and TensorBoard's text; None for a complete profile."""
    partial = meta.get("partial")
    if not partial:
        return None
    return f"Partial profile ({format_counted(meta.get('steps'), 'step')} recorded): {partial}"


def unknown_ops_note(root: ModuleRecord, shown: int = 3, values: TreeValues | None = None) -> str | None:
    """A line saying which ops the FLOP counts leave out (ran with no formula, counted 0), the most called
    first (a root never called: its top-level modules'); None when every op was priced."""
    unknown = (values or TreeValues(root)).counts(root, "unknown_ops")
    if not unknown:
        return None
    named = ", ".join(f"{op} ({format_counted(calls, 'call')})" for op, calls in list(unknown.items())[:shown])
    more = f" and {len(unknown) - shown} more" if len(unknown) > shown else ""
    return (f"FLOPs leave out {format_counted(len(unknown), 'op')} with no formula, counted 0: {named}{more}; "
            "prof.unknown_ops() lists them, layerprof.register_flop_formula prices one")


def summary_header(root: ModuleRecord, values: TreeValues | None = None) -> str:
    """One line with the step's totals and what the percentages are of. A root that was not called (a trainer
    calling ``model.net(x)``) totals its top-level modules that ran, and the line says so."""
    values = values or TreeValues(root)
    totals = [format_ms(values.value(root, name)) for name in ("forward_ms", "backward_ms", "total_ms")]
    step = f"forward {totals[0]}, backward {totals[1]}, total {totals[2]}"
    if values.summed(root):
        return (f"Step: {step}, summed over the top-level modules that ran (the model itself was not called); "
                "percentages are of that total.")
    if values.value(root, "forward_ms") is not None and not any(
            record.backward_ms is not None for record in (root, *root.descendants)):
        return f"Step: {step}; percentages are of the total, the model's forward (the steps ran no backward)."
    return f"Step: {step}; percentages are of the total (forward + backward of the model)."


def _check_held(chosen: list[Column], root: ModuleRecord, values: TreeValues, meta: dict[str, Any] | None) -> None:
    """A column asked for by name that the run left out (its meter did not run; backward in a forward-only run)
    would print "—" on every line: refused, saying how to record it, as plot, compare and the command line do.
    The default columns of a forward-only run still show, and so does a column the model gave no value of (a CUDA
    figure on the CPU): a script that asks the same columns of every model goes on."""
    records = [root, *root.descendants]
    untimed = untimed_note(meta)
    for column in chosen:
        if untimed is not None and reads_time(column.field):
            raise ValueError(f"column {column.name!r} reads a measured time, and this profile has {untimed}: show "
                             "what it counted, such as columns=('flops', 'params', 'saved_bytes')")
        held = any(values.value(record, column.name) is not None for record in records)
        if not held and run_lacks(column.field, records, meta):
            hint = how_to_record(column.field, records, "this profile has", ", or show a forward column")
            raise ValueError(f"column {column.name!r}: no module of this profile holds it; {hint}")


def annotated_repr(root: ModuleRecord, columns: Iterable[str] | None = None, depth: int | None = None,
                   header: bool = True, footer: bool = False, meta: dict[str, Any] | None = None) -> str:
    """The model's repr with each module's costs; ``depth`` limits how deep modules are expanded (root = 0; a
    summed container such as a ModuleList takes no level, so ``depth=2`` shows BERT's ``encoder.layer.0``).
    ``footer`` adds totals below it: model size, activation and saved memory, the largest modules (``meta``, the
    profile's: where its memory peaks were read)."""
    depth = check_int("depth", depth, none=True)
    untimed = untimed_note(meta)
    # A profile without times shows by default what it counted (its FLOPs, parameters, saved bytes).
    chosen = resolve_columns(columns if columns is not None or untimed is None else counted_columns(root),
                             root=root)
    values = TreeValues(root)
    if columns is not None:
        _check_held(chosen, root, values, meta)
    body = _render(root, values, chosen, depth, _alias_positions(root))
    if header:
        counts_flops = any(column.field.meter == "flops" for column in chosen)
        unknown = unknown_ops_note(root, values=values) if counts_flops else None
        first = (summary_header(root, values) if untimed is None
                 else f"{untimed[0].upper()}{untimed[1:]}; percentages are of the model's total of each column.")
        text = "\n".join(part for part in (first, unknown, body) if part is not None)
    else:
        text = body
    totals = summary_footer(root, meta=meta) if footer else ""
    return text + "\n" + totals if totals else text
