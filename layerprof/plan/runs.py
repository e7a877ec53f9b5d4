"""Runs of consecutive children of an ``nn.Sequential`` as options of the plan, besides single modules.

``checkpoint_sequential`` wraps segments of a Sequential that are no module of the tree: one wrapper and one held
input for several layers, where wrapping each layer pays a wrapper each and holds each one's input. A plan over
modules cannot express that; a run can. Only ``nn.Sequential`` (matched by its type name in the records, checked
on the model when applied): its forward is known to call each child once, in order, on the last one's output,
so that the run can be cut out of it. A run is named ``parent[first:stop]`` (``[first:stop]`` for a root
Sequential), the children's positions as in Python slicing; it has two or more children and is not all of them
(that is the Sequential itself). A Sequential holding a child recorded under another name (first named elsewhere,
or held twice) offers none: its record's children are then not its positions.

What a run frees is worked out exactly, from the profiled step's storages (``freed_by_runs``), so runs are planned
where the profile holds them (a live one, or one saved with them: ``layerprof.record.step_tables``). Its recompute time is its children's,
less the tail that checkpoint's early stop skips at its end; its wrapper costs one call per Sequential call and
the tensors saved by all its children.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..metrics.checkpoint_bytes import freed_by_runs
from ..record.records import ModuleRecord
from .candidates import (Candidate, Priced, _forward_ms, _saved_tensors, grad_calls, grad_share, less_hooks,
                         reader_ops, skipped_tail_ms, tail_of)
from .solver import ends_of
from .wrap_cost import WrapCost

__all__ = ["RunOption", "run_options", "run_name", "parse_run", "recomputed_children", "MAX_CHILDREN"]

MAX_CHILDREN = 32  # a Sequential with more children offers no runs (their number grows with its square)
# Why a child keeps the run out: what recomputing it would get wrong (a child that frees nothing is fine inside).
_BLOCKING = ("shared", "modifies an input in place", "its input is modified in place", "side effects",
             "updates a key/value cache")
_NAME = re.compile(r"^(.*)\[(\d+):(\d+)\]$")


@dataclass(frozen=True)
class RunOption(Priced):
    """A run of ``parent``'s children at positions ``first .. stop - 1``: its name, pre-order ``start`` (the first
    child) and ``jump`` (past the last child's subtree), and what wrapping it frees (net of the input its
    checkpoint holds: ``kept_bytes`` 0) and costs."""

    name: str
    parent: str
    first: int
    stop: int
    start: int
    jump: int
    freed_bytes: int
    kept_bytes: int
    recompute_ms: float
    wrap_ms: float
    children: tuple[str, ...]


def run_name(parent: str, first: int, stop: int) -> str:
    return f"{parent}[{first}:{stop}]"


def parse_run(name: str) -> tuple[str, int, int] | None:
    """``(parent, first, stop)`` of a run's name, None for a module's."""
    found = _NAME.match(name)
    return None if found is None else (found.group(1), int(found.group(2)), int(found.group(3)))


def recomputed_children(records: dict[str, ModuleRecord], name: str) -> list[ModuleRecord]:
    """The records whose hooks see a plan entry's recomputation: a wrapped module's children (its own hooks do
    not see the re-run), or a run's children themselves."""
    run = parse_run(name)
    if run is None:
        return list(records[name].children)
    return list(records[run[0]].children[run[1]:run[2]])


def _run_tail_ms(children: Sequence[ModuleRecord]) -> float:
    """What checkpoint's early stop skips at the end of a run: going back from its last child, children that save
    nothing, then a Linear / convolution / average pooling (which saves before computing), or the tail inside a
    last child with children of its own (as ``skipped_tail_ms`` reads a module)."""
    skipped, inner = tail_of(list(children))
    return skipped + (0.0 if inner is None else skipped_tail_ms(inner))


def run_options(records: list[ModuleRecord], found: list[Candidate], below: list[int], tables: Any,
                cost: WrapCost | None, hook_ms: float, op_ms: float = 0.0) -> list[RunOption]:
    """Every admissible run of every Sequential in the pre-order ``records`` (``found`` their candidates,
    ``below`` their descendant calls), with what it frees from the storage ``tables``; none without tables.
    Children's times are priced as candidates' are: less ``hook_ms`` per call and ``op_ms`` per reader op inside."""
    if not tables:
        return []
    index = {id(record): i for i, record in enumerate(records)}
    ends = ends_of([candidate.parent for candidate in found])
    # Per Sequential offering runs: its index, children and the (first, stop) of its admissible runs.
    families: list[tuple[int, list[ModuleRecord], list[tuple[int, int]]]] = []
    # Parents holding a child recorded under another name (an alias): their record's children are not their
    # positions, by which a run is cut when applied.
    holding_aliases = {alias.rpartition(".")[0] for record in records if record.aliases for alias in record.aliases}
    for i, record in enumerate(records):
        if record.type != "Sequential":
            continue
        children = list(record.children)
        if not 3 <= len(children) <= MAX_CHILDREN or found[i].excluded in ("not called",) or _blocked(
                found[i]) or record.name in holding_aliases:
            continue
        if any(child.calls != record.calls for child in children):
            continue  # a child skipped or called again: not the Sequential's forward as known
        # blocked[k]: how many of the first k children keep a run out (a run is admissible where none inside does)
        blocked = [0]
        for child in children:
            blocked.append(blocked[-1] + _blocked(found[index[id(child)]]))
        families.append((i, children, [(first, stop) for first in range(len(children) - 1)
                                       for stop in range(first + 2, len(children) + 1)
                                       if blocked[stop] == blocked[first] and not (first == 0 and stop == len(children))]))
    # Each run's children's names, in order: what freed_by_runs reads and the option's ``children``.
    inside = [tuple(names[first:stop]) for _, children, spans in families
              for names in ([child.name for child in children],) for first, stop in spans]
    weights = iter(zip(freed_by_runs(tables, inside), inside))
    options = []
    for i, children, spans in families:
        record = records[i]
        # Each child's recompute ms and saved tensors, read once; a run's are summed over its children in their
        # order, as child by child (the same floating-point sums)
        child_ms = [(less_hooks(child, _forward_ms(child), hook_ms * below[index[id(child)]])
                     - op_ms * reader_ops(child)) * grad_share(child) for child in children]
        child_tensors = [_saved_tensors(child) for child in children]
        starts = [index[id(child)] for child in children]
        jumps = [ends[start] for start in starts]
        calls = grad_calls(record)  # (a call under no_grad skips the wrapper's set-up)
        # Going back from a run's last child, the early stop's tail ends at the last child before the stop that
        # saves tensors or has children of its own (``tail_of``), whatever the run's first child when that is
        # before it: read once per stop.
        tails: dict[int, tuple[int, float]] = {}  # stop -> where its tail ends (-1: past the first child), and it
        for first, stop in spans:
            freed, run = next(weights)
            if freed <= 0:
                continue
            recompute = sum(child_ms[first:stop])
            if record.calls == 1:
                if stop not in tails:
                    at = next((k for k in range(stop - 1, -1, -1) if child_tensors[k] or children[k].children), -1)
                    tails[stop] = (at, _run_tail_ms(children[max(0, at):stop]))
                ends_at, tail = tails[stop]
                recompute -= tail if first <= ends_at else _run_tail_ms(children[first:stop])
            options.append(RunOption(
                name=run_name(record.name, first, stop), parent=record.name, first=first, stop=stop,
                start=starts[first], jump=jumps[stop - 1], freed_bytes=freed, kept_bytes=0,
                recompute_ms=max(0.0, recompute), children=run,
                wrap_ms=0.0 if cost is None else cost.of(calls, sum(child_tensors[first:stop]))))
    return options


def _blocked(candidate: Candidate) -> bool:
    return candidate.excluded is not None and candidate.excluded.startswith(_BLOCKING)
