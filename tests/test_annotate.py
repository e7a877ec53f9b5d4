"""annotate=True: record_function ranges named after the modules, in a real torch.profiler session."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from layerprof import LayerProf
from layerprof.collect.annotate import BACKWARD_SUFFIX, Annotator

from .conftest import hook_state
from .models import Residual


class Block(nn.Module):
    """Uses its input twice (x + f(x)): two frontier nodes, so backward_end names the call twice."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), Block(), nn.Linear(8, 1))


def _profiled(annotate: bool) -> tuple[list, LayerProf]:
    net = _net()
    with profile(activities=[ProfilerActivity.CPU]) as session:
        with LayerProf(net, annotate=annotate) as prof:
            for _ in range(2):
                net(torch.randn(3, 4, requires_grad=True)).sum().backward()
                prof.step()
    return list(session.events()), prof


def test_profiler_events_carry_module_names_forward_and_backward() -> None:
    events, prof = _profiled(annotate=True)
    names = [e.name for e in events]
    for module in ("Sequential", "0", "1", "1.inner", "1.inner.0", "1.inner.1", "2"):
        assert names.count(module) == 2, module  # one forward range per call, two steps
        assert names.count(module + BACKWARD_SUFFIX) == 2, module  # one backward interval per call
    # The ops run inside the ranges: an addmm inside Linear "0"'s forward range, on the same thread.
    forward = [e for e in events if e.name == "0"]
    inside = [e for e in events if e.name == "aten::addmm" and any(
        f.time_range.start <= e.time_range.start and e.time_range.end <= f.time_range.end for f in forward)]
    assert len(inside) == 2
    # Backward ranges nest: the inner Linear's backward lies within its block's backward, within the root's.
    def spans(name: str) -> list:
        return sorted((e.time_range.start, e.time_range.end) for e in events if e.name == name + BACKWARD_SUFFIX)
    for (root_start, root_end), (block_start, block_end), (leaf_start, leaf_end) in zip(
            spans("Sequential"), spans("1"), spans("1.inner.0")):
        assert root_start <= block_start <= leaf_start <= leaf_end <= block_end <= root_end
    # The block's backward range holds the linear's grad ops although its first frontier node (the add) ran first.
    assert prof.profile.records["1"].backward_ms >= prof.profile.records["1.inner.0"].backward_ms


def test_off_by_default_and_nothing_left_on_the_model() -> None:
    events, prof = _profiled(annotate=False)
    assert not any(e.name == "0" or e.name.endswith(BACKWARD_SUFFIX) for e in events)
    assert not any(isinstance(m, Annotator) for m in prof.metrics)
    net = Residual()
    before = hook_state(net)
    with LayerProf(net, annotate=True):
        net(torch.randn(2, 8)).sum().backward()
    assert hook_state(net) == before


def test_ranges_close_when_forward_raises() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(Boom()))
    with profile(activities=[ProfilerActivity.CPU]) as session:
        with pytest.raises(ValueError):
            with LayerProf(net, annotate=True) as prof:
                net(torch.randn(1, 2))
    annotator = next(m for m in prof.metrics if isinstance(m, Annotator))
    assert annotator._forward == [] and annotator._backward == []  # closed on the way out
    names = [e.name for e in session.events()]
    assert names.count("1.0") == 1 and names.count("1") == 1 and names.count("0") == 1


def test_annotate_cost_is_small() -> None:
    """A coarse bound (the measured ratio is in BENCHMARKS.md): annotations cost under 3x a plain profile."""
    net = nn.Sequential(*[nn.Linear(64, 64) for _ in range(20)])
    x = torch.randn(8, 64)

    def seconds(annotate: bool) -> float:
        with LayerProf(net, annotate=annotate) as prof:
            start = time.perf_counter()
            for _ in range(10):
                net(x).sum().backward()
                prof.step()
            return time.perf_counter() - start

    seconds(True)
    # Interleaved, the least of each: a burst over the three annotated runs (about 55 ms) cannot take all four.
    pairs = [(seconds(True), seconds(False)) for _ in range(4)]
    annotated, plain = min(a for a, _ in pairs), min(p for _, p in pairs)
    assert annotated < 3 * plain, (annotated, plain)
