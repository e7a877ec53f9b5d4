"""LayerProf on small models that each carry one awkward feature of real ones."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
import time
import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from layerprof import LayerProf, schedule
from layerprof._tensors import first_tensor
from layerprof._torch import add_backward_entry_hook
from layerprof.collect import profiler as profiler_module
from layerprof.collect import tracker as tracker_module
from layerprof.collect.profiler import _PROFILED

from .conftest import TORCH_CALL_CODE, TORCH_CALL_IMPL, hook_state, module_call
from .invariants import check_profile, count_calls
from .measured import measured_until
from .models import MLP, Boom, DictOut, KwargsDataclass, Residual, SharedLoop, UnusedBranch


def profile_step(model: nn.Module, *inputs: torch.Tensor, **kwargs: torch.Tensor) -> LayerProf:
    with LayerProf(model) as prof:
        out = model(*inputs, **kwargs)
        tensor = out if isinstance(out, torch.Tensor) else out.logits
        tensor.sum().backward()
    return prof


def test_records_mirror_named_modules_and_have_the_documented_fields() -> None:
    model = MLP()
    prof = profile_step(model, torch.randn(4, 8))
    check_profile(prof, model)
    rows = prof.to_dict()
    assert rows[""]["type"] == "MLP" and rows[""]["depth"] == 0 and rows["body.0"]["depth"] == 2
    for key in ("type", "depth", "calls", "forward_ms", "backward_ms", "self_forward_ms", "self_backward_ms"):
        assert key in rows["body.2"]
    # Every module ran once, forward and backward, including the first Linear whose input needs no grad.
    for name, row in rows.items():
        assert row["calls"] == 1, name
        assert row["backward_ms"] is not None and row["backward_ms"] > 0, name
    assert prof.tree.name == "" and [c.name for c in prof.tree.children] == ["body", "head"]
    assert prof.records["body"].children[0].short_name == "0"


def test_self_times_add_up_to_the_root() -> None:
    model = MLP()
    prof = profile_step(model, torch.randn(4, 8))
    total_self_forward = sum(r.self_forward_ms for r in prof.records.values())
    assert total_self_forward == pytest.approx(prof.tree.forward_ms, rel=1e-9)
    body = prof.records["body"]
    assert body.self_forward_ms == pytest.approx(body.forward_ms - sum(c.forward_ms for c in body.children))


def test_shared_module_counts_every_call() -> None:
    model = SharedLoop()
    with count_calls(model) as reference, LayerProf(model) as prof:
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()
    check_profile(prof, model)
    assert prof.records["cell"].calls == reference["cell"] == 3
    assert prof.records["act"].calls == 3
    cell = prof.records["cell"]
    assert len(cell.call_times) == 3
    assert cell.forward_ms == pytest.approx(sum(t.forward_ms for t in cell.call_times))
    assert all(t.backward_ms is not None and t.backward_ms > 0 for t in cell.call_times)
    # Calls are in order and do not overlap.
    starts = [t.forward_start_ms for t in cell.call_times]
    assert starts == sorted(starts)
    # Backward runs in reverse: the last forward call is the first backward.
    backward_starts = [t.backward_start_ms for t in cell.call_times]
    assert backward_starts == sorted(backward_starts, reverse=True)


def test_call_times_are_made_when_read_and_rows_need_none_made() -> None:
    model = SharedLoop()
    with LayerProf(model) as prof:
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()
    cell = prof.records["cell"]
    # A row is made from the collected tuples: no CallTiming object exists until call_times is read.
    row_timings = prof.to_dict()["cell"]["call_times"]
    assert cell._call_times is None and len(row_timings) == 3  # the cell runs 3 times
    timings = cell.call_times
    assert cell.call_times is timings  # made once
    assert [timing.to_dict() for timing in timings] == row_timings
    assert [timing.step for timing in timings] == [0, 0, 0] and not any(timing.recompute for timing in timings)
    # A list set by hand (as loading does) is kept as given, rows included.
    cell.call_times = timings[:1]
    assert len(prof.records["cell"].call_times) == 1 and len(prof.to_dict()["cell"]["call_times"]) == 1


def test_inplace_ops_after_hooked_modules() -> None:
    model = Residual()
    x = torch.randn(4, 8, requires_grad=True)
    prof = profile_step(model, x)
    check_profile(prof, model)
    assert prof.records["relu"].calls == 2
    assert prof.records["fc"].backward_ms > 0 and prof.records["relu"].backward_ms > 0


def test_keyword_tensor_input_and_dataclass_output() -> None:
    model = KwargsDataclass()
    prof = profile_step(model, features=torch.randn(4, 8))
    check_profile(prof, model)
    assert all(prof.records[n].backward_ms > 0 for n in ("", "proj", "out"))


def test_dict_output_both_branches_get_backward() -> None:
    model = DictOut()
    with LayerProf(model) as prof:
        out = model(torch.randn(4, 8))
        (out["a"].sum() + out["b"].sum()).backward()
    check_profile(prof, model)
    assert prof.records["a"].backward_ms > 0 and prof.records["b"].backward_ms > 0


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "eval_no_grad"])
def test_forward_only_marks_backward_not_measured(mode: str) -> None:
    model = MLP()
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    if mode == "eval_no_grad":
        model.eval()
    with LayerProf(model) as prof, context:
        model(torch.randn(4, 8))
    check_profile(prof, model, backward=False)
    assert all(r.calls == 1 and r.forward_ms > 0 for r in prof.records.values())
    assert "Backward Time: —" in prof.layerwise_summary()
    # not "of the total (forward + backward of the model)": there was no backward
    assert prof.layerwise_summary().splitlines()[0].endswith(
        "; percentages are of the total, the model's forward (the steps ran no backward).")


def test_forward_with_grad_but_no_backward_call() -> None:
    model = MLP()
    with LayerProf(model) as prof:
        model(torch.randn(4, 8))
    assert all(r.backward_ms is None and r.forward_ms > 0 for r in prof.records.values())


def test_module_whose_output_is_unused_keeps_its_forward() -> None:
    model = UnusedBranch()
    prof = profile_step(model, torch.randn(4, 8))
    assert prof.records["unused"].calls == 1 and prof.records["unused"].forward_ms > 0
    assert prof.records["unused"].backward_ms is None
    assert prof.records["used"].backward_ms > 0


def test_rnn_modules_and_cell_loops() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.cell = nn.GRUCell(16, 16)
            self.head = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seq, _ = self.lstm(x)
            h = seq[:, 0]
            for t in range(seq.shape[1]):
                h = self.cell(seq[:, t], h)
            return self.head(h)

    model = Net()
    with count_calls(model) as reference, LayerProf(model) as prof:
        model(torch.randn(2, 5, 8)).sum().backward()
    check_profile(prof, model)
    assert prof.records["cell"].calls == reference["cell"] == 5
    assert prof.records["lstm"].backward_ms > 0


def test_outputs_and_gradients_are_bitwise_identical() -> None:
    torch.manual_seed(0)
    model = Residual()
    x = torch.randn(4, 8)

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = model(x.clone())
        out.sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    plain_out, plain_grads = step()
    with LayerProf(model):
        prof_out, prof_grads = step()
    assert torch.equal(plain_out, prof_out)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, prof_grads))


def test_no_activation_or_gradient_survives_the_step() -> None:
    model = MLP()
    refs: list[weakref.ref] = []
    spy = [m.register_forward_hook(lambda m, a, o: refs.append(weakref.ref(o))) for m in model.modules()]
    with LayerProf(model) as prof:
        out = model(torch.randn(4, 8, requires_grad=True))
        out.sum().backward()
        grad_refs = [weakref.ref(p.grad) for p in model.parameters()]
        del out
        model.zero_grad(set_to_none=True)
    for handle in spy:
        handle.remove()
    gc.collect()
    assert refs and all(ref() is None for ref in refs), "an activation is still referenced"
    assert all(ref() is None for ref in grad_refs), "a gradient is still referenced"
    assert prof.tree.backward_ms > 0


def test_model_left_exactly_as_found() -> None:
    model = Residual()
    model.fc.register_forward_hook(lambda m, a, o: None)  # the user's own hook must survive
    before_hooks, before_repr = hook_state(model), repr(model)
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    profile_step(model, torch.randn(4, 8))
    assert hook_state(model) == before_hooks and repr(model) == before_repr
    after_state = model.state_dict()
    assert list(after_state) == list(before_state)
    assert all(torch.equal(before_state[k], after_state[k]) for k in before_state)
    assert len(model.fc._forward_hooks) == 1


def test_exception_in_block_removes_hooks_and_names_the_module() -> None:
    model = Boom()
    before = hook_state(model)
    with pytest.raises(RuntimeError) as raised:
        with LayerProf(model):
            model(torch.randn(2, 8))
    assert hook_state(model) == before
    notes = getattr(raised.value, "__notes__", [])
    assert any("'bad'" in note and "Linear" in note for note in notes), notes
    assert not _PROFILED
    # The model can be profiled again afterwards.
    with LayerProf(model.ok) as prof:
        model.ok(torch.randn(2, 8))
    assert prof.tree.calls == 1


def test_exception_raised_by_user_code_in_block_gets_no_module_note() -> None:
    model = MLP()
    with pytest.raises(KeyError) as raised:
        with LayerProf(model):
            model(torch.randn(2, 8))
            raise KeyError("user")
    assert not getattr(raised.value, "__notes__", [])


@pytest.mark.parametrize("metrics", [("shapes",), None], ids=["a meter observing calls", "timing only"])
def test_hooking_failure_half_way_leaves_no_hook(metrics: tuple[str, ...] | None) -> None:
    # A module with hooks of its own gets ours beside them at each call; where its second hook dict refuses them
    # (body.2), the call raises with nothing of ours left on any module, and torch's _call_impl is back.
    from collections import OrderedDict

    class Refusing(OrderedDict):
        def __setitem__(self, key: object, value: object) -> None:
            raise RuntimeError("cannot hook")

    model = MLP()
    model.body[0].register_forward_pre_hook(lambda module, args: None)
    model.body[2].register_forward_pre_hook(lambda module, args: None)
    model.body[2]._forward_pre_hooks_with_kwargs = Refusing()
    before = hook_state(model)
    with pytest.raises(RuntimeError, match="cannot hook"):
        with LayerProf(model, metrics=metrics):
            model(torch.randn(2, 8))
    assert hook_state(model) == before
    assert not _PROFILED


@pytest.mark.parametrize("metrics", [None, ("shapes",), ("memory",), ("flops",)])
def test_a_block_writes_no_hook_into_a_module_meters_or_not(metrics: tuple[str, ...] | None) -> None:
    # The call wrapper, whatever the meters: a module carrying a forward hook can run otherwise
    # (nn.TransformerEncoderLayer's fused inference path checks every module's hook dicts under it). A meter that
    # observes calls gets their keyword arguments all the same.
    model = KwargsDataclass()
    before = hook_state(model)
    with LayerProf(model, metrics=metrics) as prof:
        assert hook_state(model, calls=False) == {name: state for name, state in before.items() if name is not None}
        model(features=torch.randn(3, 8)).logits.sum().backward()
    assert hook_state(model) == before
    if metrics == ("shapes",):
        assert prof.records[""].input_paths == ["features"] and prof.records[""].input_shapes == [[3, 8]]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("metrics", [None, ("flops",)])
def test_a_nested_tensor_input(metrics: tuple[str, ...] | None) -> None:
    # A strided nested tensor has no sizes (``.shape`` raises): the block reads its first dimension as the batch.
    # aten.linear decomposes on plain tensors, and on this one cannot: the FLOP meter runs it as it is and prices
    # it per component.
    linear = nn.Linear(4, 4)
    nested = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    with torch.no_grad():
        expected = linear(nested)
        with LayerProf(linear, metrics=metrics) as prof:
            out = linear(nested)
        plain = LayerProf(linear, metrics=metrics)
        with plain:
            linear(torch.randn(3, 4))
    assert all(torch.equal(a, b) for a, b in zip(out.unbind(), expected.unbind()))
    assert prof.tree.calls == 1 and prof.tree.forward_ms > 0
    assert prof.profile.meta["environment"]["batch_size"] == 2
    if metrics:
        assert prof.profile.unknown_ops() == {}
        assert prof.tree.flops_forward == 2 * (3 + 2) * 4 * 4  # priced per component: 160
        assert plain.tree.flops_forward == 2 * 3 * 4 * 4  # on a plain tensor it still decomposes: 96


def test_hooks_written_directly_behave_as_torchs_own() -> None:
    # Our pre-hook runs after the user's, our post-hook before the user's and also when forward raises; taking
    # them off leaves every hook dict as it was, the user's hooks in place.
    from layerprof._torch import add_forward_hooks, remove_forward_hooks

    order: list[str] = []
    module = nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda m, a: order.append("user pre"))
    module.register_forward_hook(lambda m, a, o: order.append("user post"))
    before = hook_state(module)
    added = add_forward_hooks(module, lambda m, a, k: order.append("our pre"),
                              lambda m, a, k, o: order.append("our post"))
    module(torch.randn(1, 2))
    assert order == ["user pre", "our pre", "our post", "user post"]
    order.clear()
    with pytest.raises(RuntimeError):
        module(torch.randn(1, 3))
    assert order == ["user pre", "our pre", "our post"]
    remove_forward_hooks(module, added)
    assert hook_state(module) == before


def test_reentering_and_nesting_are_refused() -> None:
    model = MLP()
    prof = profile_step(model, torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="already used"):
        with prof:
            pass
    with LayerProf(model):
        with pytest.raises(RuntimeError, match="already being profiled") as raised:
            with LayerProf(model.body):
                pass
    # A part of a profiled model: the message says which part it is there, and how to have both.
    assert "(it is 'body' in the model that one profiles)" in str(raised.value)
    assert "use one LayerProf on a module that holds them all" in str(raised.value)
    assert not _PROFILED


def test_two_models_sharing_a_module_are_told_to_use_one_profiler() -> None:
    shared = nn.Embedding(10, 4)
    teacher, student = nn.Sequential(shared, nn.Linear(4, 4)), nn.Sequential(shared, nn.Linear(4, 2))
    with LayerProf(teacher):
        with pytest.raises(RuntimeError) as raised:
            with LayerProf(student):
                pass
    message = str(raised.value)
    assert message.startswith("module '0' (Embedding) is already being profiled by another active LayerProf")
    assert "(it is '0' in the model that one profiles)" in message and "an nn.ModuleDict of the models" in message
    with LayerProf(nn.ModuleDict({"teacher": teacher, "student": student})) as prof:
        teacher(torch.tensor([1, 2])).sum().backward()
        student(torch.tensor([3])).sum().backward()
    # the shared embedding is one module: one row, both models' calls (as for any module called twice)
    assert prof.records["teacher.0"].calls == 2 and "student.0" not in prof.records
    assert prof.records["teacher.1"].calls == 1 and prof.records["student.1"].calls == 1
    assert not _PROFILED


def test_profilers_on_two_models_time_only_their_own_modules() -> None:
    # Global module hooks see every module of the process: each profiler times its own model's modules, an
    # unprofiled model called inside both blocks (and inside a profiled forward) is timed by neither. Each block
    # routes module calls through a function of its own around torch's Module._call_impl, and puts nothing in
    # torch's global hook tables but its registration hook; afterwards torch's _call_impl and the tables are as
    # they were (the nested block's wrapper leaves the outer one's in place).
    from torch.nn.modules import module as torch_module

    first, second, other = MLP(), MLP(), nn.Linear(1, 1)
    tables = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_with_kwargs",
              "_global_forward_hooks_always_called", "_global_module_registration_hooks")
    global_before = [dict(getattr(torch_module, table)) for table in tables]
    torch_call = module_call()
    with LayerProf(first) as outer:
        outer_call = module_call()
        # (inside torch's function: nn.Module is not written, its code is swapped for one calling the wrapper)
        assert outer_call is not torch_call and vars(nn.Module)["_call_impl"] is torch_call
        assert torch_call.__code__ is not TORCH_CALL_CODE
        with LayerProf(second) as inner:
            assert module_call() not in (torch_call, outer_call)
            other(first(torch.randn(2, 8))).sum().backward()
            second(torch.randn(2, 8))
            second(torch.randn(2, 8)).sum().backward()
            added = [len(getattr(torch_module, table)) - len(was) for table, was in zip(tables, global_before)]
            assert added == [0, 0, 0, 0, 2]
        assert module_call() is not torch_call  # (the outer block's wrapper alone, in a chain made again)
        first(torch.randn(2, 8))
    assert module_call() is torch_call and torch_call.__code__ is TORCH_CALL_CODE and torch_call.__kwdefaults__ is None
    assert [dict(getattr(torch_module, table)) for table in tables] == global_before  # (each block's entries gone)
    # MLP: root, body, body.0-3, head = 7 modules, each called once per model call.
    assert [r.calls for r in outer.tree] == [2] * 7  # two calls of `first`, one inside the inner block
    assert [r.calls for r in inner.tree] == [2] * 7
    assert outer.records["head"].backward_ms > 0 and inner.records["head"].backward_ms > 0
    assert len(outer.records) == len(inner.records) == 7


def test_a_call_through_torchs_call_impl_held_before_the_block_is_timed_and_torchs_code_comes_back() -> None:
    # The block swaps the code of torch's Module._call_impl for a call of its wrapper, and writes nothing in
    # nn.Module: a tool that kept torch's function before the block (dynamo keeps it, to tell an unpatched call)
    # and calls it, runs the wrapper too. After the block the function runs torch's code again, as before.
    import inspect

    model, x = MLP(), torch.randn(2, 8)
    held = nn.Module._call_impl
    signature, before = inspect.signature(held), hook_state(model)
    with LayerProf(model) as prof:
        assert vars(nn.Module)["_call_impl"] is held is TORCH_CALL_IMPL and held.__code__ is not TORCH_CALL_CODE
        held(model, x).sum().backward()
    assert held.__code__ is TORCH_CALL_CODE and held.__kwdefaults__ is None and inspect.signature(held) == signature
    assert hook_state(model) == before
    # MLP: root, body, body.0-3, head: each called once, the root through the held function
    assert [(record.name, record.calls) for record in prof.tree] == [
        ("", 1), ("body", 1), ("body.0", 1), ("body.1", 1), ("body.2", 1), ("body.3", 1), ("head", 1)]
    assert prof.records[""].backward_ms > 0
    check_profile(prof, model)


def test_where_torchs_call_impl_cannot_take_other_code_the_wrapper_goes_in_nn_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A torch whose _call_impl is no plain function without free variables and keyword-only defaults (no copy of it
    # can run its code): the block puts its wrapper in nn.Module in its place, and torch's goes back at the end.
    from layerprof import _torch

    monkeypatch.setattr(_torch, "_TORCH", None)
    model = MLP()
    before = hook_state(model)
    with LayerProf(model) as prof:
        assert vars(nn.Module)["_call_impl"] is not TORCH_CALL_IMPL and TORCH_CALL_IMPL.__code__ is TORCH_CALL_CODE
        model(torch.randn(2, 8)).sum().backward()
    assert vars(nn.Module)["_call_impl"] is TORCH_CALL_IMPL and hook_state(model) == before
    assert [record.calls for record in prof.tree] == [1] * 7 and prof.records["head"].backward_ms > 0  # MLP: 7 modules
    check_profile(prof, model)


def test_global_module_hooks_registered_inside_the_block_run_inside_the_calls() -> None:
    # Another tool's global module hook (as torch's ModuleTracker registers): it sees every module, runs inside
    # each call (timed there), writes nothing into the modules, and the profile is whole.
    from torch.nn.modules.module import register_module_forward_pre_hook

    model = MLP()
    before = hook_state(model)
    seen: list[nn.Module] = []

    def slow(module: nn.Module, args: Any) -> None:
        seen.append(module)
        if module is model.head:
            time.sleep(0.02)

    with LayerProf(model) as prof:
        handle = register_module_forward_pre_hook(slow)
        try:
            out = model(torch.randn(2, 8))
            assert hook_state(model, calls=False) == {name: state for name, state in before.items() if name is not None}
        finally:
            handle.remove()
        out.sum().backward()
    assert hook_state(model) == before
    assert seen == [model, model.body, *model.body, model.head]
    # MLP: root, body, body.0-3, head: each called once; those with parameters, and their parents, have backward.
    assert [(record.name, record.calls) for record in prof.tree] == [
        ("", 1), ("body", 1), ("body.0", 1), ("body.1", 1), ("body.2", 1), ("body.3", 1), ("head", 1)]
    assert prof.records["head"].forward_ms >= 20  # the hook's sleep, inside head's call
    for name in ("", "body", "body.0", "body.2", "head"):
        assert prof.records[name].backward_ms > 0, name
    check_profile(prof, model)


def test_a_call_impl_replaced_by_another_tool_inside_the_block_is_left_in_place() -> None:
    # Something else puts its own function in Module._call_impl while the block runs, calling the one it found
    # (ours): the block's end leaves it there rather than drop it, and it keeps working: calls after the block go
    # through it and ours, which hands them on untimed. A block started then is put around it, and its end
    # leaves it as it was. Once the tool puts back what it found, the next block's end restores torch's.
    model = MLP()
    counted: list[nn.Module] = []
    with LayerProf(model) as prof:
        found = vars(nn.Module)["_call_impl"]

        def theirs(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            counted.append(module)
            return found(module, *args, **kwargs)

        nn.Module._call_impl = theirs
        try:
            model(torch.randn(2, 8)).sum().backward()
        except BaseException:
            nn.Module._call_impl = found
            raise
    try:
        # (and torch's function, which theirs calls, runs torch's code again: nothing of the ended block is left)
        assert vars(nn.Module)["_call_impl"] is theirs and found is TORCH_CALL_IMPL
        assert found.__code__ is TORCH_CALL_CODE and found.__kwdefaults__ is None
        # MLP: 7 modules, each called once per model call
        assert len(counted) == 7 and prof.tree.calls == 1 and prof.records["head"].backward_ms > 0
        model(torch.randn(2, 8))  # after the block: through theirs, then handed on untimed
        assert len(counted) == 14 and prof.tree.calls == 1
        with LayerProf(model) as later:
            model(torch.randn(2, 8)).sum().backward()
        assert vars(nn.Module)["_call_impl"] is theirs
        assert len(counted) == 21 and later.tree.calls == 1 and later.records["head"].calls == 1
        assert later.records["head"].backward_ms > 0 and prof.tree.calls == 1
    finally:
        nn.Module._call_impl = found  # (theirs restores what it found: torch's function, its code given back)
    with LayerProf(model) as last:  # a block that finds a chain of ours whose blocks all ended unwraps it
        model(torch.randn(2, 8))
    assert vars(nn.Module)["_call_impl"] is TORCH_CALL_IMPL
    assert last.tree.calls == 1 and prof.tree.calls == later.tree.calls == 1


class _GradInForward(nn.Module):
    """Takes the gradient of its child's output with respect to its input inside its own forward (a force as the
    gradient of an energy), while the model's call is still open; the child's backward sleeps."""

    def __init__(self) -> None:
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        energy = self.energy(pos).sum()
        energy.register_hook(lambda grad: time.sleep(0.02))  # (on the child's output: runs in both passes)
        force, = torch.autograd.grad(energy, pos, create_graph=True)
        return energy + force.pow(2).sum()


TORCH_ENGINE_ENTRY = torch.autograd._engine_run_backward


class _Rollout(nn.Module):
    """Calls its child many times in one forward, dropping all but the last output (a rollout's steps)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.step = nn.Linear(2, 2)
        self.steps = steps
        self.most_pending = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            out = self.step(x)
            self.most_pending = max(self.most_pending, len(tracker_module._thread_pending()) // 4)
        return out


def test_a_forward_that_loops_on_walks_its_inner_calls_before_too_many_wait() -> None:
    # The walks of inner calls wait for the outermost call to return, holding the graphs of outputs it dropped: at
    # most _MOST_PENDING of them; the calls and the backward of the one output kept are as ever.
    model = _Rollout(steps=tracker_module._MOST_PENDING + 50)
    with LayerProf(model) as prof:
        model(torch.randn(3, 2)).sum().backward()
    assert 50 <= model.most_pending < tracker_module._MOST_PENDING  # (it emptied once, at the limit)
    assert prof.records["step"].calls == tracker_module._MOST_PENDING + 50
    assert prof.records["step"].backward_ms > 0 and not tracker_module._thread_pending()


def _grad_in_forward_profile() -> LayerProf:
    model = nn.Sequential(_GradInForward())
    with LayerProf(model) as prof:
        model(torch.randn(4, 3, requires_grad=True)).backward()
    check_profile(prof, model)
    # The pass inside the forward ran the child's nodes: hooked by then, as their calls returned before it.
    assert prof.records["0.energy.2"].backward_ms > 0 and prof.records["0.energy.0"].backward_ms > 0
    return prof


def test_a_backward_entry_replaced_by_another_tool_is_left_in_place_and_handed_on() -> None:
    # Another tool puts a function of its own where torch.autograd starts the engine, calling what it found (ours),
    # inside a block: the block's end leaves it there, and ours inside it hands each pass on. A later block uses it
    # as it is; once the tool puts back what it found, the next block's end restores torch's.
    found: list[Any] = []
    passes: list[int] = []

    def theirs(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return found[0](*args, **kwargs)

    model = nn.Sequential(_GradInForward())
    try:
        with LayerProf(model) as prof:
            found.append(torch.autograd._engine_run_backward)
            assert found[0] is not TORCH_ENGINE_ENTRY  # ours, while the block runs
            torch.autograd._engine_run_backward = theirs
            model(torch.randn(4, 3, requires_grad=True)).backward()
        assert torch.autograd._engine_run_backward is theirs and len(passes) == 2
        assert prof.records["0.energy.2"].backward_ms > 0
        later = _grad_in_forward_profile()
        assert torch.autograd._engine_run_backward is theirs and len(passes) == 4 and later.tree.calls == 1
    finally:
        torch.autograd._engine_run_backward = found[0] if found else TORCH_ENGINE_ENTRY
    _grad_in_forward_profile()
    assert torch.autograd._engine_run_backward is TORCH_ENGINE_ENTRY


def test_torchscript_in_the_process_hooks_the_start_nodes_of_the_walks_put_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh process has compiled no TorchScript; scripting anything (here a module) compiles some.
    code = ("import torch; from layerprof._torch import torchscript_compiled as compiled; before = compiled(); "
            "torch.jit.script(torch.nn.Linear(2, 2)); print(before, compiled(), compiled())")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.stdout.split() == ["False", "True", "True"], ran.stderr  # (the second answer kept from the first)
    # (this process has, which the suite hides from the profiler but here: conftest.no_torchscript_compiled)
    for compiled in (False, True):
        monkeypatch.setattr(profiler_module, "torchscript_compiled", lambda: compiled)
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        with LayerProf(model) as prof:
            assert prof._tracker.early_hooks is compiled
            model(torch.randn(3, 2)).sum().backward()
        assert prof.records["0"].backward_ms > 0 and prof.records["1"].backward_ms > 0


@pytest.mark.skipif(not hasattr(torch.compiler, "_patch_engine_backward"), reason="this torch has no such patch")
def test_torchs_own_engine_patch_inside_a_block_puts_ours_back() -> None:
    # make_fx's non-strict tracing puts a function of its own under both names of the engine entry and, leaving,
    # what it found in torch.autograd.graph under both: ours stands there too, so ours is back for the passes after.
    model = nn.Sequential(_GradInForward())
    with LayerProf(model) as prof:
        ours = torch.autograd._engine_run_backward
        with torch.compiler._non_strict_tracing_context(), torch.compiler._patch_engine_backward():
            pass
        assert torch.autograd._engine_run_backward is ours is torch.autograd.graph._engine_run_backward
        model(torch.randn(4, 3, requires_grad=True)).backward()
    assert prof.records["0.energy.2"].backward_ms > 0
    assert torch.autograd._engine_run_backward is TORCH_ENGINE_ENTRY is torch.autograd.graph._engine_run_backward


def test_without_a_backward_entry_to_hook_each_call_is_walked_as_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    # A torch that starts the engine otherwise: no hook of ours goes on, so no walk waits for the outermost call,
    # and a pass inside the forward still runs hooked nodes.
    monkeypatch.setattr(torch.autograd, "_engine_run_backward", None)
    assert add_backward_entry_hook(lambda: None) is None and torch.autograd._engine_run_backward is None
    monkeypatch.undo()
    monkeypatch.setattr(tracker_module, "add_backward_entry_hook", lambda hook: None)
    _grad_in_forward_profile()
    assert torch.autograd._engine_run_backward is TORCH_ENGINE_ENTRY


def test_torchscript_modules_called_inside_the_block_run_as_they_do_unprofiled() -> None:
    # A scripted and a traced module beside the profiled model (a teacher, a preprocessing step): their calls go
    # through the call wrapper untimed (a TorchScript module's table of children has no dict's .get: the check for a
    # compiled wrapper of a profiled module raised AttributeError on every such call).
    x = torch.randn(2, 8)
    scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    traced = torch.jit.trace(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (x,))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    expected = model(scripted(x) + traced(x))
    with LayerProf(model) as prof:
        out = model(scripted(x) + traced(x))
        out.sum().backward()
    assert torch.equal(out, expected)
    assert [(record.name, record.calls) for record in prof.tree] == [("", 1), ("0", 1), ("1", 1)]
    check_profile(prof, model)


def test_a_keyword_argument_named_module_reaches_forward() -> None:
    # The call wrapper takes the module positionally only: a forward's own `module=` keyword (of a profiled module
    # or of any other module called inside the block) reaches forward as it does unprofiled.
    class Routed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, module: nn.Module | None = None, self_: int = 0) -> torch.Tensor:
            return (module or self.proj)(x) + self_

    model, other, x = Routed(), Routed(), torch.randn(2, 4)
    expected = model(x, module=model.proj, self_=1)
    with LayerProf(model) as prof:
        out = model(x, module=model.proj, self_=1)
        other(x, module=other.proj)
        out.sum().backward()
    assert torch.equal(out, expected)
    assert prof.tree.calls == 1 and prof.records["proj"].calls == 1 and prof.records["proj"].backward_ms > 0


def test_a_module_with_hooks_of_its_own_called_on_two_threads_at_once_counts_both_calls() -> None:
    # Ours go on with the first call under way and off with the last: a call that began while the other thread's
    # was running keeps them until it ends (two threads inside forward at once, held by a barrier; as DataParallel's
    # replicas, which share their original's hook dicts, run).
    import threading

    class Waits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.both_inside = threading.Barrier(2)

        def forward(self, x: torch.Tensor, late: bool) -> torch.Tensor:
            self.both_inside.wait(timeout=10)
            if late:
                time.sleep(0.05)  # ends after the other call
            return self.proj(x)

    model = Waits()
    model.register_forward_hook(lambda module, args, output: None)
    before = hook_state(model)
    outs: dict[bool, torch.Tensor] = {}
    with LayerProf(model) as prof:
        threads = [threading.Thread(target=lambda late=late: outs.update({late: model(torch.randn(2, 4), late)}))
                   for late in (False, True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        (outs[False].sum() + outs[True].sum()).backward()
    assert hook_state(model) == before
    assert prof.tree.calls == 2 and prof.records["proj"].calls == 2
    assert prof.tree.forward_ms >= 50  # the late call's sleep, inside its call


def test_a_recursive_module_with_hooks_of_its_own_counts_each_call_once() -> None:
    # A module with a forward hook of its own gets ours beside it for each call; a call of it inside its own
    # forward finds them on already, and is timed by them once (3 calls: depth 2, 1, 0; the inner two recursive).
    class Recursive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
            x = self.proj(x)
            return self(x, depth=depth - 1) if depth else x

    model = Recursive()
    seen: list[int] = []
    model.register_forward_hook(lambda module, args, output: seen.append(1))
    before = hook_state(model)
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    assert hook_state(model) == before and seen == [1, 1, 1]
    assert prof.records["proj"].calls == 3 and prof.tree.calls == 3
    assert [call.recursive for call in prof.tree.call_times] == [False, True, True]
    check_profile(prof, model)


@pytest.mark.parametrize("nested", [True, False], ids=["nested tensor path", "dense"])
@pytest.mark.parametrize("middle", ["a hook of the user's, then removed", "FlopCounterMode"])
def test_an_encoder_in_inference_runs_as_unprofiled_around_hooks_of_the_users(nested: bool, middle: str) -> None:
    # nn.TransformerEncoderLayer takes its fused path only where it and its children carry no hook. A batch run with
    # a user's hook on a child, or under FlopCounterMode (global hooks), runs the slow path, profiled or not; the
    # batches after it run the fused one again, and every output is bitwise that of an unprofiled twin.
    import copy as copy_module

    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=nested).eval()
    twin = copy_module.deepcopy(model)
    xs = [torch.randn(2, 10, 32) for _ in range(3)]
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 6:] = True  # the second sequence padded

    def run_middle(encoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if middle == "FlopCounterMode":
            with FlopCounterMode(display=False):
                return encoder(x, src_key_padding_mask=mask)
        handle = encoder.layers[0].linear1.register_forward_hook(lambda module, args, output: None)
        try:
            return encoder(x, src_key_padding_mask=mask)
        finally:
            handle.remove()

    def batches(encoder: nn.Module) -> list[torch.Tensor]:
        return [encoder(xs[0], src_key_padding_mask=mask), run_middle(encoder, xs[1]),
                encoder(xs[2], src_key_padding_mask=mask)]

    with torch.inference_mode():
        expected = batches(twin)
        with LayerProf(model) as prof:
            got = batches(model)
    for index, (out, ref) in enumerate(zip(got, expected)):
        assert torch.equal(out.to_padded_tensor(0) if out.is_nested else out,
                           ref.to_padded_tensor(0) if ref.is_nested else ref), index
    assert prof.tree.calls == 3 and prof.records["layers.0"].calls == 3
    # The fused path runs no submodule of a layer: linear1 ran only where its hook sent the layer down the slow
    # path (global hooks do not).
    assert prof.records["layers.0.linear1"].calls == (0 if middle == "FlopCounterMode" else 1)


def test_trackers_of_one_thread_share_its_node_hooker() -> None:
    # Made once per thread, not in every block's first forward (its carrier tensor costs tens of µs cold): two
    # blocks at once hook their graph nodes with the same one, each node with its own call's dict.
    first, second = MLP(), MLP()
    with LayerProf(first) as outer:
        with LayerProf(second) as inner:
            first(torch.randn(2, 8)).sum().backward()
            second(torch.randn(2, 8)).sum().backward()
            shared = outer._tracker._thread().hooker
            assert inner._tracker._thread().hooker is shared
    with LayerProf(first) as later:
        first(torch.randn(2, 8)).sum().backward()
        assert later._tracker._thread().hooker is shared
        assert shared._carrier._backward_hooks is not None  # the last walk's dict, {0: its owner call}
    assert shared._carrier._backward_hooks is None  # let go of as the block ends (it holds the call and its step)
    for prof in (outer, inner, later):
        # MLP: root, body, body.0-3, head = 7 modules, each called once, each with its backward timed.
        assert [r.calls for r in prof.tree] == [1] * 7
        assert all(r.backward_ms is not None and r.backward_ms > 0 for r in prof.tree)


def test_a_thread_whose_first_block_ran_in_inference_mode_times_a_later_backward() -> None:
    # The thread's NodeHooker is made in its first profiled forward, here under inference mode (an inference
    # tensor as its carrier), and serves the blocks after it, with grad.
    import threading

    model = MLP()
    found: list[LayerProf] = []

    def run() -> None:
        with torch.inference_mode(), LayerProf(model):
            model(torch.randn(2, 8))
        with LayerProf(model) as prof:
            model(torch.randn(2, 8)).sum().backward()
        found.append(prof)

    thread = threading.Thread(target=run)  # a thread of its own: its first profiled forward is the one above
    thread.start()
    thread.join()
    assert [r.calls for r in found[0].tree] == [1] * 7
    assert all(r.backward_ms is not None and r.backward_ms > 0 for r in found[0].tree)


def test_a_thread_that_walks_and_lives_on_keeps_no_call_of_a_finished_profile() -> None:
    # CUDA's autograd thread runs every backward on a GPU and lives as long as the process: where checkpointing
    # recomputes a forward there, that thread walks graph nodes, and its hooker kept the last walk's dict, the
    # finished call, its clock (the event pool) and its step, until its next walk. A worker thread that runs the
    # backward and then waits stands in for it.
    import threading

    from layerprof.collect.tracker import _thread_hooker

    model = MLP()
    hookers: list[Any] = []
    done, finished = threading.Event(), threading.Event()

    def backward(loss: torch.Tensor) -> None:
        loss.backward()  # the recomputation's forward runs here, and its walks
        hookers.append(_thread_hooker())
        done.set()
        finished.wait(10)

    with LayerProf(model) as prof:
        loss = checkpoint(model.body, torch.randn(2, 8), use_reentrant=False).sum()
        thread = threading.Thread(target=backward, args=(loss,))
        thread.start()
        assert done.wait(10)
    try:
        # Its forward ran again on the worker (the walk this is about), as recomputation, not a second call.
        assert prof.records["body"].calls == 1 and prof.records["body"].recompute_ms > 0
        assert hookers[0]._carrier._backward_hooks is None
    finally:
        finished.set()
        thread.join()


def test_a_step_ending_on_one_thread_leaves_the_hook_dict_another_threads_walk_is_using() -> None:
    # A thread's NodeHooker is shared by every profiler. A walk sets the carrier's dict, then hooks nodes with
    # it; the GIL can pass to another thread between the two. Profiler A, whose modules ran on the worker once,
    # ends a step on the main thread while profiler B's walk on the worker is between the two: had A's step end
    # cleared the worker's carrier (its dict set to None), B's next ``register(node)`` would hand torch a null
    # dict, which crashes the process (a segmentation fault).
    import threading

    from layerprof.collect.tracker import _thread_hooker

    first, second = MLP(), MLP()
    mid_walk, step_ended, seen = threading.Event(), threading.Event(), []

    def worker() -> None:
        first(torch.randn(2, 8)).sum().backward()  # A's tracker gets a state for this thread
        second(torch.randn(2, 8))  # and B's
        hooker, owner = _thread_hooker(), {0: "B's call"}
        hooker.use(owner)  # B's walk, between setting the dict and its next register(node)
        mid_walk.set()
        step_ended.wait(10)
        seen.append(hooker._carrier._backward_hooks)

    with LayerProf(first) as outer, LayerProf(second):
        thread = threading.Thread(target=worker)
        thread.start()
        assert mid_walk.wait(10)
        outer.step()  # A's step ends on the main thread
        step_ended.set()
        thread.join()
    assert seen == [{0: "B's call"}]


def test_clock_of_a_call_given_its_tensors_by_keyword_sees_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # Once CUDA is initialised a call's clock follows its first tensor (args, then kwargs, then the module's
    # parameters): a module with no parameters given its tensor by keyword (an attention core called as
    # core(q=..., k=..., v=...)) would get the CPU clock on a GPU where the kwargs were not read (torch's global
    # pre-hooks, which layerprof used, get none). Pretend CUDA is initialised and record the tensor each call's
    # clock is chosen from, through the call wrapper and through hooks of ours beside a module's own (proj's).
    from layerprof.collect import tracker as tracker_module

    class Scale(nn.Module):
        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.scale = Scale()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.scale(x=self.proj(x))

    seen: dict[str, torch.Tensor | None] = {}
    outputs: list[torch.Tensor] = []

    def clock_for(tracker: tracker_module.Tracker, module: nn.Module, args: object, kwargs: object) -> object:
        seen[type(module).__name__] = first_tensor(args, kwargs)
        return tracker.cpu_clock

    monkeypatch.setattr(tracker_module.Tracker, "_clock_for", clock_for)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(tracker_module, "_PARKED", [])  # a parked tracker's hooks hold the unpatched function
    model = Model()
    model.proj.register_forward_hook(lambda module, args, output: outputs.append(output))
    for metrics in (None, ("shapes",)):  # timing only; a meter observing calls
        seen.clear()
        outputs.clear()
        with LayerProf(model, metrics=metrics) as prof:
            model(torch.randn(2, 4))
        assert prof.records["scale"].calls == 1
        assert seen["Scale"] is outputs[0], metrics  # Scale's only tensor: proj's output, passed as x=


@pytest.mark.parametrize("own_hook", [False, True], ids=["no hook of its own", "a hook of its own"])
@pytest.mark.parametrize("metrics", [("shapes",), None], ids=["a meter observing calls", "timing only"])
def test_a_global_hook_of_another_tool_runs_inside_the_call_and_one_that_raises_makes_it_raise(
        metrics: tuple[str, ...] | None, own_hook: bool) -> None:
    # Torch's global module hooks (another tool's) run inside torch's _call_impl, so inside each module's call:
    # where one raises after `first`'s forward returned, the call raised to its caller (the model catches the
    # error and goes on), and, like any forward that raised, is not a call of its module: its time stays in the
    # parent's own, and the later calls count.
    from torch.nn.modules import module as torch_module

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.second = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                return self.second(self.first(x))
            except LookupError:
                return self.second(x)

    model = Model()

    def refuse(module: nn.Module, args: object, output: object) -> None:
        if module is model.first and not refused:
            refused.append(module)
            raise LookupError("refused")

    refused: list[nn.Module] = []
    if own_hook:  # (then torch's except path calls our hook on the module with forward's output: not counted either)
        model.first.register_forward_hook(lambda module, args, output: None)
    handle = torch_module.register_module_forward_hook(refuse)
    try:
        with LayerProf(model, metrics=metrics) as prof:
            model(torch.randn(2, 4)).sum().backward()
            model(torch.randn(2, 4)).sum().backward()
    finally:
        handle.remove()
    assert refused == [model.first]
    # first: the second model call's only; second: one call each model call (on x, then on first's output).
    assert [(record.name, record.calls) for record in prof.tree] == [("", 2), ("first", 1), ("second", 2)]
    assert prof.records["first"].forward_ms > 0 and prof.records["first"].backward_ms > 0
    check_profile(prof, model)


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(TypeError, match="expects a torch.nn.Module, got builtins.str"):
        LayerProf("resnet18")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TorchScript"):
        LayerProf(torch.jit.script(nn.Linear(2, 2)))
    compiled = torch.compile(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=re.escape("LayerProf(compiled._orig_mod)")):
        LayerProf(compiled)
    with pytest.raises(ValueError, match="unknown metric"):
        LayerProf(nn.Linear(2, 2), metrics=("nope",))


def test_a_one_shot_block_writes_at_most_30_attributes_on_its_layerprof() -> None:
    # Past 30, CPython 3.11 keeps an instance's attributes in a dict of its own instead of compact values sharing
    # the class's keys: made and freed per block (LayerProf's class-level defaults keep it at 26).
    net = nn.Linear(2, 2)
    for _ in range(2):  # (the second block reuses the first one's plan)
        with LayerProf(net) as prof:
            net(torch.randn(1, 2)).sum().backward()
        assert len(vars(prof)) <= 30


def test_a_model_class_is_let_through_unchecked_only_once_it_passed_the_checks() -> None:
    # LayerProf keeps the classes of models that passed its checks (_PLAIN_MODELS): a refused model's class is not
    # kept, so that it is refused every time, and a subclass or a wrapper of a kept class is checked for itself.
    from layerprof.collect import profiler

    with LayerProf(nn.Linear(2, 2)) as prof:
        prof.model(torch.randn(1, 2)).sum().backward()
    assert nn.Linear in profiler._PLAIN_MODELS
    scripted, compiled = torch.jit.script(nn.Linear(2, 2)), torch.compile(nn.Linear(2, 2))
    for _ in range(2):
        with pytest.raises(TypeError, match="TorchScript"):
            LayerProf(scripted)
        with pytest.raises(TypeError, match=re.escape("LayerProf(compiled._orig_mod)")):
            LayerProf(compiled)
        with pytest.raises(TypeError, match="expects a torch.nn.Module, got builtins.str"):
            LayerProf("resnet18")  # type: ignore[arg-type]
    assert not {type(scripted), type(compiled), str} & profiler._PLAIN_MODELS


def test_results_before_exit_raise() -> None:
    model = MLP()
    with LayerProf(model) as prof:
        with pytest.raises(RuntimeError, match="after the `with"):
            prof.layerwise_summary()


def test_warns_when_the_model_never_ran() -> None:
    with pytest.warns(RuntimeWarning, match="recorded no step: call the model inside the block"):
        with LayerProf(MLP()):
            pass


def test_warns_when_every_step_that_ran_was_warm_up() -> None:
    model = MLP()
    # One step in the block, and warmup=2: the model ran, but in a step left out, which the warning says
    with pytest.warns(RuntimeWarning, match=r"the 1 step\(s\) that ran the model were all warm-up \(warmup=2\)"):
        with LayerProf(model, warmup=2) as prof:
            model(torch.randn(2, 8)).sum().backward()
    assert prof.profile.meta["steps"] == 0 and prof.profile.meta["steps_seen"] == 1


def test_warns_when_the_run_stopped_before_the_schedules_first_recorded_step() -> None:
    # A schedule's wait steps run without hooks, so no call of the model is seen there: the warning says the steps
    # were all outside the schedule (before: "call the model inside the block", though it ran in every step), and
    # not "warm-up (warmup=0)", advising to "lower warmup": a schedule takes no warmup= beside it.
    model = MLP()
    prof = LayerProf(model, schedule=schedule(wait=5, active=2, repeat=1)).start()
    for _ in range(3):  # the run ends (an early stop, a short epoch) before step 5
        model(torch.randn(2, 8)).sum().backward()
        prof.step()
    with pytest.warns(RuntimeWarning) as caught:
        prof.stop()
    assert [str(w.message) for w in caught] == [
        "LayerProf recorded no step: steps 0 to 3 (counted by prof.step()) were all before the schedule's first "
        "recorded step, step 5 (Schedule(wait=5, warmup=0, active=2, repeat=1, skip_first=0)). A step ends at "
        "prof.step() or at the end of the block: run more steps, or change the schedule."]
    assert prof.profile.meta["steps"] == 0 and prof.profile.meta["steps_seen"] == 0


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_reports_recompute(reentrant: bool) -> None:
    model = MLP()
    x = torch.randn(4, 8, requires_grad=True)
    with count_calls(model) as reference, LayerProf(model) as prof:
        hidden = checkpoint(model.body, x, use_reentrant=reentrant)
        model.head(hidden).sum().backward()
    body = prof.records["body"]
    # One real call each; the re-run during backward is recompute, not a second call.
    assert reference["body"] == 2 and body.calls == 1
    assert body.recompute_ms is not None and body.recompute_ms > 0
    assert [t.recompute for t in body.call_times] == [False, True]
    assert body.backward_ms is not None and body.backward_ms > 0
    for name in ("body.0", "body.2"):
        assert prof.records[name].calls == 1 and prof.records[name].backward_ms > 0
    assert "Recompute" in prof.layerwise_summary(columns=("forward", "backward", "recompute"))


def test_root_backward_is_close_to_backward_wall_time() -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)])
    x = torch.randn(64, 256)

    def measure() -> tuple[float, float]:
        with LayerProf(model) as prof:
            loss = model(x).sum()
            start = time.perf_counter()
            loss.backward()
            wall_ms = (time.perf_counter() - start) * 1e3
        return prof.tree.backward_ms, wall_ms

    # The root's backward runs from its first node's start to its last node's end, inside backward(): never more
    # than the wall time (every attempt), and most of it. A preemption before the first node or after the last
    # (the engine's start and end, outside the root) shrinks the share of that attempt only: retried.
    root, wall_ms = measured_until(5, measure, lambda found: found[0] >= 0.7 * found[1])
    assert root <= wall_ms
    assert root >= 0.7 * wall_ms, (root, wall_ms)


def test_cuda_events_and_sync_paths(cuda: torch.device) -> None:
    model = MLP().to(cuda)
    for sync in (False, True):
        with LayerProf(model, sync=sync) as prof:
            model(torch.randn(4, 8, device="cuda:0")).sum().backward()
        check_profile(prof, model)
        assert all(r.forward_ms > 0 and r.backward_ms > 0 for r in prof.records.values())


def test_a_caught_exception_keeps_no_tensor_alive() -> None:
    refs: list[weakref.ref] = []

    class MaybeBoom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            big = torch.empty(100, 100)
            refs.append(weakref.ref(big))
            if x.shape[0] > 4:
                raise RuntimeError("out of memory, retry smaller")
            return x

    model = nn.Sequential(nn.Linear(4, 4), MaybeBoom())
    with LayerProf(model) as prof:
        try:
            model(torch.randn(8, 4))
        except RuntimeError:
            pass
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            prof.step()
    gc.collect()
    assert refs and refs[0]() is None
    assert prof.records["1"].calls == 1 and prof.tree.steps == 2


def test_a_call_made_while_handling_an_exception_is_counted() -> None:
    class Logger(nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            return None

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.log = Logger()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                {}["missing"]
            except KeyError:
                self.log(x)  # returns None inside an except block: not a raise
            return self.fc(x)

    model = Net()
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    assert prof.records["log"].calls == 1 and prof.records["log"].forward_ms is not None
    assert prof.profile.meta["steps_seen"] == 1


def test_a_dropped_profile_is_freed_without_a_garbage_collection() -> None:
    # A record tree is a reference cycle (parent and children); the last Profile holding it breaks the cycle, so a
    # one-shot profile per step leaves nothing for the collector. A record held elsewhere keeps its tree whole.
    model = MLP()
    enabled = gc.isenabled()
    gc.disable()
    try:
        prof = profile_step(model, torch.randn(2, 8))
        records = [weakref.ref(record) for record in prof.tree]
        assert len(records) == 7  # root, body, body.0-3, head
        del prof
        assert [ref() for ref in records] == [None] * 7
        prof = profile_step(model, torch.randn(2, 8))
        held = prof.records["body.0"]
        del prof
        assert held.parent.name == "body" and held.parent.parent.name == "" and len(held.parent.children) == 4
        tree = profile_step(model, torch.randn(2, 8)).tree
        assert [record.name for record in tree] == ["", "body", "body.0", "body.1", "body.2", "body.3", "head"]
        selected = profile_step(model, torch.randn(2, 8)).select(type="Linear")
        assert [record.parent.name for record in selected] == ["body", "body", ""]
        # The records dict alone, or a view of it, keeps the tree whole too (no record is held by itself then).
        by_name = profile_step(model, torch.randn(2, 8)).profile.records
        assert [child.name for child in by_name["body"].children] == ["body.0", "body.1", "body.2", "body.3"]
        assert by_name["body.0"].parent is by_name["body"] and by_name[""].children[1].name == "head"
        values = profile_step(model, torch.randn(2, 8)).profile.records.values()
        assert [len(record.children) for record in values] == [2, 4, 0, 0, 0, 0, 0]
    finally:
        if enabled:
            gc.enable()


def test_a_dispatch_mode_of_yours_sees_the_same_ops_with_and_without_the_profiler() -> None:
    # The hooks make no tensor of their own inside your forward (the carrier of the graph-node hooks is made out of
    # sight of running modes), so a mode of yours counts the model's ops only.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(2, 4)
    with Ops() as plain:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    with Ops() as profiled, LayerProf(model) as prof:
        model(x).sum().backward()
    assert profiled.ops == plain.ops and len(plain.ops) > 10
    assert prof.records["0"].backward_ms > 0
