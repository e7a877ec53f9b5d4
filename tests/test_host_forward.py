"""The host's time of each forward beside the CUDA events' (``host_forward_ms``), and the checkpoint planner's
price of a recomputation from the two (``plan/candidates.py``, ``less_hooks``). The events are the fake ones of
``test_patterns.py`` on the CPU; a "GPU" slower than the host is an event whose elapsed time is scaled."""
from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.metrics.memory import MemoryMeter, MemoryReader
from layerprof.plan.candidates import candidates, less_hooks

from .invariants import check_profile
from .test_patterns import FakeEvent, FakeEventClock, fake_events  # noqa: F401,F811 (a fixture)


class Busy(nn.Module):
    """Host work of ``ms`` in its forward (the Python and launch side of a module), then a Linear."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass
        return torch.relu(self.fc(x))


def _gpu_slower(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """The fake events' elapsed time times ``factor``: a GPU behind the host throughout (its kernels' time)."""
    plain = FakeEvent.elapsed_time
    monkeypatch.setattr(FakeEvent, "elapsed_time", lambda self, end: factor * plain(self, end))


def test_events_keep_the_hosts_time_of_each_forward_beside_them(fake_events: list[FakeEventClock],  # noqa: F811
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    _gpu_slower(monkeypatch, 3.0)
    model = nn.Sequential(Busy(2.0), Busy(4.0))
    model(torch.randn(8, 16)).sum().backward()  # the process's first Linear call is cold (0.6-0.9 ms)
    with LayerProf(model) as prof:
        model(torch.randn(8, 16)).sum().backward()
    assert fake_events and prof.tree.steps == 1
    check_profile(prof, model)
    for name, ms in (("0", 2.0), ("1", 4.0)):
        record = prof.records[name]
        # The host's time is the busy loop's and a Linear's (a few µs); the events read three times the host's.
        assert ms <= record.host_forward_ms < ms + 5.0, (name, record.host_forward_ms)  # (a loaded host: more)
        assert record.forward_ms == pytest.approx(3.0 * record.host_forward_ms, rel=0.02)
    assert prof.tree.host_forward_ms >= prof.records["0"].host_forward_ms + prof.records["1"].host_forward_ms
    assert prof.records["0.fc"].host_forward_ms < 1.0
    assert prof.records["1"].host_forward_ms_median == prof.records["1"].host_forward_ms  # one step
    # In a DataFrame, and saved and read back with the profile.
    frame = prof.to_dataframe(columns=["name", "host_forward_ms"])
    assert frame.set_index("name").loc["1", "host_forward_ms"] == pytest.approx(prof.records["1"].host_forward_ms)
    prof.to_json(tmp_path / "events.json")
    loaded = layerprof.load(tmp_path / "events.json")
    assert loaded.records["1"].host_forward_ms == pytest.approx(prof.records["1"].host_forward_ms)
    assert loaded.records["1"].host_forward_ms_median == pytest.approx(prof.records["1"].host_forward_ms)


def test_the_hosts_median_over_steps_leaves_a_slow_step_out(fake_events: list[FakeEventClock]) -> None:  # noqa: F811
    busy = Busy(1.0)
    skipper = Busy(1.0)
    model = nn.Sequential(busy, nn.Linear(16, 16))
    model(torch.randn(8, 16)).sum().backward()
    with LayerProf(nn.ModuleDict({"model": model, "skipper": skipper})) as prof:
        for ms in (1.0, 1.0, 50.0, 1.0):  # one slow step on the host
            busy.ms = ms
            out = model(torch.randn(8, 16))
            if ms > 1.0:
                out = skipper(out)  # runs in that step only
            out.sum().backward()
            prof.step()
    record = prof.records["model.0"]
    assert record.steps == 4
    # the median of about 1, 1, 50 and 1 ms (below 12 however a loaded machine stretches the 1 ms steps: the full
    # suite beside three other jobs read 5.06 ms), where the mean holds the slow step
    assert 1.0 <= record.host_forward_ms_median < 12.0
    assert record.host_forward_ms >= (3 * 1.0 + 50.0) / 4
    # A module that ran in one step of four: zeros in the others, as its forward time has.
    skipped = prof.records["skipper"]
    assert skipped.host_forward_ms_median == 0.0 and 0.2 < skipped.host_forward_ms < 0.5


def test_the_wall_clock_records_no_host_time_of_its_own() -> None:
    model = nn.Sequential(Busy(0.5), nn.Linear(16, 4))
    with LayerProf(model) as prof:
        model(torch.randn(8, 16)).sum().backward()
    assert all(getattr(record, "host_forward_ms", None) is None for record in prof.records.values())


def _record(events_median: float, host_mean: float, events_mean: float | None = None) -> Any:
    return types.SimpleNamespace(forward_ms_median=events_median, host_forward_ms=host_mean,
                                 forward_ms=events_mean if events_mean is not None else events_median)


@pytest.mark.parametrize(("events", "host", "hooks", "expected"), [
    (10.0, 10.0, 4.0, 6.0),   # the GPU waited on the host: the host's time less the hooks, 10 - 4
    (9.0, 10.0, 4.0, 6.0),    # events below the host's time (the GPU had a backlog as the call began): the same
    (20.0, 10.0, 4.0, 20.0),  # the GPU behind throughout (events >= host + hooks): its time, hooks hidden
    (14.0, 10.0, 4.0, 14.0),  # at host + hooks exactly: the events
    (12.0, 10.0, 4.0, 10.0),  # between: max(10 - 4, min(12, 2 * 12 - 10 - 4 = 10))
])
def test_a_recomputation_on_cuda_is_priced_from_the_events_and_the_hosts_time(
        events: float, host: float, hooks: float, expected: float) -> None:
    assert less_hooks(_record(events, host), events, hooks) == pytest.approx(expected)


def test_the_hosts_median_prices_as_the_events_median_does_and_loses_the_same_tail() -> None:
    # One slow step put both means 20 % above the medians: the host's median is taken, as the events' is.
    record = _record(events_median=10.0, host_mean=12.0, events_mean=12.0)
    record.host_forward_ms_median = 10.0
    assert less_hooks(record, 10.0, 4.0) == pytest.approx(6.0)
    # An early-stop tail of 2 ms off the events (10 -> 8) comes off the host's time too: 10 - 2 - 4.
    assert less_hooks(record, 8.0, 4.0) == pytest.approx(4.0)
    # A slow step of the GPU alone (events [10, 10, 10, 40], the host 10 in each): the medians, 10 - 4.
    gpu_stall = _record(events_median=10.0, host_mean=10.0, events_mean=17.5)
    gpu_stall.host_forward_ms_median = 10.0
    assert less_hooks(gpu_stall, 10.0, 4.0) == pytest.approx(6.0)
    # And on the wall clock (no host figure), the forward less the hooks, as before.
    assert less_hooks(types.SimpleNamespace(forward_ms=10.0, forward_ms_median=10.0), 10.0, 4.0) == 6.0


@pytest.mark.parametrize("factor", [1.0, 4.0], ids=["host-bound", "gpu-bound"])
def test_the_planner_takes_the_hooks_off_only_where_the_gpu_waited_on_the_host(
        fake_events: list[FakeEventClock], monkeypatch: pytest.MonkeyPatch, factor: float) -> None:  # noqa: F811
    _gpu_slower(monkeypatch, factor)
    monkeypatch.setattr(MemoryMeter, "reader_factory", MemoryReader)  # no allocator to read on the fake "GPU"
    model = nn.Sequential(*(nn.Sequential(Busy(1.0), Busy(1.0), nn.Linear(16, 16)) for _ in range(3)))
    with LayerProf(model, metrics=("memory", "shapes")) as prof:
        for _ in range(2):
            model(torch.randn(8, 16, requires_grad=True)).sum().backward()
            prof.step()
    hooks = 0.05  # a figure per module call large enough to see (the fake events' profile measures none)
    bare = {c.name: c for c in candidates(prof.tree, hook_ms=0.0)}
    priced = {c.name: c for c in candidates(prof.tree, hook_ms=hooks)}
    for name in ("0", "1", "2"):
        inside = 5  # two Busy, their two Linears, the last Linear
        record = prof.records[name]
        if factor == 1.0:  # the events are the host's time: the hooks come off
            assert bare[name].recompute_ms - priced[name].recompute_ms == pytest.approx(inside * hooks, abs=0.02)
            assert priced[name].recompute_ms < record.forward_ms
        else:  # the GPU took four times the host's time: the events' figure, the hooks hidden in it
            assert priced[name].recompute_ms == pytest.approx(bare[name].recompute_ms)
            assert priced[name].recompute_ms > 2.0 * record.host_forward_ms
    plan = prof.checkpoint_plan(0.5, wrap_cost=None)
    assert plan.modules and all(c.recompute_ms > 0 for c in plan.chosen)


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.busy = Busy(1.0)
        self.c = Busy(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.busy(x)


class _Outer(nn.Module):
    """Calls its grandchild ``b.c`` itself, after ``b``: ``b`` adopts that call's times (timing.py, ``_adopt``)."""

    def __init__(self) -> None:
        super().__init__()
        self.b = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b.c(self.b(x))


def test_an_adopted_call_brings_its_hosts_time_with_it(fake_events: list[FakeEventClock],  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu_slower(monkeypatch, 3.0)
    model = _Outer()
    with LayerProf(model) as prof:
        model(torch.randn(8, 16)).sum().backward()
    inner, grandchild = prof.records["b"], prof.records["b.c"]
    assert grandchild.calls == 1 and inner.forward_ms > 3.0 * 2.5  # its own 1 ms and the adopted 2 ms, times 3
    assert inner.forward_ms == pytest.approx(3.0 * inner.host_forward_ms, rel=0.02)


class _Stack(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(Busy(0.5), nn.Linear(16, 16)) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_on_a_gpu_bound_profile_the_hooks_move_neither_recomputations_nor_the_wrappers_gaps(
        fake_events: list[FakeEventClock], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The wrappers' gaps (``plan/gaps.py``) are the events' time too: where the GPU ran behind the host, the hooks'
    host time is not in them, and the plan's figures are the same whatever the hooks cost."""
    from layerprof.plan.wrap_cost import WrapCost

    _gpu_slower(monkeypatch, 4.0)
    monkeypatch.setattr(MemoryMeter, "reader_factory", MemoryReader)
    model = _Stack(6)  # (not a Sequential: no runs of its children, each wrapped block a call of its own)
    with LayerProf(model, metrics=("memory", "shapes")) as prof:
        for _ in range(2):
            model(torch.randn(8, 16, requires_grad=True)).sum().backward()
            prof.step()
    # A wrapper costs 0.05 ms cold, 0.01 ms right after another, 0.03 ms after 5 ms of other work.
    cost = WrapCost(0.05, 0.0, gap_points=((0.0, 0.0, 0.01), (5.0, 5.0, 0.03), (50.0, 50.0, 0.05)))
    figures, colds = [], []
    for hooks in (0.0, 0.2):
        prof.profile.meta["hook_ms"] = hooks
        plan = prof.checkpoint_plan(0.5, wrap_cost=cost)
        figures.append((plan.modules, plan.extra_ms, [c.wrap_ms for c in plan.chosen]))
        colds.append(plan.cold_extra_ms)
    # gaps priced: below the same plan's cold figure (the second plan's takes the hooks off its recomputations: on a
    # loaded machine, where the gaps read long and little is saved, the first plan's figure can stand above it)
    assert len(figures[0][0]) >= 2 and figures[0][1] < colds[0]
    assert figures[1] == figures[0]


def test_a_hook_calibration_that_raises_costs_the_figure_not_the_plan_or_the_save(tmp_path: Path) -> None:
    """On a full GPU the hooks' calibration (a stack moved to the device) can raise out of memory: the plan and the
    save go on without the figure, with a warning, and do not try again."""
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    with LayerProf(model, metrics=("memory", "shapes")) as prof:
        model(torch.randn(8, 16, requires_grad=True)).sum().backward()
    tries = []

    def full(*args: Any) -> float:
        tries.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    prof.profile.measures = {"hook_ms": full}
    with pytest.warns(RuntimeWarning, match="could not measure hook_ms.*OutOfMemoryError"):
        plan = prof.checkpoint_plan(0.5, wrap_cost=None)
    assert plan.hook_ms == 0.0 and plan.modules
    prof.to_json(tmp_path / "profile.json")  # not tried again, nothing raised
    assert tries == [1] and "hook_ms" not in layerprof.load(tmp_path / "profile.json").meta
