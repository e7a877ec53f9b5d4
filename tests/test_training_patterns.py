"""Ordinary training patterns that break other profilers' numbers: in-place ops on view outputs, several backward
passes through one forward, recursion, modules that return nothing. Each asserts the invariants of a true
profile: every module that ran and owns a parameter that got a gradient has backward time, children never exceed
their parent, the root's backward fits in the wall time of the backward calls, exact call counts."""
from __future__ import annotations

import sys
import time
from typing import Callable

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import check_profile, count_calls, parameter_modules_have_backward
from .test_patterns import ReturnsNothing

INPLACE = {
    "relu_": lambda h, x: h.relu_(),
    "add_ (residual)": lambda h, x: h.add_(x),
    "mul_": lambda h, x: h.mul_(0.5),
}


class ViewOutputs(nn.Module):
    """A Linear on a 3-D input returns a view of its addmm result; an in-place op on it rewrites the view's
    history, so the view node made inside the Linear never runs. Flatten and transpose return views too."""

    def __init__(self, inplace: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.inplace = inplace
        self.fc = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)
        self.flatten = nn.Flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.inplace(h, x)
        h = self.fc2(h).transpose(1, 2)
        return self.flatten(h)


def _timed_backward(loss: torch.Tensor, **kwargs: bool) -> float:
    start = time.perf_counter()
    loss.backward(**kwargs)
    return (time.perf_counter() - start) * 1e3


@pytest.mark.parametrize("op", list(INPLACE))
def test_inplace_op_on_a_view_output_keeps_the_modules_backward(op: str) -> None:
    model = ViewOutputs(INPLACE[op])
    x = torch.randn(4, 8, 16, requires_grad=True)
    plain = model(x).sum()
    plain.backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    before = hook_state(model)
    with count_calls(model) as reference, LayerProf(model) as prof:
        out = model(x).sum()
        wall = _timed_backward(out)
    assert torch.equal(out, plain) and all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), plain_grads))
    assert hook_state(model) == before
    check_profile(prof, model, backward_wall_ms=wall)
    assert {name: r.calls for name, r in prof.records.items()} == {name: reference[name] for name in prof.records}
    parameter_modules_have_backward(prof, model)
    assert prof.records["fc"].backward_ms > 0  # None before: its hooked output node never ran
    assert prof.records["flatten"].backward_ms is not None


def test_two_backward_passes_through_one_forward_count_each_pass_not_the_gap() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    x = torch.randn(256, 64)
    with LayerProf(model) as prof:
        loss = model(x).sum()
        first = _timed_backward(loss, retain_graph=True)
        time.sleep(0.03)  # user code between the passes: in no module's backward
        second = _timed_backward(loss)
    check_profile(prof, model, backward_wall_ms=first + second)
    root = prof.records[""]
    # Within the two passes as timed around them: the 30 ms between them (in neither) is not spanned. (A bound of
    # 30 ms on the two passes themselves is one a preemption on a loaded machine reaches.)
    assert root.backward_ms <= first + second
    assert all(len([t for t in r.call_times]) == 1 for r in prof.records.values())
    parameter_modules_have_backward(prof, model)


def test_gradient_penalty_children_fit_in_the_parent() -> None:
    # WGAN-GP style: a gradient with create_graph=True, then a backward through the loss and the penalty.
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    x = torch.randn(128, 32, requires_grad=True)
    with LayerProf(model) as prof:
        out = model(x)
        start = time.perf_counter()
        grad, = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.sum() + grad.pow(2).sum()).backward()
        wall = (time.perf_counter() - start) * 1e3
    check_profile(prof, model, backward_wall_ms=wall)
    children = sum(r.backward_ms for r in prof.tree.children)
    assert children <= prof.tree.backward_ms + 1e-6  # was 3x the root
    parameter_modules_have_backward(prof, model)


class Recursive(nn.Module):
    """Calls itself ``depth`` levels deep, each level through its Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, depth: int = 3) -> torch.Tensor:
        x = torch.tanh(self.fc(x))
        return self(x, depth - 1) if depth > 1 else x


def test_recursion_counts_the_outermost_call_only() -> None:
    model = nn.Sequential(Recursive())
    with count_calls(model) as reference, LayerProf(model) as prof:
        model(torch.randn(64, 8)).sum().backward()
    check_profile(prof, model)
    inner = prof.records["0"]
    assert inner.calls == reference["0"] == 3 and prof.records["0.fc"].calls == 3
    # Inclusive time is the outermost call's: at most the parent's (it was 111 % of it), and equal to that call.
    outermost = inner.call_times[0]
    assert inner.forward_ms == pytest.approx(outermost.forward_ms)
    assert inner.forward_ms <= prof.tree.forward_ms and inner.backward_ms <= prof.tree.backward_ms
    # Self time adds every call's own part: the three levels' self times plus fc's make the outermost call.
    assert inner.self_forward_ms + prof.records["0.fc"].forward_ms == pytest.approx(inner.forward_ms, rel=1e-9)


class ReadsResult(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.keep = ReturnsNothing()
        self.detached = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.keep(x)
        side = self.detached(x)
        return self.keep.result.sum() + side.detach().sum() * 0  # its output does not carry its graph


def test_module_returning_none_gets_its_backward_from_the_nodes_it_created() -> None:
    model = ReadsResult()
    with LayerProf(model) as prof:
        loss = model(torch.randn(16, 8))
        wall = _timed_backward(loss)
    model.keep.result = None
    check_profile(prof, model, backward_wall_ms=wall)
    assert prof.records["keep"].backward_ms > 0 and prof.records["keep.fc"].backward_ms > 0
    assert prof.records["keep.fc"].backward_ms <= prof.records["keep"].backward_ms
    assert prof.records["detached"].backward_ms is None  # no gradient reached it: nothing ran


def test_a_copy_made_inside_the_block_runs_and_is_not_counted() -> None:
    # An EMA or teacher copy taken with deepcopy inside the block copies the hook dicts too: the copy must run
    # normally, its calls must not count as the model's, and the model must be left as it was found.
    import copy

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    before = hook_state(model)
    x = torch.randn(3, 4)
    with LayerProf(model) as prof:
        ema = copy.deepcopy(model)
        loss = model(x).sum()
        with torch.no_grad():
            teacher = ema(x)
        loss.backward()
    assert {name: record.calls for name, record in prof.records.items()} == {"": 1, "0": 1, "1": 1, "2": 1}
    assert torch.equal(teacher, model(x).detach())
    assert hook_state(model) == before
    ema(x).sum().backward()  # the copy still works after the block


def test_a_copy_made_inside_the_block_does_not_keep_the_model_alive() -> None:
    # The copy carries the profiler's hook functions (copied with the hook dicts), and so the tracker behind them:
    # the tracker must not hold the profiled modules once the block is over, or the copy pins the whole model.
    import copy
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    model_ref, weight_ref = weakref.ref(model), weakref.ref(model[0].weight)
    with LayerProf(model) as prof:
        ema = copy.deepcopy(model)
        model(torch.randn(2, 4)).sum().backward()
    del prof, model
    gc.collect()
    assert model_ref() is None and weight_ref() is None
    assert ema(torch.randn(2, 4)).shape == (2, 1)


def _reachable(root: object, kind: type) -> list[object]:
    """The objects of ``kind`` that ``root`` reaches through references (classes, Python modules and their
    namespaces not entered: they reach everything, a function's ``__globals__`` too; through them, on a GPU machine,
    an earlier test's call still held by CUDA's autograd thread was found)."""
    import gc
    import types

    namespaces = {id(vars(module)) for module in list(sys.modules.values()) if hasattr(module, "__dict__")}
    found, seen, todo = [], {id(root)}, [root]
    while todo:
        for referent in gc.get_referents(todo.pop()):
            if (id(referent) in seen or isinstance(referent, (type, types.ModuleType))
                    or id(referent) in namespaces):
                continue
            seen.add(id(referent))
            if isinstance(referent, kind):
                found.append(referent)
            todo.append(referent)
    return found


def test_a_copy_made_inside_the_block_keeps_none_of_the_profilers_per_call_state() -> None:
    # A module with a forward pre-hook of its own gets one of ours in its own hook dict (after the user's) only
    # while it is called; a deep copy made between calls carries the user's hook alone, and nothing of the profiler
    # (a copy that held a hook function of ours held the tracker behind it, and the last step's calls). The other
    # modules are timed by the call wrapper, meters or not, and their copies carry nothing either.
    import copy

    from layerprof.collect.tracker import CallTrace, Tracker

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    model[0].register_forward_pre_hook(lambda module, args: None)
    unhooked = hook_state(model[2])
    with pytest.warns(RuntimeWarning, match="only one step was profiled"):
        with LayerProf(model, metrics=("memory",)) as prof:
            ema = copy.deepcopy(model)
            model(torch.randn(2, 4)).sum().backward()
    assert prof.records["0"].calls == 1
    assert not _reachable(ema, Tracker) and _reachable(ema, CallTrace) == []
    assert len(ema[0]._forward_pre_hooks) == 1  # the user's
    assert hook_state(ema[2]) == unhooked and not _reachable(ema[2], Tracker)
    assert ema(torch.randn(2, 4)).shape == (2, 1)


def test_a_copy_registered_on_the_model_inside_the_block_counts_once_and_is_left_clean() -> None:
    # A teacher or EMA block copied from a profiled submodule carries the profiler's hooks (copied with the hook
    # dicts); registered on the model, it gets hooked as a new module: its calls must count once, and no hook may
    # be left on it after the block.
    import copy

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
        model.add_module("teacher", copy.deepcopy(model[0]))
        model.teacher(torch.randn(2, 4)).sum().backward()
    assert {name: record.calls for name, record in prof.records.items()} == {"": 1, "0": 1, "1": 1, "teacher": 1}
    assert hook_state(model)["teacher"] == hook_state(nn.Sequential(nn.Linear(4, 4)))["0"]


def test_data_parallel_replicas_count_as_their_originals() -> None:
    # nn.DataParallel runs a replica of the model on each GPU, in a thread each; a replica shares its original's
    # hook dicts (Module._replicate_for_data_parallel), so its calls are the original module's calls. Emulated on
    # CPU the way torch.nn.parallel.replicate builds replicas.
    import threading

    def replicate(module: nn.Module) -> nn.Module:
        replica = module._replicate_for_data_parallel()
        for key, param in module._parameters.items():
            setattr(replica, key, param)
        for key, child in module._modules.items():
            replica._modules[key] = replicate(child)
        return replica

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    before = hook_state(model)
    x = torch.randn(3, 4)
    with LayerProf(model) as prof:
        replicas = [replicate(model), replicate(model)]
        outputs: list[torch.Tensor] = []
        threads = [threading.Thread(target=lambda r=r: outputs.append(r(x))) for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        sum(out.sum() for out in outputs).backward()
    assert {name: record.calls for name, record in prof.records.items()} == {"": 2, "0": 2, "1": 2, "2": 2}
    for record in prof.records.values():
        assert record.forward_ms > 0 and record.backward_ms is not None and record.backward_ms > 0, record.name
    check_profile(prof, model)
    assert hook_state(model) == before


class _Sleeps(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)
        return x * 2


class _FailsFirst(nn.Module):
    """Raises on its first call after its body ran: a transient error the training loop retries."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head, self.tries = _Sleeps(), nn.Linear(4, 1), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        self.tries += 1
        if self.tries == 1:
            raise RuntimeError("transient")
        return self.head(h)


class _Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.slow = _Sleeps()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow(x)
        raise NotImplementedError("this path")


class _FallsBack(nn.Module):
    """Catches its first branch's error and takes another."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.fallback = _Unsupported(), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.first(x)
        except NotImplementedError:
            return self.fallback(x)


def test_the_calls_inside_a_forward_that_raised_are_not_calls_either() -> None:
    # A forward that raised is not a call (its time is in its parent's own): neither are the calls made inside
    # it. Kept, the retried model's body read two 5 ms calls (14.4 ms) under a root of one call (5.7 ms), and the
    # caught branch's child a call under a parent of none.
    x = torch.randn(3, 4, requires_grad=True)
    model = _FailsFirst()
    with LayerProf(model) as prof:
        for _ in range(2):
            try:
                out = model(x)
                break
            except RuntimeError:
                pass
        out.sum().backward()
    check_profile(prof, model)
    assert {name: r.calls for name, r in prof.records.items()} == {"": 1, "body": 1, "head": 1}
    assert prof.records["body"].forward_ms <= prof.records[""].forward_ms

    model = _FallsBack()
    with LayerProf(model) as prof:
        model(x).sum().backward()
    check_profile(prof, model)
    records = prof.records
    assert {name: r.calls for name, r in records.items()} == {"": 1, "first": 0, "first.slow": 0, "fallback": 1}
    assert records["first.slow"].forward_ms is None
    # The failed branch's 5 ms sleep is the root's own forward time.
    assert records[""].self_forward_ms >= 5.0


class _ProbeInWorker(torch.utils.data.Dataset):
    """Each item: how many profilers the worker holds, its dispatch modes, and whether its (profiled) teacher's
    call was taken by a profiler."""

    def __init__(self, teacher: nn.Module) -> None:
        self.teacher = teacher

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        from layerprof.collect.profiler import _PROFILED

        with torch.no_grad():
            self.teacher(torch.randn(1, 4))
        return torch.tensor([len(_PROFILED), len(_get_current_dispatch_mode_stack())])


@pytest.mark.skipif(sys.platform == "win32", reason="no fork")
def test_a_dataloader_worker_forked_in_a_block_profiles_nothing() -> None:
    # The workers fork as the loop starts, inside the block: with the profiler's copy on, a FLOP meter's dispatch
    # mode slowed every op a worker ran (5x on a dataset of small Linears) and the teacher's calls piled up there.
    net = nn.ModuleDict({"student": nn.Linear(4, 4), "teacher": nn.Linear(4, 4)})
    before = hook_state(net)
    loader = torch.utils.data.DataLoader(_ProbeInWorker(net["teacher"]), batch_size=2, num_workers=1,
                                         multiprocessing_context="fork")
    with LayerProf(net, metrics=("flops", "memory")) as prof:
        seen = []
        for batch in loader:
            net["student"](torch.randn(2, 4)).sum().backward()
            seen.append(batch)
            prof.step()
    assert torch.cat(seen).sum().item() == 0  # no profiler and no dispatch mode in the worker
    assert prof.records["student"].calls == 1 and not prof.records["teacher"].calls
    assert hook_state(net) == before
