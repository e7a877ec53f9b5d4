"""Invariants every profile of every model must satisfy, and a reference count of module calls."""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Iterator

from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from layerprof import LayerProf

TOLERANCE_MS = 1e-6


def _spans(record) -> list[tuple[float, float, float | None]]:
    """(start, end, backward) of the record's calls that count in its inclusive time: not re-runs, outermost."""
    return [(t.forward_start_ms, t.forward_start_ms + t.forward_ms, t.backward_ms) for t in record.call_times
            if not t.recompute and not t.recursive]


def adopted_ms(record) -> tuple[float, float]:
    """(forward, backward) milliseconds of the calls of ``record``'s descendants made outside every call of a
    module of its subtree, which its inclusive times hold (record/adoption.py), found from the call times alone:
    a call begun inside another call of the subtree is inside it (one clock, one thread)."""
    if not record.calls:
        return 0.0, 0.0
    subtree = [record, *record.descendants]
    spans = [span for member in subtree for span in _spans(member)]
    forward = backward = 0.0
    for member in record.descendants:
        for start, end, backward_ms in _spans(member):
            if not any(other_start < start < other_end for other_start, other_end, _ in spans):
                forward += end - start
                backward += backward_ms or 0.0
    return forward, backward


@contextmanager
def count_calls(model: nn.Module, on_modules: bool = False) -> Iterator[Counter]:
    """Count forward calls per qualified name: the reference for ``calls``. With a global pre-hook (torch's
    ``register_module_forward_pre_hook``), which leaves the modules without hooks of their own, so that layerprof
    times them as it does a user's: by its call wrapper. ``on_modules``: with a pre-hook on each module instead, so
    that layerprof times every call by the hooks it puts beside a module's own."""
    counts: Counter = Counter()
    if on_modules:
        handles = [module.register_forward_pre_hook(lambda m, a, name=name: counts.update([name]))
                   for name, module in model.named_modules()]
    else:
        # (the modules held beside their names: their ids stay theirs)
        named = {id(module): (name, module) for name, module in model.named_modules()}

        def count(module: nn.Module, args: object) -> None:
            entry = named.get(id(module))
            if entry is not None:
                counts.update([entry[0]])

        handles = [register_module_forward_pre_hook(count)]
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def check_profile(prof: LayerProf, model: nn.Module, backward: bool = True,
                  backward_wall_ms: float | None = None) -> None:
    """Structure and numbers that must hold for any profile of ``model``; ``backward_wall_ms``: the wall time of
    the step's backward calls, which the root's backward must fit in."""
    rows = prof.to_dict()
    assert list(rows) == [name for name, _ in model.named_modules()], "records must mirror named_modules()"
    for name, record in prof.records.items():
        assert record.calls == len([t for t in record.call_times if not t.recompute])
        if record.calls:
            assert record.forward_ms is not None and record.forward_ms >= 0
            outermost = [t for t in record.call_times if not t.recompute and not t.recursive]
            adopted_forward, adopted_backward = adopted_ms(record)
            assert abs(record.forward_ms - sum(t.forward_ms for t in outermost) - adopted_forward) < 1e-6, name
            if record.backward_ms is not None:
                own = sum(t.backward_ms or 0.0 for t in outermost)
                assert abs(record.backward_ms - own - adopted_backward) < 1e-6, name
            assert record.self_forward_ms is not None and record.self_forward_ms >= -TOLERANCE_MS
        else:
            assert record.forward_ms is None and record.backward_ms is None
        children = [c for c in record.children if c.forward_ms is not None]
        if record.forward_ms is not None and children:
            # Forward calls nest strictly inside their parent's, so the children's sum fits in the parent.
            assert sum(c.forward_ms for c in children) <= record.forward_ms + TOLERANCE_MS, name
        for child in record.children:
            if child.backward_ms is not None and record.backward_ms is not None:
                assert child.backward_ms <= record.backward_ms + TOLERANCE_MS, (name, child.name)
    root = prof.tree
    # No module costs more than the whole step (no share above 100 %), in either pass.
    for name, record in prof.records.items():
        for field in ("forward_ms", "backward_ms"):
            value, whole = getattr(record, field), getattr(root, field)
            if value is not None and whole is not None:
                assert value <= whole + TOLERANCE_MS, (name, field)
    if backward_wall_ms is not None and root.backward_ms is not None:
        assert root.backward_ms <= backward_wall_ms, (root.backward_ms, backward_wall_ms)
    if backward:
        assert root.backward_ms is not None and root.backward_ms > 0
    else:
        assert all(record.backward_ms is None for record in prof.records.values())


def children_within(prof: LayerProf, fields: tuple[str, ...]) -> None:
    """No child above its parent, nor the children's sum, in any of ``fields``, among the modules that ran (for a
    model whose subtrees do not overlap: no module shared by two parents nor called from a sibling's forward)."""
    for record in prof.records.values():
        if not record.calls:
            continue
        for field in fields:
            ours = getattr(record, field)
            theirs = [getattr(child, field) for child in record.children if child.calls]
            assert all(value <= ours + 1e-6 for value in theirs), (record.name, field)
            assert sum(theirs) <= ours + 1e-6, (record.name, field)


def parameter_modules_have_backward(prof: LayerProf, model: nn.Module) -> None:
    """Every module that ran and owns a parameter that received a gradient has a backward time above 0."""
    for name, module in model.named_modules():
        record = prof.records.get(name)
        if record is None or not record.calls:
            continue
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own and any(p.grad is not None for p in own):
            assert record.backward_ms is not None and record.backward_ms > 0, name


STEP_STATISTICS = ("", "_median", "_min", "_max", "_p95")


def check_truth(prof: LayerProf, model: nn.Module, backward_wall_ms: float | None = None,
                reference: Counter | None = None) -> None:
    """The invariants of issue 12, for any training pattern: backward time wherever a module's own parameters got
    a gradient, children within their parent in every statistic, the root's backward within the wall time of
    the backward calls, no share above 100 %, exact call counts."""
    records = prof.records
    root = prof.tree
    steps = root.steps
    for name, module in model.named_modules():
        record = records.get(name)
        if record is None or not record.calls:
            continue
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own and all(p.grad is not None for p in own):
            assert record.backward_ms is not None and record.backward_ms > 0, name
    for name, record in records.items():
        assert record.steps == steps and 0 <= record.steps_run <= steps, name
        # A container that is never called (ModuleList) has no interval to hold its children's.
        for child in record.children if record.calls else ():
            if not child.calls or child.aliases:
                continue
            for field in ("forward_ms", "backward_ms"):
                for statistic in STEP_STATISTICS:
                    theirs = getattr(child, field + statistic)
                    ours = getattr(record, field + statistic)
                    if theirs is not None:
                        # A child that ran inside its parent cannot outlast it, in any step or statistic.
                        assert ours is not None and theirs <= ours + TOLERANCE_MS, (name, child.name, field + statistic)
        total = record.total_ms
        if total is not None and record is not root:
            assert total <= root.total_ms + TOLERANCE_MS, name  # no share above 100 %
    if backward_wall_ms is not None:
        assert root.backward_ms is not None and root.backward_ms <= backward_wall_ms, (root.backward_ms, backward_wall_ms)
    if reference is not None:
        for name, record in records.items():
            assert record.calls * steps == reference[name], name
