"""Numbers that hold in every training pattern (issue 12): in-place ops on output views, several backward
passes through one forward, modules that skip steps, recursion, modules that return nothing, CUDA-event stamps."""
from __future__ import annotations

import functools
import threading
import time
import types
from typing import Any, Callable

import pytest
import torch
from torch import nn

import layerprof.collect.clock as clock_module
import layerprof.collect.profiler as profiler_module
from layerprof import LayerProf
from layerprof.collect.clock import CudaEventClock
from layerprof._torch import torchscript_compiled
from layerprof.collect.tracker import Tracker

from .invariants import check_profile, check_truth, count_calls
from .models import SleepsInBackward


@pytest.fixture(params=["wrapper", "wrapper, torchscript", "hooks"],
                ids=["call wrapper", "call wrapper, TorchScript in the process", "hooks beside the modules' own"])
def counted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable[[nn.Module], Any]:
    """count_calls, with the modules left without hooks (timed by the call wrapper; in a process that compiled
    TorchScript, with the start nodes of the walks put off hooked as their calls return) or each given a pre-hook
    (timed by the hooks layerprof puts beside a module's own): the ways a module's calls are timed."""
    if request.param == "wrapper, torchscript":
        monkeypatch.setattr(profiler_module, "torchscript_compiled", lambda: True)
    return functools.partial(count_calls, on_modules=request.param == "hooks")


def _timed_backward(loss: torch.Tensor, **kwargs: Any) -> float:
    start = time.perf_counter()
    loss.backward(**kwargs)
    return (time.perf_counter() - start) * 1e3


# -- in-place ops on outputs that are views ----------------------------------------------------------------------
class InplaceOnViews(nn.Module):
    """A Linear on 3-D input returns a view of its addmm result; each in-place op below rewrites that view's
    history, so the node that created the output never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h.relu_()
        r = self.fc2(h)
        r += h
        s = self.fc3(r)
        s.mul_(0.5)
        flat = self.flatten(s.transpose(1, 2))
        flat.add_(1.0)
        return self.head(flat)


def test_inplace_ops_on_view_outputs_keep_every_backward(counted: Callable[[nn.Module], Any]) -> None:
    model = InplaceOnViews()
    with counted(model) as reference, LayerProf(model) as prof:
        loss = model(torch.randn(3, 4, 8)).pow(2).sum()
        wall = _timed_backward(loss)
    check_profile(prof, model)
    check_truth(prof, model, wall, reference)
    for name in ("fc1", "fc2", "fc3", "head"):
        assert prof.records[name].backward_ms > 0, name


class ReturnsNothing(nn.Module):
    """Keeps its result on ``self`` and returns None."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.result: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> None:
        self.result = self.fc(x).tanh()


class ResultOnSelf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stash = ReturnsNothing()
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stash(x)
        result, self.stash.result = self.stash.result, None
        return self.out(result.detach() * 0 + result)


def test_module_returning_none_gets_backward_from_the_nodes_it_created(counted: Callable[[nn.Module], Any]) -> None:
    model = ResultOnSelf()
    with counted(model) as reference, LayerProf(model) as prof:
        wall = _timed_backward(model(torch.randn(4, 8)).sum())
    check_truth(prof, model, wall, reference)
    stash, fc = prof.records["stash"], prof.records["stash.fc"]
    assert fc.backward_ms > 0 and stash.backward_ms >= fc.backward_ms


class Box:
    """A plain output class (no container layerprof knows: not a tuple, dict or dataclass)."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class Slotted:
    __slots__ = ("value",)

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class OpaqueOutput(nn.Module):
    """The root's own code makes a node whose backward sleeps 30 ms, and returns its result in an object layerprof
    does not open as a container, or keeps it in a dict on ``self`` and returns None."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.how = how
        self.kept: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> Any:
        out = SleepsInBackward.apply(self.fc(x), 0.03)
        if self.how == "dict on self":
            self.kept["out"] = out
            return None
        if self.how == "generator":
            return _yields(out)  # (not started: its frame holds its argument)
        if self.how == "namespace":
            return types.SimpleNamespace(value=out)
        return {"box": Box, "slots": Slotted}[self.how](out)


def _yields(value: torch.Tensor) -> Any:
    yield value


def _opaque_value(model: OpaqueOutput, output: Any) -> torch.Tensor:
    if model.how == "dict on self":
        return model.kept.pop("out")
    return next(output) if model.how == "generator" else output.value


@pytest.mark.parametrize("how", ["box", "slots", "namespace", "dict on self"])
def test_the_roots_own_backward_is_found_through_an_output_it_does_not_open(how: str) -> None:
    # The root has no parent whose walk reaches its nodes: its walk starts from its output, or from its module's
    # attributes. Through a plain output class, slots, a SimpleNamespace or a dict kept on self, it found none, and
    # the root's own backward (the 30 ms sleep here) was lost: the root read its child's 0.1 ms.
    model = OpaqueOutput(how)
    with LayerProf(model) as prof:
        wall = _timed_backward(_opaque_value(model, model(torch.randn(4, 8))).sum())
    check_truth(prof, model, wall)
    assert prof.tree.self_backward_ms >= 30.0 and prof.tree.backward_ms <= wall


def test_a_generator_the_root_returns_is_opened_through_its_frame() -> None:
    model = OpaqueOutput("generator")
    with LayerProf(model) as prof:
        wall = _timed_backward(_opaque_value(model, model(torch.randn(4, 8))).sum())
    check_truth(prof, model, wall)
    assert prof.tree.self_backward_ms >= 30.0


class NoGraphOutput(nn.Module):
    """Returns a tensor that does not carry its graph (detached), while an auxiliary loss kept on self does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.aux_loss = h.pow(2).mean()
        return h.detach()


def test_output_without_graph_and_aux_loss_on_self() -> None:
    model = NoGraphOutput()
    with LayerProf(model) as prof:
        model(torch.randn(4, 8))
        aux, model.aux_loss = model.aux_loss, None
        wall = _timed_backward(aux)
    check_truth(prof, model, wall)
    assert prof.records["fc"].backward_ms > 0 and prof.tree.backward_ms >= prof.records["fc"].backward_ms


# -- several backward passes ----------------------------------------------------------------------------------
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def test_retain_graph_passes_are_summed_never_spanned(counted: Callable[[nn.Module], Any]) -> None:
    model = _mlp()
    with counted(model) as reference, LayerProf(model) as prof:
        loss = model(torch.randn(8, 16)).sum()
        wall = _timed_backward(loss, retain_graph=True)
        time.sleep(0.030)  # user code between the passes: in no module's backward
        wall += _timed_backward(loss)
    check_truth(prof, model, wall, reference)
    assert prof.tree.backward_ms <= wall  # two tiny passes, as timed around them: not the 30 ms between them
    for name in ("0", "2"):
        # One call, two passes: its backward is the sum of two intervals.
        assert prof.records[name].backward_ms > 0


def test_gradient_penalty_double_backward_counts_nothing_twice(counted: Callable[[nn.Module], Any]) -> None:
    model = _mlp()
    x = torch.randn(8, 16, requires_grad=True)
    with counted(model) as reference, LayerProf(model) as prof:
        out = model(x)
        start = time.perf_counter()
        grad, = torch.autograd.grad(out.sum(), x, create_graph=True)
        wall = (time.perf_counter() - start) * 1e3
        wall += _timed_backward(out.pow(2).mean() + grad.pow(2).sum())
    check_profile(prof, model)
    check_truth(prof, model, wall, reference)
    children = sum(prof.records[name].backward_ms for name in ("0", "1", "2"))
    # Children's intervals lie inside the root's in each pass; sequential layers barely overlap.
    assert children <= 1.5 * prof.tree.backward_ms


# -- a backward pass inside a forward (forces as the gradient of an energy) -----------------------------------
class _SlowLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(SleepsInBackward.apply(x, 0.02))


class _Energy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.act, self.out = _SlowLinear(3, 16), nn.Tanh(), nn.Linear(16, 1)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.embed(pos))).sum()


class _Forces(nn.Module):
    """Takes the gradient of its sub-module's output inside its own forward, while it and the root are open."""

    def __init__(self, walls: list[float]) -> None:
        super().__init__()
        self.energy = _Energy()
        self.walls = walls

    def forward(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        energy = self.energy(pos)
        start = time.perf_counter()
        forces, = torch.autograd.grad(energy, pos, retain_graph=True)
        self.walls.append((time.perf_counter() - start) * 1e3)
        return energy, -forces


class _Potential(nn.Module):
    def __init__(self, walls: list[float]) -> None:
        super().__init__()
        self.forces = _Forces(walls)

    def forward(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forces(pos)


def test_a_backward_inside_a_forward_times_the_calls_that_returned_before_it(
        counted: Callable[[nn.Module], Any]) -> None:
    # A pass started inside the forward, while the root and ``forces`` are open, runs nodes of calls that have
    # returned: they must be hooked by then (each call is walked as it returns), or that pass goes untimed.
    walls: list[float] = []
    model = _Potential(walls)
    pos = torch.randn(4, 3, requires_grad=True)
    with counted(model) as reference, LayerProf(model) as prof:
        energy, forces = model(pos)
        wall = walls[0] + _timed_backward(energy)
    check_profile(prof, model)
    check_truth(prof, model, wall, reference)
    # Both passes ran the slow node of ``embed``: 20 ms each (one pass only, the step's, read 20).
    assert prof.records["forces.energy.embed"].backward_ms >= 2 * 20
    for name in ("forces.energy.act", "forces.energy.out", "forces.energy", "forces"):
        assert prof.records[name].backward_ms > 0, name


@torch.jit.script
def _scripted_forces(energy: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    grad = torch.autograd.grad([energy.sum()], [pos])[0]
    assert grad is not None
    return -grad


SLEEPS_MS = 20.0  # what ``_SlowBeforeItsChild``'s node sleeps in each pass that runs it


class _SlowBeforeItsChild(nn.Module):
    """A node of its own that sleeps in backward, made before its child runs: behind the child's output node."""

    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.inner = nn.Linear(width, 16 if width == 3 else width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(SleepsInBackward.apply(x, SLEEPS_MS / 1e3))


class _ScriptedForces(nn.Module):
    """Forces as the gradient of an energy taken by TorchScript (a force field run for a simulation): the engine
    started from C++, not through torch.autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.energy = nn.Sequential(_SlowBeforeItsChild(), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return _scripted_forces(self.energy(pos.requires_grad_(True)), pos)


def test_a_backward_that_torchscript_starts_inside_a_forward_times_the_calls_that_returned_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The step's only backward pass: the walks of the calls inside the model's call are made as it reaches the
    # output of ``energy`` (hooked as that call returned), before the nodes behind it run, so the slow node of
    # ``energy.0``'s own is hooked as its own by then, not counted in ``energy.0.inner``, whose node ran before it.
    monkeypatch.setattr(profiler_module, "torchscript_compiled", torchscript_compiled)  # (as it is: True here)
    torch.manual_seed(0)
    model = _ScriptedForces()
    with LayerProf(model) as prof:
        forces = model(torch.randn(8, 3))
    assert forces.shape == (8, 3)
    for name in ("energy", "energy.0", "energy.0.inner", "energy.1", "energy.2"):
        assert prof.records[name].backward_ms > 0, name
    assert prof.records["energy.0"].self_backward_ms >= 20 > prof.records["energy.0.inner"].backward_ms


class _GradOnAnotherThread(nn.Module):
    """A forward that hands a pass over its first block's output to another thread and waits for it, as CUDA runs a
    pass on autograd's device thread while the thread that started it waits. The block's own slow node lies
    behind its child's output node."""

    def __init__(self) -> None:
        super().__init__()
        self.a = _SlowBeforeItsChild(4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        found: list[torch.Tensor] = []
        worker = threading.Thread(target=lambda: found.append(torch.autograd.grad(h.sum(), x, retain_graph=True)[0]))
        worker.start()
        worker.join()
        return self.b(h + found[0])


@pytest.mark.parametrize("hooked_outputs", [False, True])
def test_a_pass_another_thread_runs_while_the_forward_waits(monkeypatch: pytest.MonkeyPatch,
                                                            hooked_outputs: bool) -> None:
    # Each of the two passes (the other thread's, inside the forward, then the step's) runs ``a``'s slow node of its
    # own. Where each call's output nodes are hooked as it returns (TorchScript in the process), the other thread's
    # pass reaches ``a.inner``'s output first and makes the forward thread's waiting walks from there, on its own
    # thread (as CUDA's device thread does for a pass TorchScript starts): the slow node is ``a``'s in both passes,
    # not ``a.inner``'s, whose node ran before it. Without those hooks the walks wait for the model's call, and that
    # pass runs unhooked nodes (a documented limit): the step's pass alone is timed.
    monkeypatch.setattr(profiler_module, "torchscript_compiled", lambda: hooked_outputs)
    torch.manual_seed(0)
    model = _GradOnAnotherThread()
    x = torch.randn(2, 4, requires_grad=True)
    out = model(x)
    out.sum().backward()
    expected, expected_grads = out.detach(), [x.grad.clone(), *(p.grad.clone() for p in model.parameters())]
    x.grad = None
    model.zero_grad(set_to_none=True)
    with LayerProf(model) as prof:
        assert prof._tracker.early_hooks is hooked_outputs
        out = model(x)
        out.sum().backward()
    assert torch.equal(out.detach(), expected)
    assert all(map(torch.equal, [x.grad, *(p.grad for p in model.parameters())], expected_grads))
    slept = SLEEPS_MS
    passes = 2 if hooked_outputs else 1
    assert passes * slept <= prof.records["a"].self_backward_ms < (passes + 1) * slept
    assert prof.records["a.inner"].backward_ms < slept and prof.records["b"].backward_ms < slept
    assert prof.records["a.inner"].backward_ms > 0 and prof.records["b"].backward_ms > 0
    assert prof.records[""].forward_ms >= slept  # (the forward waited for the other thread's pass)


class _ScriptableForces(nn.Module):
    def forward(self, energy: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        grad = torch.autograd.grad([energy.sum()], [pos])[0]
        assert grad is not None
        return -grad


class _ForcesByLoadedScript(nn.Module):
    """The forces taken by a TorchScript module loaded from a file (``torch.jit.load``), kept beside the model's
    modules, not among them."""

    def __init__(self, forces: Any) -> None:
        super().__init__()
        self.energy = nn.Sequential(_SlowBeforeItsChild(), nn.Tanh(), nn.Linear(16, 1))
        self._forces = [forces]

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self._forces[0](self.energy(pos.requires_grad_(True)), pos)


def test_a_backward_that_a_loaded_torchscript_module_starts_inside_a_forward_times_the_calls_before_it(
        tmp_path: Any) -> None:
    # No compiling seen (the suite's default, conftest.no_torchscript_compiled, as where the module was only
    # loaded): the call of a TorchScript module makes the walks put off first.
    path = tmp_path / "forces.pt"
    torch.jit.save(torch.jit.script(_ScriptableForces()), str(path))
    torch.manual_seed(0)
    model = _ForcesByLoadedScript(torch.jit.load(str(path)))
    with LayerProf(model) as prof:
        assert not prof._tracker.early_hooks
        forces = model(torch.randn(8, 3))
    assert forces.shape == (8, 3)
    assert prof.records["energy.0"].self_backward_ms >= 20 > prof.records["energy.0.inner"].backward_ms


# -- modules that run in some steps only ---------------------------------------------------------------------
class AuxHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1)
        self.aux = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 1))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        out = self.head(h).sum()
        if self.calls % 5 == 0:  # an auxiliary loss every fifth step
            for _ in range(20):
                out = out + self.aux(h).sum()
        self.calls += 1
        return out


def test_module_that_skips_steps_is_averaged_over_every_step(counted: Callable[[nn.Module], Any]) -> None:
    model = AuxHead()
    with counted(model) as reference, LayerProf(model) as prof:
        for _ in range(10):
            model.zero_grad(set_to_none=True)
            model(torch.randn(64, 16)).backward()
            prof.step()
    check_truth(prof, model, reference=reference)
    aux, root = prof.records["aux"], prof.tree
    assert root.steps == 10 and aux.steps_run == 2 and prof.records["body"].steps_run == 10
    assert aux.calls == 4  # 2 steps x 20 calls over 10 steps
    assert aux.forward_ms_min == 0.0 and aux.forward_ms_median == 0.0  # 8 of 10 steps did not run it
    assert aux.forward_ms <= root.forward_ms and aux.backward_ms <= root.backward_ms
    assert aux.to_dict()["steps_run"] == 2
    lines = prof.layerwise_summary().splitlines()
    assert "ran in 2 of 10 steps" in next(line for line in lines if line.strip().startswith("(aux)"))
    assert not any("ran in" in line for line in lines if line.strip().startswith("(body)"))


# -- recursion -------------------------------------------------------------------------------------------------
class Recursive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, depth: int = 3) -> torch.Tensor:
        x = torch.tanh(self.fc(x))
        return self(x, depth - 1) if depth > 1 else x


class HoldsRecursive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Recursive()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_recursion_counts_the_outermost_call_in_inclusive_time(counted: Callable[[nn.Module], Any]) -> None:
    model = HoldsRecursive()
    with counted(model) as reference, LayerProf(model) as prof:
        wall = _timed_backward(model(torch.randn(4, 8)).sum())
    check_truth(prof, model, wall, reference)
    block = prof.records["block"]
    assert block.calls == 3 and prof.records["block.fc"].calls == 3
    outer = max(block.call_times, key=lambda timing: timing.forward_ms)
    assert block.forward_ms == pytest.approx(outer.forward_ms)
    assert block.forward_ms <= prof.tree.forward_ms
    # Self time still adds every level's own time: block + fc self times fill the outermost call.
    assert block.self_forward_ms + prof.records["block.fc"].forward_ms <= block.forward_ms + 1e-6


# -- the CUDA event path, with a fake event clock on CPU ------------------------------------------------------
class FakeEvent:
    """Stands in for ``torch.cuda.Event``: recorded on a stream, read only through ``elapsed_time``, never
    comparable with another stamp."""

    __slots__ = ("ns",)
    made = 0

    def __init__(self) -> None:
        FakeEvent.made += 1
        self.ns: int | None = None

    def record(self, stream: Any) -> None:
        self.ns = time.perf_counter_ns()

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.ns is not None and end.ns is not None, "read before it was recorded"
        return (end.ns - self.ns) / 1e6


class FakeEventClock(CudaEventClock):
    """layerprof's CUDA event clock (its event pool included), with fake events and no synchronize."""

    device = "cuda:0"

    def __init__(self) -> None:
        self.settled = 0
        super().__init__(torch.device("cuda", 0), events=FakeEvent, stream=lambda: None)

    def settle(self) -> None:
        self.settled += 1


@pytest.fixture
def fake_events(monkeypatch: pytest.MonkeyPatch) -> list[FakeEventClock]:
    clocks: list[FakeEventClock] = []

    class EventTracker(Tracker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.cpu_clock = FakeEventClock()
            clocks.append(self.cpu_clock)

    monkeypatch.setattr(profiler_module, "Tracker", EventTracker)
    monkeypatch.setattr(clock_module, "_POOLS", {})  # each test's fake events from a pool of its own
    return clocks


@pytest.mark.parametrize("pattern", ["inplace", "retain_graph", "recursion"])
def test_cuda_event_path_follows_the_same_rules(fake_events: list[FakeEventClock], pattern: str,
                                               counted: Callable[[nn.Module], Any]) -> None:
    model: nn.Module
    run: Callable[[], float]
    if pattern == "inplace":
        model = InplaceOnViews()
        run = lambda: _timed_backward(model(torch.randn(3, 4, 8)).sum())  # noqa: E731
    elif pattern == "retain_graph":
        model = _mlp()

        def run() -> float:
            loss = model(torch.randn(8, 16)).sum()
            wall = _timed_backward(loss, retain_graph=True)
            time.sleep(0.020)
            return wall + _timed_backward(loss)
    else:
        model = HoldsRecursive()
        run = lambda: _timed_backward(model(torch.randn(4, 8)).sum())  # noqa: E731
    with counted(model) as reference, LayerProf(model) as prof:
        wall = run()
    assert fake_events and fake_events[0].settled == 1
    check_profile(prof, model)
    check_truth(prof, model, wall, reference)
    if pattern == "retain_graph":
        assert prof.tree.backward_ms <= wall  # two tiny passes, as timed around them: not the 20 ms between them


def test_cuda_events_come_from_a_pool_reused_step_after_step(fake_events: list[FakeEventClock]) -> None:
    model = _mlp()
    made, before = [], FakeEvent.made
    with LayerProf(model) as prof:
        for _ in range(4):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
            made.append(FakeEvent.made)
    clock = fake_events[0]
    assert clock.settled == 4  # one synchronize per step, none in a hook
    # The first step makes its events; the same steps after it record into the same ones.
    assert made[1] == made[2] == made[3] == made[0]
    assert 0 < clock.pool_size <= made[0] - before
    assert prof.tree.steps == 4 and prof.tree.forward_ms > 0 and prof.tree.backward_ms > 0


def test_a_fresh_block_records_into_the_events_an_earlier_block_read(
        fake_events: list[FakeEventClock], monkeypatch: pytest.MonkeyPatch) -> None:
    """One-shot use, a fresh ``with LayerProf`` around each step: the pool is the process's, so only the first
    block makes its step's events; each later one makes one, its clock's origin (kept, never recycled)."""
    model = _mlp()
    made = [FakeEvent.made]
    for _ in range(3):
        with LayerProf(model) as prof:
            model(torch.randn(8, 16)).sum().backward()
        made.append(FakeEvent.made)
        assert prof.tree.forward_ms > 0 and prof.tree.backward_ms > 0
        check_profile(prof, model)
    stamps = made[1] - made[0] - 1  # the first block: its origin and a new event for every stamp
    assert stamps >= 3 * 4  # four module calls (the Sequential and its three children), three stamps or more each
    assert made[2] - made[1] == made[3] - made[2] == 1, made
    assert len(clock_module._POOLS[FakeEvent]) == stamps  # each later block took one for its origin, made one
    assert [clock.settled for clock in fake_events] == [1, 1, 1]



# -- modules registered during the profiled forward ------------------------------------------------------------
class Lazy(nn.Module):
    """Creates its projection on the first call, as lazily built heads do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "proj"):
            self.proj = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
        return self.proj(self.body(x))


def test_module_registered_during_the_forward_gets_a_record_and_hooks() -> None:
    model = Lazy()
    with LayerProf(model) as prof:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    assert [name for name in prof.records] == [name for name, _ in model.named_modules()]
    check_truth(prof, model, reference=None)
    proj = prof.records["proj"]
    # Hooked from the step it appeared in: both steps, one call each.
    assert proj.calls == 1 and proj.steps_run == 2 and prof.records["proj.0"].backward_ms > 0
    assert prof.tree.params == 8 * 8 + 8 + 8 * 4 + 4  # the root's count includes the new Linear
    assert prof.records["proj.0"].params == 8 * 4 + 4


def test_module_added_without_registration_is_named_in_a_warning() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.warns(RuntimeWarning, match=r"'sneaky' \(Linear\)"):
        with LayerProf(model):
            model(torch.randn(2, 4)).sum().backward()
            model._modules["sneaky"] = nn.Linear(4, 4)


def test_a_pass_that_prunes_weight_gradients_still_ends_every_call() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    x = torch.randn(8, 16, requires_grad=True)
    with LayerProf(model) as prof:
        out = model(x).sum()
        start = time.perf_counter()
        torch.autograd.grad(out, x)  # only the input's gradient: the weights' nodes (TBackward) never run
        wall = (time.perf_counter() - start) * 1e3
    check_truth(prof, model, wall)
    # The last Linear's addmm has a same-module successor that this pass prunes; its end comes from the next node.
    for name in ("2", "1"):
        assert prof.records[name].backward_ms is not None and prof.records[name].backward_ms > 0, name


def test_many_steps_keep_no_per_step_state(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hooks stay on across steps without a schedule: what the tracker keeps per thread (calls, walked nodes, owners)
    # must start clean at every prof.step(), or a long run grows without bound.
    model = _mlp()
    with LayerProf(model) as prof:
        sizes = []
        for _ in range(30):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
            tracker = prof._tracker
            sizes.append(sum(len(state.walked) + len(state.owners) + len(state.bounds) for state in tracker._threads)
                         + len(tracker.calls))
    assert sizes == [0] * 30
    assert prof.tree.steps == 30
