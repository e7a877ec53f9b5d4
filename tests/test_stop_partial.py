"""Ending a profile early: stop(partial=...) keeps the steps completed, cancel() keeps nothing, and a profiler left
running is named (where it started) and reachable (LayerProf.running_on) by the next one."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.collect.profiler import _PROFILED

from .conftest import hook_state


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _train_step(net: nn.Module) -> None:
    net(torch.randn(2, 4)).sum().backward()


def test_stop_partial_drops_the_step_under_way() -> None:
    net = _net()
    before = hook_state(net)
    prof = LayerProf(net, metrics=("params", "memory"))
    prof.start()
    for _ in range(3):
        _train_step(net)
        prof.step()
    net(torch.randn(2, 4))  # a fourth step that never gets its backward: the run failed here
    net(torch.randn(2, 4))
    prof.stop(partial="ValueError in step 4")
    assert hook_state(net) == before and not _PROFILED
    # 3 steps completed; the memory meter counted in the first (slowing it), which leaves 2 for the timings.
    assert prof.meta["steps"] == 2 and prof.meta["partial"] == "ValueError in step 4"
    assert prof.tree.calls == 1 and prof.tree.backward_ms > 0  # the dropped step's two forwards are not counted
    assert prof.layerwise_summary().splitlines()[0] == "Partial profile (2 steps recorded): ValueError in step 4."
    assert prof.layerwise_summary().splitlines()[1].startswith("Step: forward ")


def test_stop_partial_with_no_step_completed_has_no_profile() -> None:
    net = _net()
    prof = LayerProf(net)
    prof.start()
    net(torch.randn(2, 4))
    prof.stop(partial="interrupted")
    assert not _PROFILED and not prof.running
    with pytest.raises(RuntimeError, match="no profile: interrupted"):
        prof.profile


def test_cancel_takes_everything_off_and_keeps_nothing() -> None:
    net = _net()
    before = hook_state(net)
    prof = LayerProf(net)
    prof.start()
    _train_step(net)
    prof.cancel()
    prof.cancel()  # a no-op once stopped
    assert hook_state(net) == before and not _PROFILED
    with pytest.raises(RuntimeError, match="it was cancelled"):
        prof.profile
    with LayerProf(net) as inside:  # inside `with`, the block then exits without a profile and without an error
        inside.cancel()
    assert not inside.running and not _PROFILED


def test_a_profiler_left_running_is_named_and_can_be_freed() -> None:
    net = _net()
    lost = LayerProf(net)
    lost.start()  # a notebook cell that raised before its stop(): the variable is then rebound
    line = test_a_profiler_left_running_is_named_and_can_be_freed.__code__.co_firstlineno + 3
    with pytest.raises(RuntimeError) as raised:
        LayerProf(net).start()
    message = str(raised.value)
    assert "already being profiled by another active LayerProf" in message
    assert f"(started at {__file__}:{line})" in message
    assert "prof.cancel()" in message and "LayerProf.running_on(model).cancel()" in message
    assert LayerProf.running_on(net) is lost and LayerProf.running_on(net[2]) is lost
    LayerProf.running_on(net).cancel()
    assert LayerProf.running_on(net) is None
    with LayerProf(net) as prof:
        _train_step(net)
    assert prof.tree.calls == 1


def test_a_profiler_left_running_in_a_notebook_cell_is_named_by_its_cell() -> None:
    interactiveshell = pytest.importorskip("IPython.core.interactiveshell")
    shell = interactiveshell.InteractiveShell.instance()
    try:
        shell.user_ns.update(LayerProf=LayerProf, net=_net())
        started = shell.run_cell("lost = LayerProf(net)\nlost.start()", store_history=True)
        assert started.success
        # the cell run again: named as IPython's tracebacks name it, not by the cell's temporary file
        message = str(shell.run_cell("LayerProf(net).start()", store_history=True).error_in_exec)
        assert f"(started at cell In[{started.execution_count}], line 2)" in message, message
        assert "ipykernel" not in message and ".py:" not in message
        shell.run_cell("LayerProf.running_on(net).cancel()", silent=True)
    finally:
        interactiveshell.InteractiveShell.clear_instance()
    assert not _PROFILED
