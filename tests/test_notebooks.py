"""layerprof as a notebook user meets it: warnings that point at the user's cell, a cell interrupted inside the
``with`` block, the rich display of results. The display protocol is plain methods (``_repr_html_``,
``_repr_pretty_``) that these tests call directly; one test runs a real notebook where nbclient and ipykernel are
installed."""
from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf


def _blocks(n: int = 3) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(n)])


def _profiled_blocks() -> tuple[nn.Sequential, LayerProf]:
    """``_blocks()`` and a LayerProf of two training steps of it with the memory and shapes meters (a plan's)."""
    net = _blocks()
    with LayerProf(net, metrics=("memory", "shapes")) as prof:
        for _ in range(2):
            net(torch.randn(4, 8)).sum().backward()
            prof.step()
    return net, prof


def _caught(action) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return list(caught)


# -- warnings name the user's line, not layerprof's ------------------------------------------------------------
def test_a_warning_of_checkpoint_plan_called_on_the_layerprof_names_the_callers_line() -> None:
    # ``prof.checkpoint_plan`` on a LayerProf goes through a forwarding wrapper: the plan's warnings pointed at
    # layerprof/collect/profiler.py (its ``return method(self.profile, ...)``), which a notebook shows as the
    # warning's source line instead of the user's cell.
    net, prof = _profiled_blocks()
    prof.profile.meta["shapes"] = {"steps_with_other_shapes": 1}  # as a profile of two input shapes reads
    caught = _caught(lambda: prof.checkpoint_plan("50%"))
    shapes = [w for w in caught if "inputs changed shape" in str(w.message)]
    assert len(shapes) == 1 and shapes[0].filename == __file__
    caught = _caught(lambda: prof.profile.checkpoint_plan("50%"))
    assert [w.filename for w in caught if "inputs changed shape" in str(w.message)] == [__file__]


class _Threaded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: dict[str, torch.Tensor] = {}
        worker = threading.Thread(target=lambda: out.setdefault("y", self.b(x)))
        worker.start()
        worker.join()
        return self.a(x) + out["y"]


def test_the_flops_meters_warning_of_a_module_run_on_another_thread_names_the_with_line() -> None:
    # It was raised with a fixed stack level from deep inside the block's exit: it named layerprof's own
    # collect/profiler.py.
    net = _Threaded()

    def profile() -> None:
        with LayerProf(net, metrics=("flops",)) as prof:
            for _ in range(2):
                net(torch.randn(2, 4)).sum().backward()
                prof.step()

    caught = [w for w in _caught(profile) if "on a thread of their own" in str(w.message)]
    assert len(caught) == 1 and caught[0].filename == __file__


def test_a_warning_of_a_plan_applied_with_its_context_manager_names_the_with_line() -> None:
    # ``with plan.applied(model):`` applies through contextlib: the warning about hooked modules named
    # contextlib.py; through verify_plan it named layerprof/plan/verify.py.
    net, prof = _profiled_blocks()
    plan = prof.checkpoint_plan(128)  # the least it reaches: the first Linear's input is all that stays saved
    assert plan.modules
    handles = [layer.register_forward_hook(lambda module, args, output: None) for block in net for layer in block]

    def applied() -> None:
        with plan.applied(net):
            net(torch.randn(4, 8)).sum().backward()

    def verified() -> None:
        layerprof.verify_plan(plan, net, lambda: net(torch.randn(4, 8)).sum().backward(), repeats=1)

    try:
        for action in (applied, verified):
            hooked = [w for w in _caught(action) if "carry forward hooks" in str(w.message)]
            assert len(hooked) >= 1 and {w.filename for w in hooked} == {__file__}, action.__name__
    finally:
        for handle in handles:
            handle.remove()


# -- a cell interrupted inside the ``with`` block ---------------------------------------------------------------
class _Interrupting(nn.Module):
    """A Linear whose forward is interrupted at its ``at``-th call, as the kernel's interrupt lands in a forward."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.linear, self.at, self.calls = nn.Linear(8, 8), at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.linear(x)


def _hook_count(model: nn.Module) -> int:
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(module, kind)) for module in model.modules() for kind in kinds)


# The memory meter counts in the first step and the times come from the steps after it: 2 timed of 3 completed.
@pytest.mark.parametrize("metrics, timed", [((), 3), (("memory", "shapes"), 2)])
def test_an_interrupt_inside_the_with_block_keeps_the_steps_completed(metrics: tuple[str, ...], timed: int) -> None:
    # The kernel's interrupt after some steps of a profiled loop: the profile was lost ("no profile: the block
    # raised KeyboardInterrupt ... nothing was recorded"), though 3 steps had completed. They are now a partial
    # profile, as prof.stop(partial=...) makes, and the interrupt still ends the cell.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), _Interrupting(at=4))
    reference = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    reference.load_state_dict({key.replace("2.linear.", "2."): value for key, value in net.state_dict().items()})
    x = torch.randn(4, 8)
    hooks = _hook_count(net)
    with pytest.raises(KeyboardInterrupt):
        with LayerProf(net, metrics=metrics) as prof:
            for _ in range(10):
                net(x).sum().backward()
                prof.step()
    assert prof.meta["steps"] == timed and prof.meta["partial"] == "interrupted (KeyboardInterrupt)"
    assert prof.layerwise_summary().splitlines()[0] == (
        f"Partial profile ({timed} steps recorded): interrupted (KeyboardInterrupt).")
    assert prof.records["2"].calls == 1 and prof.records["2.linear"].calls == 1  # once a step, 3 steps averaged
    assert "<table" in prof._repr_html_() and repr(prof).startswith("<LayerProf Sequential: 5 modules")
    if metrics:
        assert prof.records["0"].saved_bytes == 4 * 8 * 4  # its input, 4x8 float32
    # the next cell: nothing left on the model, which trains as one never profiled, and profiles again
    assert _hook_count(net) == hooks and LayerProf.running_on(net) is None
    net.zero_grad()
    net(x).sum().backward()
    reference(x).sum().backward()
    assert torch.equal(net(x), reference(x))
    assert torch.equal(net[0].weight.grad, reference[0].weight.grad)
    assert torch.equal(net[2].linear.weight.grad, reference[2].weight.grad)
    with LayerProf(net) as again:
        net(x).sum().backward()
    assert again.records["2.linear"].calls == 1 and "partial" not in again.meta


def test_an_interrupt_before_any_step_completed_says_so() -> None:
    net = nn.Sequential(nn.Linear(8, 8), _Interrupting(at=1))
    with pytest.raises(KeyboardInterrupt):
        with LayerProf(net) as prof:
            net(torch.randn(4, 8)).sum().backward()
    with pytest.raises(RuntimeError, match=r"^no profile: the block raised KeyboardInterrupt with no step completed"):
        prof.profile
    assert repr(prof) == "<LayerProf Sequential (failed)>" and prof._repr_html_() is None
    assert _hook_count(net) == 0 and LayerProf.running_on(net) is None


# -- what a cell's last value shows ------------------------------------------------------------------------------
class _Printer:
    """The part of IPython's pretty printer that ``_repr_pretty_`` uses."""

    def __init__(self) -> None:
        self.written = ""

    def text(self, text: str) -> None:
        self.written += text


def _shown(value) -> str:
    printer = _Printer()
    value._repr_pretty_(printer, False)
    return printer.written


def test_a_checkpoint_plan_and_a_comparison_show_their_tables_as_a_cells_value() -> None:
    # A cell ending in ``plan`` or ``layerprof.compare(a, b)`` showed one line (``<CheckpointPlan Sequential: 1 run,
    # saved 2560 -> 1024 bytes ...>``), where print() gives the plan's modules and the comparison's tables; a
    # Verification and a benchmark's result already showed their text.
    net, prof = _profiled_blocks()
    plan = prof.checkpoint_plan("50%")
    assert _shown(plan) == str(plan) and str(plan).startswith("Checkpoint plan for Sequential: saved for backward")
    lines = str(plan).splitlines()  # the head line, a note on the wrapper's price, one line a wrapped module
    assert [line.split()[0] for line in lines[-len(plan.modules):]] == list(plan.modules)
    assert repr(plan).startswith("<CheckpointPlan ")
    comparison = layerprof.compare(prof, prof.profile, names=("before", "after"))
    assert _shown(comparison) == str(comparison)
    assert str(comparison).startswith("Comparison before (Sequential) vs after (Sequential); change and ratio")
    assert str(comparison).splitlines()[1].split() == ["metric", "before", "after", "change", "ratio", "better"]
    assert repr(comparison).startswith("<Comparison before (Sequential) vs after (Sequential): ")


# -- a real notebook, where nbclient and ipykernel are installed ------------------------------------------------
_CELLS = [
    """import torch, layerprof
torch.set_num_threads(1)
torch.manual_seed(0)
class Net(torch.nn.Module):  # a class defined in a cell: it has no source file
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
                                            for _ in range(3)])
    def forward(self, x):
        return self.blocks(x)
net, x = Net(), torch.randn(4, 8)""",
    """with layerprof.LayerProf(net, metrics=("memory", "shapes")) as prof:
    for _ in range(2):
        net(x).sum().backward()
        prof.step()
prof""",
    """prof.profile.meta["shapes"] = {"steps_with_other_shapes": 1}
plan = prof.checkpoint_plan("50%")
plan""",
    "layerprof.compare(prof, prof)",
    """ax = prof.plot("icicle")""",
    "import matplotlib.pyplot as plt; print(plt.get_fignums())",
    """with layerprof.LayerProf(net) as again:
    for step in range(5):
        if step == 3:
            raise KeyboardInterrupt  # as the kernel's interrupt lands
        net(x).sum().backward()
        again.step()""",
    "print(again.layerwise_summary(depth=0).splitlines()[0], layerprof.LayerProf.running_on(net))",
]


def test_a_notebook_shows_each_result_once_and_names_its_cells() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import os

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in _CELLS])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path  # the kernel imports this checkout's layerprof
    try:
        nbclient.NotebookClient(notebook, timeout=120, allow_errors=True, kernel_name="python3").execute()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    outputs = [cell.outputs for cell in notebook.cells]
    assert not any(out.output_type == "error" for cell in outputs[:6] for out in cell), outputs

    def shown(cell: int) -> list[dict]:
        return [out.data for out in outputs[cell] if out.output_type in ("execute_result", "display_data")]

    assert len(shown(1)) == 1 and "<table" in shown(1)[0]["text/html"]
    assert shown(1)[0]["text/plain"].startswith("<LayerProf Net: 11 modules")
    assert len(shown(2)) == 1 and shown(2)[0]["text/plain"].startswith("Checkpoint plan for Net: saved for backward")
    warned = "".join(out.text for out in outputs[2] if out.output_type == "stream" and out.name == "stderr")
    assert "inputs changed shape" in warned and "layerprof" + os.sep not in warned.split("RuntimeWarning")[0]
    assert len(shown(3)) == 1 and shown(3)[0]["text/plain"].startswith("Comparison a (Net) vs b (Net)")
    assert [sorted(data) for data in shown(4)] == [["image/png", "text/plain"]]  # the figure, once
    assert [out.text for out in outputs[5]] == ["[]\n"]  # no figure left open
    assert [out.ename for out in outputs[6] if out.output_type == "error"] == ["KeyboardInterrupt"]
    assert [out.text for out in outputs[7]] == ["Partial profile (3 steps recorded): interrupted (KeyboardInterrupt). "
                                                "None\n"]
