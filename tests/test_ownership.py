"""Which module owns a backward node: the innermost module whose own code made it. A node a parent makes between
two children (a custom autograd Function, a functional op) is the parent's, though only the children's nodes lead
to it; a node made outside every profiled module is nobody's. The timing and the note on a backward error both
follow this ownership."""
from __future__ import annotations

import sys
import time
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from layerprof import LayerProf
import layerprof.collect.profiler as profiler_module
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state
from .models import SleepsInBackward

# 50 ms of backward in one node: far above a 4x4 Linear's backward, even on a loaded machine. A module that must not
# hold it is checked under the whole sleep (what holding it would add), not half of it: a preemption of its backward
# adds a few ms.
SLEEP_S = 0.05


class Raises(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad backward")


class Sleeps(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_S)
        return grad * 2


class Between(nn.Module):
    """a, then the parent's own Function, then b: only b's nodes lead to the Function's node."""

    def __init__(self, function: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.function = function
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.function.apply(self.a(x)))


def model_with(function: type[torch.autograd.Function]) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), Between(function), nn.Linear(4, 1))


def notes(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


def test_a_backward_error_in_the_parents_own_code_names_the_parent_not_a_sibling() -> None:
    model = model_with(Raises)
    before = hook_state(model)
    with pytest.raises(ValueError, match="bad backward") as info:
        with LayerProf(model):
            model(torch.randn(2, 4)).sum().backward()
    # b's backward ran last before the failing node, but the Function's node was made by Between's own forward
    assert notes(info.value) == ["layerprof: raised inside module '1' (Between), during its backward"]
    assert hook_state(model) == before and not _PROFILED


def test_a_backward_error_outside_every_module_blames_none() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="bad backward") as info:
        with LayerProf(model):
            model(Raises.apply(x)).sum().backward()  # the failing node is the user's, made before the model ran
    assert notes(info.value) == [
        "layerprof: raised during backward, in a part of the graph that no profiled module made (code outside the "
        "modules' calls)"
    ]


def test_the_parents_own_backward_is_timed_as_its_own_not_a_siblings() -> None:
    model = model_with(Sleeps)
    x = torch.randn(2, 4)
    expected = model(x)
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with LayerProf(model) as prof:
        out = model(x)
        out.sum().backward()
    assert torch.equal(out, expected)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected_grads))
    parent, a, b = prof.records["1"], prof.records["1.a"], prof.records["1.b"]
    # The 50 ms node is Between's own: in its self backward, in neither child (each a 4x4 Linear: microseconds).
    assert parent.self_backward_ms >= SLEEP_S * 1e3
    assert a.backward_ms < SLEEP_S * 1e3 and b.backward_ms < SLEEP_S * 1e3
    assert parent.backward_ms >= parent.self_backward_ms + a.backward_ms + b.backward_ms - 1e-6
    assert prof.records["2"].backward_ms < SLEEP_S * 1e3 and prof.records["0"].backward_ms < SLEEP_S * 1e3


def test_backward_made_outside_the_model_is_not_timed_as_a_module() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(2, 4, requires_grad=True)
    with LayerProf(model) as prof:
        model(Sleeps.apply(x)).sum().backward()  # 50 ms of backward after the model's, in the user's node
    # The first layer's backward ends when the user's node starts: before, it ran on to the end of the pass.
    assert prof.records["0"].backward_ms < SLEEP_S * 1e3
    assert prof.records[""].backward_ms < SLEEP_S * 1e3


def test_a_full_backward_pre_hook_counts_in_the_parents_own_backward() -> None:
    # torch makes the node that runs a module's backward pre-hooks just after the module's call returns: the
    # parent's code, so the parent's own backward (before: the backward of whichever module's node ran before it).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 4))
    handle = model[1].register_full_backward_pre_hook(lambda module, grad_output: time.sleep(SLEEP_S))
    with LayerProf(model) as prof:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    handle.remove()
    assert prof.records[""].self_backward_ms >= SLEEP_S * 1e3
    assert all(prof.records[name].backward_ms < SLEEP_S * 1e3 for name in ("0", "1", "1.0", "1.1", "2"))


class HooksItsOutput(nn.Module):
    """Registers a hook on its own output inside its forward (before its call returns)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) * 1.5
        y.register_hook(lambda grad: time.sleep(SLEEP_S))
        return y


class OwnCodeAroundAChild(nn.Module):
    """Its own slow node made before child ``a`` runs, joined after it: in backward ``a``'s nodes run between the
    join and the slow node, which only the join leads to, and which ``b``'s walk reaches through the join."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slow = SleepsInBackward.apply(x, SLEEP_S)
        return self.b(slow * self.a(x))


def test_own_nodes_behind_a_node_an_inner_walk_met_count_in_their_owner() -> None:
    # b's walk meets the parent's join (a product) below its range and hands it to the parent, whose walk goes on
    # from it to the slow node: hooked, so its sleep counts in the parent's own backward, not in ``a``'s (whose nodes
    # run just before it). The parent's walk comes after b's, and both after the model's call returned.
    torch.manual_seed(0)
    model = nn.Sequential(OwnCodeAroundAChild(), nn.Linear(4, 1))
    with LayerProf(model) as prof:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    slept = SLEEP_S * 1e3
    assert prof.records["0"].self_backward_ms >= slept > prof.records["0.a"].backward_ms
    assert prof.records["0.b"].backward_ms < slept


class HooksItsChildsOutput(nn.Module):
    """Hooks its first child's output in its own forward (after that child's call returned)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        h.register_hook(lambda grad: time.sleep(SLEEP_S))
        return self.second(h)


@pytest.mark.parametrize("torchscript", [False, True], ids=["no TorchScript", "TorchScript in the process"])
def test_a_hook_a_forward_puts_on_an_inner_calls_output(monkeypatch: pytest.MonkeyPatch, torchscript: bool) -> None:
    # The walks of the calls inside a model's call wait for it to return (made one after another, they cost less
    # than each made as its call returns): a hook that code inside the forward puts on an inner call's output runs
    # before layerprof's, in the backward of the module whose node ran before, ``second``. In a process that
    # compiled TorchScript the nodes of a call's outputs are hooked as it returns: the hook counts in ``first``.
    monkeypatch.setattr(profiler_module, "torchscript_compiled", lambda: torchscript)
    torch.manual_seed(0)
    model = nn.Sequential(HooksItsChildsOutput(), nn.Linear(4, 1))
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    slept = SLEEP_S * 1e3
    hooked, other = ("0.first", "0.second") if torchscript else ("0.second", "0.first")
    assert prof.records[hooked].backward_ms >= slept > prof.records[other].backward_ms
    assert prof.records["0"].backward_ms >= slept > prof.records["1"].backward_ms


class HooksOutputsLikeFsdp1(FullyShardedDataParallel):
    """A module of FSDP1's class that hooks its output inside its forward, as FSDP1 puts its pre-backward unshard
    on a unit's outputs (built as a plain module: no process group)."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        out.register_hook(lambda grad: time.sleep(SLEEP_S))
        return out


def test_fsdp1s_hooks_on_its_outputs_count_in_its_unit() -> None:
    # A model holding FSDP1 units hooks the nodes of each call's outputs as the call returns (the walks still wait
    # for the model's call): FSDP1's pre-backward hook, put on inside the unit's forward, runs after layerprof's,
    # in the unit's backward, as it did when every call was walked as it returned.
    torch.manual_seed(0)
    model = nn.Sequential(HooksOutputsLikeFsdp1(), nn.Linear(4, 1))
    with LayerProf(model) as prof:
        assert prof._tracker.early_hooks
        model(torch.randn(2, 4)).sum().backward()
    slept = SLEEP_S * 1e3
    assert prof.records["0.inner"].backward_ms >= slept > prof.records["1"].backward_ms


def test_a_reused_plan_asks_again_which_class_is_fsdp1s_once_it_is_another(monkeypatch: pytest.MonkeyPatch) -> None:
    # The answer is kept on the model's plan (the checks over its classes, as each block starts, are cache misses)
    # while FSDP1's class is the one it was asked about; another class there (another torch.distributed.fsdp
    # module: a reload, a stub), or none, is asked about again.
    model = nn.Sequential(HooksOutputsLikeFsdp1(), nn.Linear(4, 1))
    x = torch.randn(2, 4)
    for _ in range(2):  # the first block makes the plan, the second reuses it and its answer
        with LayerProf(model) as prof:
            assert prof._tracker.early_hooks
            model(x).sum().backward()
    plan = prof._plan
    assert plan._fsdp1 == (FullyShardedDataParallel, True)

    class Other(nn.Module):
        pass

    loaded = sys.modules["torch.distributed.fsdp"]
    fsdp = type(sys)("torch.distributed.fsdp")
    fsdp.FullyShardedDataParallel = Other
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", fsdp)
    with LayerProf(model) as prof:
        assert prof._plan is plan and not prof._tracker.early_hooks
        model(x).sum().backward()
    assert plan._fsdp1 == (Other, False)
    monkeypatch.delitem(sys.modules, "torch.distributed.fsdp")
    with LayerProf(model) as prof:  # (no FSDP1 loaded: no module of the model can be one)
        assert not prof._tracker.early_hooks
        model(x).sum().backward()
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", loaded)  # (not undo(): conftest's patches stay)
    with LayerProf(model) as prof:
        assert prof._plan is plan and prof._tracker.early_hooks
        model(x).sum().backward()
    assert plan._fsdp1 == (FullyShardedDataParallel, True)
    slept = SLEEP_S * 1e3
    assert prof.records["0.inner"].backward_ms >= slept > prof.records["1"].backward_ms


def _hook_output(module: nn.Module, hook: Any, on_node: bool) -> None:
    """A forward hook of the user's that hooks the module's output (its tensor, or its graph node)."""

    def forward_hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if on_node:
            output.grad_fn.register_prehook(hook)
        else:
            output.register_hook(hook)

    module.register_forward_hook(forward_hook)


def test_your_hooks_on_tensors_and_graph_nodes_change_gradients_as_before_and_count_where_they_run() -> None:
    # layerprof's hook on a graph node runs before the hooks you put on that node or on its output tensor once the
    # module's call has returned: they count in the backward of the module that made the node. A tensor hook put
    # inside the module's forward runs before layerprof's: in the module whose node ran before (the next one).
    def doubles(grad: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_S)
        return grad * 2

    def triples(grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        time.sleep(SLEEP_S)
        return (grads[0] * 3,)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), HooksItsOutput(), nn.Linear(4, 1))
    _hook_output(model[0], triples, on_node=True)
    _hook_output(model[1], doubles, on_node=False)
    x = torch.randn(2, 4)
    expected = model(x)
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    before = hook_state(model)
    with LayerProf(model) as prof:
        out = model(x)
        out.sum().backward()
    assert torch.equal(out, expected) and hook_state(model) == before
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected_grads))  # x6 on model[0]'s
    backward = {name: prof.records[name].backward_ms for name in ("0", "1", "2", "3", "4")}
    slept = SLEEP_S * 1e3
    assert backward["0"] >= slept and backward["1"] >= slept and backward["4"] >= slept, backward
    assert backward["2"] < slept and backward["3"] < slept, backward
    assert prof.records[""].backward_ms >= 3 * slept
