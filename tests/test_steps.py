"""Many steps: statistics, warm-up, schedules, start/stop, distorting meters, benchmark()."""
from __future__ import annotations

import random
import statistics
import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import layerprof
import layerprof.collect.profiler as profiler_module
from layerprof import LayerProf
from layerprof.metrics import METERS, Meter, register_meter
from layerprof.collect.statistics import RunningStat

from .conftest import TORCH_CALL_IMPL, hook_state, module_call
from .models import MLP


class Sleepy(nn.Module):
    """Sleeps ``delays[i]`` seconds in its i-th call, so step times are known and distinct."""

    def __init__(self, delays: list[float]) -> None:
        super().__init__()
        self.delays = list(delays)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delays.pop(0) if self.delays else 0.0)
        return self.fc(x)


@pytest.fixture
def step_spy(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every per-step result the profiler computes, as computed."""
    seen: list[dict] = []
    original = profiler_module.step_times

    def spy(calls, step=0):  # type: ignore[no-untyped-def]
        result = original(calls, step)
        seen.append(result)
        return result

    monkeypatch.setattr(profiler_module, "step_times", spy)
    return seen


def test_statistics_equal_values_computed_from_the_samples(step_spy: list[dict]) -> None:
    model = Sleepy([0.030, 0.030, 0.002, 0.006, 0.003, 0.009, 0.004])
    with LayerProf(model, warmup=2) as prof:
        for _ in range(7):
            model(torch.randn(2, 4)).sum().backward()
            prof.step()
    assert len(step_spy) == 7
    kept = step_spy[2:]  # the first two are warm-up
    for field in ("forward_ms", "backward_ms"):
        values = [getattr(step[""], field) for step in kept]
        root = prof.tree
        assert root.steps == 5
        assert getattr(root, field) == pytest.approx(statistics.fmean(values))
        assert getattr(root, f"{field}_median") == pytest.approx(statistics.median(values))
        assert getattr(root, f"{field}_std") == pytest.approx(statistics.stdev(values))
        assert getattr(root, f"{field}_min") == min(values)
        assert getattr(root, f"{field}_max") == max(values)
        assert getattr(root, f"{field}_p95") == pytest.approx(float(np.percentile(values, 95)))
    # The 30 ms warm-up steps are really excluded: the spy saw them first (a sleep's lower bound holds under any
    # load), and the statistics above are those of the other five. (A bound on the kept steps' time, which
    # slept 9 ms at most, is one a preemption can reach.)
    assert all(step[""].forward_ms >= 30.0 for step in step_spy[:2])
    assert prof.tree.forward_ms_min > 1.5
    assert prof.records["fc"].calls == 1
    assert len(prof.records["fc"].call_times) == 1 and prof.records["fc"].call_times[0].step == 6
    assert prof.profile.meta["steps"] == 5 and prof.profile.meta["warmup"] == 2


def test_a_loop_without_step_is_one_step() -> None:
    model = MLP()
    with LayerProf(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
    assert prof.tree.steps == 1 and prof.tree.calls == 3 and len(prof.tree.call_times) == 3


def test_step_inside_the_models_call_is_refused_and_a_hook_on_the_model_itself_steps() -> None:
    # prof.step() from a forward hook on a submodule (one step per generated token) ended the step inside the
    # model's open call, which was lost: the summary said the model was never called (calls 0), silently.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    before = hook_state(model)
    prof = LayerProf(model)
    handle = model[2].register_forward_hook(lambda module, args, output: prof.step())
    with pytest.raises(RuntimeError, match=r"prof.step\(\) was called while the forward of the model is running"):
        with torch.no_grad(), prof:
            model(x)
    handle.remove()
    assert hook_state(model) == before
    prof = LayerProf(model)
    handle = model.register_forward_hook(lambda module, args, output: prof.step())
    with torch.no_grad(), prof:
        for _ in range(4):
            model(x)
    handle.remove()
    root = prof.records[""]
    assert (root.steps, root.calls, prof.records["2"].calls) == (4, 1, 1)  # (calls: the mean over the steps)
    assert root.forward_ms >= prof.records["0"].forward_ms > 0


class FailsOnOdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls % 2 == 0:
            raise ValueError("a bad batch")
        return self.fc(x)


def test_a_step_whose_forward_raised_and_was_caught_is_no_step() -> None:
    # A loop that skips a bad batch (try/except around the step): that step was recorded as one where no module
    # ran, so the root, called in every step that counted, read calls 0.5 and min 0 over 10 steps.
    model = FailsOnOdd()
    with LayerProf(model) as prof:
        for _ in range(10):
            try:
                model(torch.randn(4, 8)).sum().backward()
            except ValueError:
                pass
            finally:
                prof.step()
    root = prof.records[""]
    assert (root.steps, root.steps_run, root.calls) == (5, 5, 1) and root.forward_ms_min > 0
    assert prof.profile.meta["steps"] == 5 and prof.profile.meta["steps_seen"] == 10


def test_a_step_after_a_keyboard_interrupt_in_a_hooked_forward_is_not_refused() -> None:
    # Torch runs no always_call hook on a KeyboardInterrupt: the root's call (it carries a hook of the user's, so
    # layerprof's hooks time it) stays on the stack until the step ends. prof.step() took it for a call still
    # running and refused every later step.
    class Interrupted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.interrupt = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.interrupt:
                raise KeyboardInterrupt
            return self.fc(x)

    model = Interrupted()
    model.register_forward_hook(lambda module, args, output: None)
    with LayerProf(model) as prof:
        for step in range(4):
            model.interrupt = step == 1
            try:
                model(torch.randn(4, 8)).sum().backward()
            except KeyboardInterrupt:
                pass
            prof.step()
    # (the interrupted step timed nothing: no step, as one whose forward raised)
    assert prof.records[""].steps == 3 and prof.records["fc"].steps_run == 3


def test_no_recorded_step_names_the_schedule_it_was_left_out_by() -> None:
    # It named warmup=0 (the unused argument) and advised lowering it.
    model = MLP()
    with pytest.warns(RuntimeWarning, match=r"were all warm-up or outside the schedule \(Schedule\(wait=2, "
                      r"warmup=1, active=2.*or change the schedule\."):
        with LayerProf(model, schedule=layerprof.schedule(wait=2, warmup=1, active=2)) as prof:
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                prof.step()


def test_a_trailing_step_call_adds_no_empty_step() -> None:
    model = MLP()
    with LayerProf(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            prof.step()
    assert prof.tree.steps == 3 and prof.tree.calls == 1


def test_schedule_profiles_exactly_the_steps_asked_for_and_unhooks_the_rest(step_spy: list[dict]) -> None:
    model = MLP()
    before = hook_state(model)
    hooked = []
    prof = LayerProf(model, schedule=layerprof.schedule(wait=1, warmup=1, active=2, repeat=1))
    prof.start()
    for _ in range(6):
        # Ours: the call wrapper inside torch's Module._call_impl (its code swapped) on the default path, else in
        # the module's own dict.
        hooked.append(len(model.body[0]._forward_pre_hooks) + (module_call() is not TORCH_CALL_IMPL))
        model(torch.randn(2, 8)).sum().backward()
        prof.step()
    prof.stop()
    # wait, warmup, active, active, then done: hooks only in steps 1..3.
    assert hooked == [0, 1, 1, 1, 0, 0]
    assert [s[""].call_times[0].step for s in step_spy] == [1, 2, 3]
    assert prof.tree.steps == 2
    assert hook_state(model) == before


def test_schedule_validation() -> None:
    with pytest.raises(ValueError, match="schedule active must be >= 1, got 0"):
        layerprof.schedule(active=0)
    with pytest.raises(ValueError, match="either warmup= or schedule="):
        LayerProf(MLP(), warmup=1, schedule=layerprof.schedule())
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        LayerProf(MLP(), warmup=-1)
    s = layerprof.schedule(skip_first=2, wait=0, warmup=0, active=1, repeat=2)
    assert [s(i).value for i in range(5)] == ["none", "none", "record", "record", "none"]


def test_start_stop_api_and_misuse() -> None:
    model = MLP()
    prof = LayerProf(model)
    with pytest.raises(RuntimeError, match="call prof.start"):
        prof.stop()
    with pytest.raises(RuntimeError, match="inside a running profile"):
        prof.step()
    prof.start()
    model(torch.randn(2, 8)).sum().backward()
    prof.stop()
    assert prof.tree.calls == 1 and prof.tree.backward_ms > 0
    with pytest.raises(RuntimeError, match="already used"):
        prof.start()


def test_statistics_memory_is_bounded() -> None:
    stat = RunningStat(max_samples=16, rng=random.Random(0))
    values = [float(v) for v in range(1000)]
    for value in values:
        stat.add(value)
    summary = stat.summary()
    assert len(stat._samples) == 16
    assert summary["mean"] == pytest.approx(statistics.fmean(values))
    assert summary["std"] == pytest.approx(statistics.stdev(values))
    assert (summary["min"], summary["max"]) == (0.0, 999.0)
    # The reservoir is a uniform sample: its median lands in the middle half.
    assert 250 <= summary["median"] <= 750

    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)])
    with LayerProf(model, max_samples=4) as prof:
        for _ in range(10):
            with torch.no_grad():
                model(torch.randn(1, 2))
            prof.step()
    modules = prof._stats._modules.values()
    assert modules and all(len(m.forward.samples) == 4 and len(m.backward.samples) == 4 for m in modules)
    assert prof.tree.steps == 10


def test_timing_distorting_meter_runs_on_the_first_step_only() -> None:
    active_steps: list[int] = []

    @register_meter
    class Counting(Meter):
        name = "test_counting"
        wants_forward_hooks = True
        distorts_timing = True

        def forward_pre(self, call, module, args, kwargs):  # type: ignore[no-untyped-def]
            if call.name == "":
                active_steps.append(len(active_steps))

    try:
        model = MLP()
        with LayerProf(model, metrics=("test_counting",)) as prof:
            for _ in range(3):
                model(torch.randn(2, 8)).sum().backward()
                prof.step()
        assert active_steps == [0]
        assert prof.tree.steps == 2  # the counting step is left out of the timings
        assert "timing_distorted_by" not in prof.profile.meta

        with pytest.warns(RuntimeWarning, match="only one step was profiled"):
            with LayerProf(model, metrics=("test_counting",)) as single:
                model(torch.randn(2, 8)).sum().backward()
        assert single.tree.steps == 1 and single.profile.meta["timing_distorted_by"] == ["test_counting"]
    finally:
        del METERS["test_counting"]


def test_a_plug_in_meter_whose_needed_by_is_a_static_method() -> None:
    # needed_by written as a @staticmethod (no __func__): every LayerProf still starts, and the meter joins
    # unasked where it says the model needs it.
    @register_meter
    class Wanted(Meter):
        name = "test_wanted"

        @staticmethod
        def needed_by(model):  # type: ignore[no-untyped-def]
            return isinstance(model, MLP)

    try:
        with LayerProf(MLP()) as prof:
            pass
        assert "test_wanted" in {meter.name for meter in prof.metrics}
        with LayerProf(nn.Linear(2, 2)) as other:
            pass
        assert "test_wanted" not in {meter.name for meter in other.metrics}
    finally:
        del METERS["test_wanted"]


def test_the_default_meters_follow_the_registry() -> None:
    # The default meters' classes are kept while the registry is as it was (its dict version): a meter that joins
    # every model joins from its registration on, and no longer once it is taken out of the registry.
    def names() -> list[str]:
        return [meter.name for meter in LayerProf(nn.Linear(2, 2)).metrics]

    assert names() == ["params"]

    @register_meter
    class Always(Meter):
        name = "test_always"

        @classmethod
        def needed_by(cls, model: nn.Module) -> bool:
            return True

    try:
        assert names() == ["params", "test_always"]
    finally:
        del METERS["test_always"]
    assert names() == ["params"]


def test_profile_records_where_it_was_measured() -> None:
    model = MLP()
    with LayerProf(model) as prof:
        model(torch.randn(5, 8)).sum().backward()
    assert prof.meta is prof.profile.meta
    env = prof.profile.meta["environment"]
    for key in ("host", "os", "cpu", "cpu_count", "torch", "threads", "interop_threads", "device", "gpu", "dtype"):
        assert key in env
    assert env["batch_size"] == 5 and env["dtype"] == "float32" and env["device"] == "cpu"
    assert env["torch"] == torch.__version__ and env["threads"] == torch.get_num_threads()


class KeywordsOnly(nn.Module):
    """A model called with keyword arguments only, as Hugging Face models are."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, *, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


@pytest.mark.parametrize("metrics", [None, ("shapes",)])  # timing only; a meter observing calls
@pytest.mark.parametrize("own_hook", [False, True])  # the root with a forward pre-hook of its own (hooked apart)
def test_the_example_input_is_the_roots_first_tensor(metrics, own_hook) -> None:
    model = KeywordsOnly()
    if own_hook:
        model.register_forward_pre_hook(lambda module, args: None)
    before = hook_state(model)
    for _ in range(2):  # a first block, then one that reuses its plan
        with LayerProf(model, metrics=metrics) as prof:
            model.embed(torch.zeros(7, dtype=torch.long))  # a submodule's call first: not the model's input
            model(input_ids=torch.zeros(3, 5, dtype=torch.long)).sum().backward()
            model(input_ids=torch.zeros(2, 5, dtype=torch.long)).sum().backward()  # the first call's is kept
        env = prof.meta["environment"]
        assert (env["batch_size"], env["input_dtype"]) == (3, "int64")
    assert hook_state(model) == before


def test_what_can_change_between_profiles_is_read_again() -> None:
    # The machine's facts and the names of a device and dtype are kept per process; the model's dtype and the
    # threads are read at every block.
    model = MLP()

    def env() -> dict:
        with LayerProf(model) as prof:
            model(torch.randn(5, 8).to(next(model.parameters()).dtype)).sum().backward()
        return prof.meta["environment"]

    threads = torch.get_num_threads()
    assert (env()["dtype"], env()["threads"]) == ("float32", threads)
    model.double()
    torch.set_num_threads(threads + 1)
    try:
        assert (env()["dtype"], env()["threads"]) == ("float64", threads + 1)
    finally:
        torch.set_num_threads(threads)
    model.float()
    assert env()["dtype"] == "float32"


def test_the_dtype_and_device_come_from_the_parameter_that_parameters_gives_first() -> None:
    # A walk that stops at the first module holding a parameter, depth first as ``parameters()`` goes: past
    # containers without one, an empty slot, a shared module, and a parameterless first child.
    from layerprof.collect.environment import first_parameter

    shared = nn.Linear(2, 2).double()
    models = [
        nn.Sequential(nn.ReLU(), nn.Sequential(nn.Sequential(), nn.Linear(2, 2).half()), nn.Linear(2, 2)),
        nn.Sequential(nn.Sequential(shared), shared, nn.Linear(2, 2)),
        nn.Sequential(nn.ReLU(), nn.Identity()),
    ]
    models[0]._modules = {"empty": None, **models[0]._modules}  # an empty slot first
    for model in models:
        assert first_parameter(model) is next(model.parameters(), None)
    assert first_parameter(models[0]).dtype == torch.float16 and first_parameter(models[1]) is shared.weight


def test_benchmark_latency_throughput_and_per_module() -> None:
    model = MLP()
    x = torch.randn(16, 8)
    result = layerprof.benchmark(model, x, iters=12, warmup=2, progress=False)
    assert len(result.samples_ms) == 12 and result.batch_size == 16 and not result.backward
    assert result.latency_ms["median"] == pytest.approx(statistics.median(result.samples_ms))
    assert result.latency_ms["min"] == min(result.samples_ms)
    assert result.throughput == pytest.approx(16 / (result.latency_ms["median"] / 1e3))
    assert "samples/s" in str(result)
    # As a notebook cell's last value, IPython shows the line print gives (it showed the dataclass's fields).
    pretty = pytest.importorskip("IPython.lib.pretty")
    assert pretty.pretty(result) == str(result) and not repr(result).startswith(str(result))
    trained = layerprof.benchmark(model, (x,), iters=4, warmup=1, backward=True, per_module=True, progress=False)
    assert trained.profile is not None and trained.profile.tree.backward_ms > 0
    assert trained.profile.tree.steps == 4
    assert trained.environment["batch_size"] == 16
    with pytest.raises(ValueError, match="iters >= 1"):
        layerprof.benchmark(model, x, iters=0)


def test_one_step_profile_writes_what_the_general_statistics_write() -> None:
    # A one-step profile skips the running sums; its records must equal those the general path writes for the
    # same step (folded into the sums by hand here), on a model with a shared module and a sibling call.
    from layerprof.collect.statistics import StepStats
    from layerprof.record.records import build_tree
    from .models import SharedLoop

    model = SharedLoop()
    with LayerProf(model) as prof:
        model(torch.randn(2, 8)).sum().backward()
    stats = prof._stats
    assert stats._later is not None  # the profile was not read: the step's times are still to be made
    step = stats._first_step()
    assert stats.steps == 1 and step is not None and stats._later is None
    _, fast, _ = build_tree(model)
    stats.fill(fast)
    general = StepStats()
    general.steps = 0
    general._add(step)
    _, slow, _ = build_tree(model)
    general.fill(slow)
    for name in fast:
        mine, theirs = dict(vars(fast[name])), dict(vars(slow[name]))
        for row in (mine, theirs):
            row.pop("_NodeMixin__children", None)
            row.pop("_NodeMixin__parent", None)
        assert mine == theirs, name
    assert any(record.backward_ms for record in fast.values())


def test_a_step_ended_between_forward_and_backward_is_warned_of() -> None:
    """``prof.step()`` between a forward and its backward closes the step before its backward runs: the backward
    is not timed (no module has backward time), and the block says so, naming the modules, instead of silently
    losing it. The right order, and a graph kept across steps (truncated BPTT with retain_graph), warn of nothing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with pytest.warns(RuntimeWarning) as caught:
        with LayerProf(model) as prof:
            for _ in range(3):
                out = model(x)
                prof.step()
                out.sum().backward()
    assert [str(w.message) for w in caught] == [
        "layerprof: the backward of 3 module(s) ('2', '1', '0') began after prof.step() had ended the step of their "
        "forward, so their backward time is not in the profile. Call prof.step() after loss.backward() (and the "
        "optimizer step), not between a forward and its backward."
    ]
    assert all(record.backward_ms is None for record in prof.records.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with LayerProf(model) as prof:
            for _ in range(3):
                model(x).sum().backward()
                prof.step()
        assert all(record.backward_ms > 0 for name, record in prof.records.items() if name in ("0", "2"))
        cell, state = nn.Linear(4, 4), torch.zeros(3, 4)
        with LayerProf(cell) as prof:
            for _ in range(3):  # each backward runs through the earlier steps' graphs again
                state = torch.tanh(cell(state) + x)
                state.sum().backward(retain_graph=True)
                prof.step()
        assert prof.tree.backward_ms > 0


def test_a_module_replaced_each_step_is_let_go_and_its_successor_timed() -> None:
    # A new head per task, put in place each step inside one block: every replaced head stayed alive with its
    # parameters for the whole block and while the profiler was held (999 heads, RSS +132 MiB), and a schedule's
    # attach hooked every dead one again (its steps twice as slow by the end).
    import weakref

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
    x = torch.randn(4, 16)
    replaced = []
    for schedule in (None, layerprof.schedule(wait=1, active=1)):
        with LayerProf(model, schedule=schedule) as prof:
            for _ in range(20):
                replaced.append(weakref.ref(model[2]))
                model[2] = nn.Linear(32, 32)
                model(x).sum().backward()
                prof.step()
        assert sum(ref() is not None for ref in replaced) == 0  # (no head but the model's own is kept)
        assert len(prof._entries) == 4 and prof.records["2"].calls == 1 and prof.records["2"].backward_ms > 0
        assert prof.records["2"].steps == (20 if schedule is None else 10)
