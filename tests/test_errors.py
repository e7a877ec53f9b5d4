"""Misuse of the Python API: every wrong argument, lifecycle mistake and unprofilable child gets a clear, early
error naming what was wrong and what to do; the model is left as it was; notes on exceptions name the right
module; files are written whole or not at all."""
from __future__ import annotations

import gc
import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state
from .measured import Sleeper


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2)))


def profiled(model: nn.Module | None = None) -> LayerProf:
    model = model or mlp()
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    return prof


# -- arguments -------------------------------------------------------------------------------------------------
CONSTRUCTOR = [
    (dict(warmup="2"), TypeError, "warmup must be an int >= 0, got '2' (str)"),
    (dict(warmup=1.5), TypeError, "warmup must be an int >= 0, got 1.5 (float)"),
    (dict(warmup=True), TypeError, "warmup must be an int >= 0, got True (bool)"),
    (dict(warmup=-1), ValueError, "warmup must be >= 0, got -1"),
    (dict(max_samples=0), ValueError, "max_samples must be >= 1, got 0"),
    (dict(max_samples="many"), TypeError, "max_samples must be an int >= 1, got 'many' (str)"),
    (dict(sync="yes"), TypeError, "sync must be True or False, got 'yes' (str)"),
    (dict(sync=None), TypeError, "sync must be True or False, got None (NoneType)"),
    (dict(annotate="no"), TypeError, "annotate must be True or False, got 'no' (str)"),  # "no" turned it on
    (dict(peaks={"flops": 1e12, "bandwidth": 1e11, "source": 5}), TypeError,
     "peaks['source'] says where the figures come from, a string such as 'datasheet'; got 5"),
    (dict(peaks={"flops": "1e12", "bandwidth": 1e11}), TypeError,  # (a string was a ValueError)
     "peaks['flops'] must be a positive finite number, got '1e12' (str)"),
    (dict(peaks={"flops": 1e12, "bandwidth": -1}), ValueError,
     "peaks['bandwidth'] must be a positive finite number, got -1"),
    (dict(metrics="flops,params"), TypeError,
     "metrics must be a sequence of names, not a string: write metrics=('flops', 'params')"),
    (dict(metrics="flops"), TypeError, "metrics must be a sequence of names, not a string: write metrics=('flops',)"),
    (dict(metrics=[1]), TypeError, "metrics must hold names (strings) such as ('flops', 'memory'), got 1 (int)"),
    (dict(metrics=3), TypeError, "metrics must be a sequence of names such as ('flops', 'memory'), got 3 (int)"),
    (dict(metrics=("nope",)), ValueError, "unknown metric 'nope'; choose from: "),
    (dict(schedule=3), TypeError, "schedule must be a layerprof.schedule(wait=, warmup=, active=, repeat=), got 3"),
    (dict(schedule=lambda step: None), TypeError, "schedule must be a layerprof.schedule("),
]


# Ids without addresses (a lambda's repr holds one), the same in every process: pytest-xdist's workers compare them.
@pytest.mark.parametrize("kwargs, error, message", CONSTRUCTOR,
                         ids=[re.sub(r" at 0x[0-9a-f]+", "", str(case[0])) for case in CONSTRUCTOR])
def test_constructor_arguments(kwargs: dict[str, Any], error: type, message: str) -> None:
    model = mlp()
    before = hook_state(model)
    with pytest.raises(error) as info:
        LayerProf(model, **kwargs)
    assert str(info.value).startswith(message), info.value
    assert hook_state(model) == before and not _PROFILED


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(wait="1"), TypeError, "schedule wait must be an int >= 0, got '1' (str)"),
    (dict(active=0), ValueError, "schedule active must be >= 1, got 0"),
    (dict(active=1.0), TypeError, "schedule active must be an int >= 1, got 1.0 (float)"),
    (dict(repeat=-1), ValueError, "schedule repeat must be >= 0, got -1"),
    (dict(skip_first=False), TypeError, "schedule skip_first must be an int >= 0, got False (bool)"),
])
def test_schedule_arguments(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        layerprof.schedule(**kwargs)


METHODS: list[tuple[Callable[[Any], Any], type, str]] = [
    (lambda p: p.layerwise_summary(depth="2"), TypeError, "depth must be an int >= 0 or None, got '2' (str)"),
    (lambda p: p.layerwise_summary(depth=-1), ValueError, "depth must be >= 0 or None, got -1"),
    (lambda p: p.render_tree(maxdepth=1.0), TypeError, "maxdepth must be an int >= 0 or None, got 1.0 (float)"),
    (lambda p: p.rows(depth="1"), TypeError, "depth must be an int >= 0 or None, got '1' (str)"),
    (lambda p: p.rows(max_depth=-1), ValueError, "max_depth must be >= 0 or None, got -1"),
    (lambda p: p.select(depth=True), TypeError, "depth must be an int >= 0 or None, got True (bool)"),
    (lambda p: p.rows(leaves="yes"), TypeError, "leaves must be True or False, got 'yes' (str)"),
    (lambda p: p.rows(name=3), TypeError, "name must be a glob on qualified names such as 'layer1.*', got 3"),
    (lambda p: p.rows(type=nn.Linear), TypeError, "type= takes class names, e.g. type='Linear', not the class Linear"),
    (lambda p: p.rows(type=[nn.Linear]), TypeError, "type must hold names (strings) such as ('Linear', 'Conv2d')"),
    (lambda p: p.rows(deth=1), TypeError,
     "unknown filter 'deth'; filters are: depth, max_depth, type, name, leaves, called"),
    (lambda p: p.to_csv(None, None, maxdepth=1), TypeError, "unknown filter 'maxdepth'"),
    (lambda p: p.top(k="3"), TypeError, "k must be an int >= 0, got '3' (str)"),
    (lambda p: p.top(-1), ValueError, "k must be >= 0, got -1"),
    (lambda p: p.top(2, depth="1"), TypeError, "depth must be an int >= 0 or None, got '1' (str)"),
]


@pytest.mark.parametrize("call, error, message", METHODS, ids=[case[2][:40] for case in METHODS])
def test_method_arguments(call: Callable[[Any], Any], error: type, message: str) -> None:
    prof = profiled()
    for target in (prof, prof.profile):
        with pytest.raises(error) as info:
            call(target)
        assert str(info.value).startswith(message), info.value


def test_filters_that_are_right_still_work() -> None:
    prof = profiled()
    assert [r["name"] for r in prof.rows(depth=1)] == ["0", "1", "2"]
    assert [r["name"] for r in prof.rows(type=("Linear",), max_depth=1)] == ["0"]
    assert [r["name"] for r in prof.rows(type="Linear", leaves=True, called=True)] == ["0", "2.0"]
    import numpy as np

    assert len(prof.rows(depth=np.int64(1))) == 3 and len(prof.top(np.int64(2))) == 2


# -- lifecycle ---------------------------------------------------------------------------------------------------
def test_stop_inside_the_block_is_refused_and_the_block_still_ends_cleanly() -> None:
    model = mlp()
    before = hook_state(model)
    with pytest.raises(RuntimeError) as info:
        with LayerProf(model) as prof:
            model(torch.randn(2, 4)).sum().backward()
            prof.stop()
    assert str(info.value) == (
        "prof.stop() was called inside `with LayerProf(model) as prof:`; the block stops profiling when it exits: "
        "remove the stop() call, or use prof.start() ... prof.stop() without `with`"
    )
    assert hook_state(model) == before and not _PROFILED
    with pytest.raises(RuntimeError, match=r"^no profile: the block raised RuntimeError before profiling finished"):
        prof.profile  # noqa: B018


def test_results_after_a_failed_block_say_the_block_raised() -> None:
    model = mlp()
    before = hook_state(model)
    with pytest.raises(ZeroDivisionError):
        with LayerProf(model) as prof:
            model(torch.randn(2, 4))
            1 / 0  # noqa: B018
    message = ("no profile: the block raised ZeroDivisionError before profiling finished, so nothing was recorded. "
               "Fix the error and profile again with a new LayerProf(model)")
    # (records and tree read as {} and None before)
    for read in (lambda: prof.profile, prof.layerwise_summary, lambda: prof.meta, prof.to_dict,
                 lambda: prof.records, lambda: prof.tree):
        with pytest.raises(RuntimeError) as info:
            read()
        assert str(info.value) == message
    assert repr(prof) == "<LayerProf Sequential (failed)>"
    with pytest.raises(RuntimeError, match=r"^prof.stop\(\) needs a running profile, and this one has stopped "
                                           r"\(the block raised ZeroDivisionError\)$"):
        prof.stop()
    assert hook_state(model) == before and not _PROFILED


def test_results_while_running_and_before_start() -> None:
    model = mlp()
    prof = LayerProf(model)
    with pytest.raises(RuntimeError, match=r"^the profile is not ready: profiling has not started\. It is ready after"):
        prof.profile  # noqa: B018
    with pytest.raises(RuntimeError, match=r"^prof.stop\(\) needs a running profile, and this one was never started: "
                                           r"call prof.start\(\) first$"):
        prof.stop()
    with prof:
        with pytest.raises(RuntimeError, match=r"^the profile is not ready: profiling is still running\. It is ready "
                                               r"after the `with LayerProf\(model\) as prof:` block has exited \(or "
                                               r"after prof.stop\(\)\)$"):
            prof.layerwise_summary()
        model(torch.randn(2, 4))


def test_reentry() -> None:
    model = mlp()
    before = hook_state(model)
    prof = LayerProf(model)
    with pytest.raises(RuntimeError, match=r"^this LayerProf is already running: it was started"):
        with prof:
            with prof:
                pass
    assert hook_state(model) == before and not _PROFILED
    with pytest.raises(RuntimeError, match=r"^this LayerProf was already used; create a new LayerProf\(model\)"):
        with prof:
            pass
    prof = LayerProf(model).start()
    with pytest.raises(RuntimeError, match="already running"):
        prof.start()
    model(torch.randn(2, 4))
    prof.stop()
    with pytest.raises(RuntimeError, match=r"needs a running profile, and this one has already stopped$"):
        prof.__exit__(None, None, None)
    assert prof.tree.calls == 1 and hook_state(model) == before and not _PROFILED


# -- children that cannot be profiled ---------------------------------------------------------------------------
def test_torchscript_child_is_named() -> None:
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
        model[2] = torch.jit.script(model[2])
    before = hook_state(model)
    with pytest.raises(TypeError, match=r"^LayerProf cannot profile module '2' \(RecursiveScriptModule\): it is "
                                        r"TorchScript, whose submodules' hooks never run\. Profile with the eager "
                                        r"module in its place"):
        LayerProf(model)
    assert hook_state(model) == before and not _PROFILED


def test_compiled_child_is_named() -> None:
    model = mlp()
    model[2] = torch.compile(model[2])
    with pytest.raises(TypeError) as info:
        LayerProf(model)
    assert str(info.value) == (
        "LayerProf cannot see inside module '2': it is torch.compile'd, and compiled graphs skip module hooks, so its "
        "modules would show as not run. Profile with the eager module in its place (the compiled module's "
        "._orig_mod), and compile after profiling."
    )
    model[2] = model[2]._orig_mod  # the advice works
    assert profiled(model).records["2.0"].calls == 1


# -- notes on exceptions ----------------------------------------------------------------------------------------
class Fails(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad forward")


class _FailsBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("bad backward")


class FailsBackward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FailsBackward.apply(x)


def notes(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


def test_note_names_the_innermost_module() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(Fails()))
    before = hook_state(model)
    with pytest.raises(ValueError) as info:
        with LayerProf(model):
            model(torch.randn(2, 4))
    assert notes(info.value) == ["layerprof: raised inside module '1.0' (Fails)"]
    assert hook_state(model) == before


def test_note_on_the_root_names_the_model_class() -> None:
    model = Fails()
    with pytest.raises(ValueError) as info:
        with LayerProf(model):
            model(torch.randn(2, 4))
    assert notes(info.value) == ["layerprof: raised inside the model (Fails)"]


def test_a_caught_error_never_notes_a_later_unrelated_one() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Fails())
    for _ in range(20):  # the old id()-based check attached the stale note 20 times out of 20
        with pytest.raises(KeyError) as info:
            with LayerProf(model):
                with pytest.raises(ValueError) as caught:
                    model(torch.randn(2, 4))
                assert notes(caught.value) == ["layerprof: raised inside module '1' (Fails)"]
                del caught
                gc.collect()
                raise KeyError("unrelated")
        assert notes(info.value) == []


STORED = ImportError("fused kernel not available")  # a library's stored error, raised at each try of a fast path


class Fast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise STORED


class FastOrSlow(nn.Module):
    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.fast, self.slow, self.strict = Fast(), nn.Linear(4, 4), strict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.fast(x)
        except ImportError:
            if self.strict:
                raise
            return self.slow(x)


def test_an_exception_raised_again_is_noted_where_it_is_raised_then() -> None:
    # One exception object raised twice: caught inside '0', then raised from '1.fast' and out of the block. Its
    # first note ('0.fast') stayed, naming a module that had returned; and a later block on another model kept it.
    model = nn.Sequential(FastOrSlow(strict=False), FastOrSlow(strict=True))
    with pytest.raises(ImportError) as info:
        with LayerProf(model):
            model(torch.randn(2, 4))
    assert notes(info.value) == ["layerprof: raised inside module '1.fast' (Fast)"]
    other = nn.Sequential(nn.Linear(4, 4), FastOrSlow(strict=True))
    with pytest.raises(ImportError) as info:
        with LayerProf(other):
            other(torch.randn(2, 4))
    assert notes(info.value) == ["layerprof: raised inside module '1.fast' (Fast)"]
    STORED.__notes__.clear()


class Fallback(nn.Module):
    """Tries a fast module (RuntimeError), then a slow one that raises and handles a ValueError of its own, then
    raises the fast path's error again."""

    def __init__(self) -> None:
        super().__init__()
        self.fast, self.slow = Raising(RuntimeError), Raising(ValueError)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.fast(x)
        except RuntimeError as first:
            try:
                return self.slow(x)
            except ValueError:
                pass
            raise first


class Raising(nn.Module):
    def __init__(self, kind: type) -> None:
        super().__init__()
        self.fc, self.kind = nn.Linear(4, 4), kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.kind("raised")


class OnThreads(nn.Module):
    """Runs its branches on a thread pool: ``future.result()`` raises the worker's exception in the caller."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList([nn.Linear(4, 4), nn.Sequential(nn.Linear(3, 4))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(branch, x) for branch in self.branches]
            return sum(future.result() for future in futures)


@pytest.mark.parametrize("model, innermost", [(Fallback(), "fast' (Raising)"), (OnThreads(), "branches.1.0' (Linear)")],
                         ids=["another exception between", "raised on a worker thread"])
def test_the_note_keeps_the_innermost_module_whatever_ran_between(model: nn.Module, innermost: str) -> None:
    # The note named the innermost module; the first cut of the stale-note fix (the last exception noted on the
    # thread) renamed it after the model where another exception left a module in between, or where the exception
    # came back from a worker thread.
    with pytest.raises(RuntimeError) as info:
        with LayerProf(model):
            model(torch.randn(2, 4))
    assert notes(info.value) == [f"layerprof: raised inside module '{innermost}"]


class Lookup:
    """A result whose ``__getattr__`` raises KeyError (not AttributeError) for a name it does not hold."""

    __slots__ = ("_data",)

    def __init__(self, **data: torch.Tensor) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name: str) -> torch.Tensor:
        return self._data[name]


def test_an_output_whose_attribute_code_raises_does_not_fail_the_forward() -> None:
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> Lookup:
            return Lookup(logits=self.fc(x) * 1)

    model = nn.Sequential(Head())
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).logits.sum().backward()
    assert prof.records["0"].backward_ms > 0


class Boom(Exception):
    """A Python subclass, so that it takes weak references (built-in exceptions do not)."""


class FailsWithBoom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise Boom("boom")


def test_the_note_does_not_keep_the_exception_alive() -> None:
    import weakref

    model = nn.Sequential(nn.Linear(4, 4), FailsWithBoom())
    with LayerProf(model):
        try:
            model(torch.randn(2, 4))
        except Boom as error:
            assert notes(error) == ["layerprof: raised inside module '1' (FailsWithBoom)"]
            ref = weakref.ref(error)
        gc.collect()
        assert ref() is None
        model[1] = nn.Identity()
        model(torch.randn(2, 4))


def test_an_error_in_backward_names_the_module_whose_backward_ran() -> None:
    model = nn.Sequential(nn.Linear(4, 4), FailsBackward(), nn.Linear(4, 4))
    before = hook_state(model)
    with pytest.raises(RuntimeError, match="bad backward") as info:
        with LayerProf(model):
            model(torch.randn(2, 4)).sum().backward()
    assert notes(info.value) == ["layerprof: raised inside module '1' (FailsBackward), during its backward"]
    assert hook_state(model) == before and not _PROFILED


def test_stop_notes_the_error_it_is_handed_and_still_makes_the_partial_profile() -> None:
    # start() ... stop(): no block sees the exception, so the loop hands it to stop(), which notes it as a block
    # would (read before the hooks come off) and makes the profile of the steps before it.
    model = nn.Sequential(nn.Linear(4, 4), FailsBackward(), nn.Linear(4, 4))
    healthy = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    before = hook_state(model)
    prof = LayerProf(model).start()
    prof_ok = LayerProf(healthy).start()
    healthy(torch.randn(2, 4)).sum().backward()
    prof_ok.step()
    try:
        model(torch.randn(2, 4)).sum().backward()
    except RuntimeError as error:
        prof.stop(partial="the backward raised", error=error)
        caught = error
    assert notes(caught) == ["layerprof: raised inside module '1' (FailsBackward), during its backward"]
    with pytest.raises(RuntimeError, match="no profile: the backward raised before profiling finished"):
        prof.profile  # (its only step was the one that raised: dropped)
    with pytest.raises(TypeError, match=r"prof.stop\(error=...\) takes the exception that ended the run, got str"):
        prof_ok.stop(partial="x", error="boom")  # type: ignore[arg-type]
    assert prof_ok.running  # (refused before anything changed)
    unrelated = ValueError("not from a backward pass")
    prof_ok.stop(partial="stopped early", error=unrelated)
    assert notes(unrelated) == [] and prof_ok.profile.meta["partial"] == "stopped early"
    assert prof_ok.profile.meta["steps"] == 1 and not _PROFILED
    assert hook_state(model) == before


def test_an_error_in_a_user_backward_hook_is_noted() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    handle = model[1].register_full_backward_hook(lambda module, grad_in, grad_out: 1 / 0)
    with pytest.raises(ZeroDivisionError) as info:
        with LayerProf(model):
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    handle.remove()
    assert notes(info.value) == ["layerprof: raised inside module '1' (ReLU), during its backward"]


def test_no_backward_note_after_a_backward_that_completed_or_was_caught() -> None:
    model = nn.Sequential(nn.Linear(4, 4), FailsBackward())
    with pytest.raises(KeyError) as info:
        with LayerProf(model):
            with pytest.raises(RuntimeError, match="bad backward"):
                model(torch.randn(2, 4)).sum().backward()
            raise KeyError("unrelated")
    assert notes(info.value) == []
    healthy = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad") as info:
        with LayerProf(healthy):
            healthy(torch.randn(2, 4)).sum().backward()
            torch.ones(2).sum().backward()  # a backward outside the model, after the model's completed
    assert notes(info.value) == []


# -- how the user's own hooks are timed (documented in the README) -------------------------------------------------
# Each sleep is measured (tests/measured.py): a sleep outside a module but inside its parent shows as
# child + slept <= parent, whatever the load; a bound on the child's own time (under the sleep) is one a preemption
# of a 4x4 Linear can reach.
TOLERANCE_MS = 1e-3  # the clock's nanoseconds, rounded


def test_user_forward_hooks_count_in_the_parent_not_the_module() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    pre, post = Sleeper(0.03), Sleeper(0.03)
    model[0].register_forward_pre_hook(pre)
    model[0].register_forward_hook(post)
    with LayerProf(model) as prof:
        model(torch.randn(2, 4))
    slept = pre.slept_ms[0] + post.slept_ms[0]
    # its own hooks are outside its time, and inside its parent's
    assert prof.records["0"].forward_ms + slept <= prof.tree.forward_ms + TOLERANCE_MS
    assert prof.tree.forward_ms >= 60


@pytest.mark.parametrize("which", ["pre", "post", "both"])
def test_user_hooks_registered_inside_the_block(which: str) -> None:
    # Registered after the block started: at the module's next call layerprof's own hooks go on around its forward
    # (ours after their pre-hooks, before their hooks), so their time is outside the module's, as for hooks
    # registered before the block, and inside its parent's.
    model = nn.Sequential(nn.Linear(4, 4))
    pre, post = Sleeper(0.03), Sleeper(0.03)
    with LayerProf(model) as prof:
        if which != "post":
            model[0].register_forward_pre_hook(pre)
        if which != "pre":
            model[0].register_forward_hook(post)
        model(torch.randn(2, 4))
        model(torch.randn(2, 4))
    slept = sum(pre.slept_ms) + sum(post.slept_ms)
    assert slept >= 2 * 30 * (2 if which == "both" else 1)  # (each hook ran at both calls)
    assert prof.records["0"].calls == 2 and prof.tree.calls == 2
    assert prof.records["0"].forward_ms + slept <= prof.tree.forward_ms + TOLERANCE_MS


def test_user_full_backward_hook_counts_in_the_module_backward() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    hook = Sleeper(0.03)
    model[1].register_full_backward_hook(hook)
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    first, second = prof.records["0"].backward_ms, prof.records["1"].backward_ms
    assert second >= hook.slept_ms[0]
    # The layers' backward intervals are disjoint, inside the model's: the sleep is in "1" only.
    assert first + second <= prof.tree.backward_ms + TOLERANCE_MS


# -- cosmetics -----------------------------------------------------------------------------------------------------
def test_lazy_module_shows_what_it_materialised_as() -> None:
    model = nn.Sequential(nn.LazyLinear(3))
    prof = profiled(model)
    assert prof.records["0"].type == "Linear"
    assert "(0): Linear【" in prof.layerwise_summary()
    assert prof.layerwise_summary().endswith("(in_features=4, out_features=3, bias=True)\n)")


def test_alias_lines_keep_index_order() -> None:
    shared = nn.Linear(2, 2)
    model = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared, nn.ReLU()))
    with LayerProf(model) as prof:
        model(torch.randn(2, 2))
    lines = prof.layerwise_summary().split("\n")
    inner = [line.strip()[:3] for line in lines[lines.index(next(l for l in lines if l.startswith("  (1)"))) + 1:]][:2]
    assert inner == ["(0)", "(1)"]
    assert "(0): Linear【same module as '0.0', counted there】()" in prof.layerwise_summary()


# -- files: whole or not at all -----------------------------------------------------------------------------------
def test_exports_write_whole_files_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = profiled()
    path = tmp_path / "p.json"
    prof.to_json(path)
    original = path.read_text()
    assert layerprof.load(path).to_json() == original

    def broken_write(self: Path, text: str, encoding: str | None = None) -> int:
        Path.write_bytes(self, text[:10].encode())
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", broken_write)
    with pytest.raises(OSError, match="No space left"):
        prof.to_csv(path)
    with pytest.raises(OSError, match="No space left"):
        prof.to_csv(tmp_path / "new.csv")
    monkeypatch.undo()
    assert path.read_text() == original  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]  # no partial file, no temporary left
    with pytest.raises(IsADirectoryError, match="is a folder; give the path of a file in it"):
        prof.to_markdown(tmp_path)
    # A folder that does not exist, or a file where the folder should be: the error names the path given and the
    # folder, not the hidden temporary file the writer starts with
    missing = tmp_path / "no" / "x.csv"
    with pytest.raises(FileNotFoundError, match=f"^cannot write '{missing}': '{missing.parent}' does not exist"):
        prof.to_csv(missing)
    with pytest.raises(NotADirectoryError, match=f"^cannot write '{path / 'x.png'}': '{path}' is not a folder"):
        prof.plot("top", path=str(path / "x.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_a_plot_is_saved_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    prof = profiled()

    def broken_savefig(self: Any, path: Any, **kwargs: Any) -> None:
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="No space left"):
        prof.plot("top", path=str(tmp_path / "p.png"))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    prof.plot("top", path=str(tmp_path / "p.png"))
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")


def test_warnings_point_at_the_users_line() -> None:
    # However deep inside layerprof a warning is raised (exit, step end), it names the user's `with` line.
    net = nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning, match="recorded no step") as caught:
        with LayerProf(net):
            pass
    with pytest.warns(RuntimeWarning, match="only one step was profiled") as distorted:
        with LayerProf(net, metrics=("memory",)):
            net(torch.randn(1, 2)).sum().backward()
    assert {w.filename for w in (*caught, *distorted)} == {__file__}


def test_a_layerprof_says_to_pickle_its_profile(tmp_path: Path) -> None:
    # Before: pickle and torch.save failed with "cannot pickle 'weakref.ReferenceType' object", and a deep copy
    # copied the model with it. The profile pickles, and reads back the same.
    import copy
    import pickle

    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with LayerProf(net) as prof:
        net(torch.randn(4, 8)).sum().backward()
    for attempt in (pickle.dumps, copy.deepcopy, lambda p: torch.save(p, tmp_path / "prof.pt")):
        with pytest.raises(TypeError, match=r"a LayerProf cannot be pickled or copied .* prof\.profile after"):
            attempt(prof)
    again = pickle.loads(pickle.dumps(prof.profile))
    assert again.layerwise_summary() == prof.layerwise_summary()
    assert net(torch.ones(1, 8)).shape == (1, 8) and not net[0]._forward_hooks  # the model as it was
