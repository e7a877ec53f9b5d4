"""The checkpoint planner as a training script uses it: profiled in one process (or saved and loaded), planned and
applied in another on a freshly built model. Bugs found by a sweep of such use, each with its test."""
from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof.plan.apply import is_wrapped

from .conftest import profile_quietly
from .ranks import run_ranks


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64)),
                         nn.Dropout(0.5), nn.Linear(64, 1))


def _plan_of(model: nn.Module, x: torch.Tensor, budget: str = "50%") -> layerprof.CheckpointPlan:
    prof = profile_quietly(model, lambda: model(x).sum().backward(), 2)
    saved = layerprof.loads(prof.profile.to_json())  # (what a training script loads: the mode survives the file)
    return saved.checkpoint_plan(budget, wrap_cost=None, runs=False)


def _apply_warnings(plan: layerprof.CheckpointPlan, model: nn.Module, before_step: Any = None) -> list[str]:
    """The warnings of applying ``plan`` to ``model`` and running two training steps (``before_step(model)`` first:
    what a trainer does after the plan is applied)."""
    x = torch.randn(32, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with plan.applied(model):
            if before_step is not None:
                before_step(model)
            for _ in range(2):
                model(x.to(next(model.parameters()).dtype)).sum().backward()
    return [str(w.message) for w in caught]


def test_a_plan_made_on_a_profile_in_eval_mode_warns_when_applied_to_a_model_in_training() -> None:
    # Profiled in eval mode (Dropout saves nothing), trained in training mode: the plan's bytes were not the
    # model's, and it missed its budget without a word (verify_plan measured more than predicted).
    x = torch.randn(32, 16)
    plan = _plan_of(_net().eval(), x)
    assert plan.modules
    model = _net().train()
    found = [m for m in _apply_warnings(plan, model) if "eval mode" in m]
    assert len(found) == 1 and "training mode" in found[0] and "Plan on a profile of a step in the mode" in found[0]
    found = _apply_warnings(_plan_of(_net().train(), x), _net().eval())  # (a step with gradients on, in eval mode)
    assert len(found) == 1 and "runs in eval mode" in found[0] and "Call model.train() before the step" in found[0]
    trained = _plan_of(model, x)  # (what the warning is for: in training the step saves the Dropout's mask too)
    assert trained.saved_bytes_before > plan.saved_bytes_before
    # The mode it was profiled in: no warning.
    assert not [m for m in _apply_warnings(plan, _net().eval()) if "mode" in m]


def test_the_mode_is_checked_in_the_step_not_as_the_plan_is_applied() -> None:
    # A model from from_pretrained is in eval mode when the plan is applied, and the trainer calls model.train()
    # before its first step: the mode the step runs in is the one that counts. A model cast after apply (Lightning's
    # "bf16-true") is checked there too, and the check runs once per apply.
    x = torch.randn(32, 16)
    plan = _plan_of(_net().train(), x)
    assert plan.profiled_as == {"training": True, "dtype": "float32", "autocast": False,
                                "batch_size": 32}
    assert not [m for m in _apply_warnings(plan, _net().eval(), lambda model: model.train()) if "mode" in m]
    found = _apply_warnings(plan, _net().train(), lambda model: model.to(torch.bfloat16))
    assert len(found) == 1 and found[0].startswith("checkpoint plan: this Sequential's parameters are bfloat16")
    evaluated = _net().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad(), plan.applied(evaluated):  # (an evaluation pass: no step, no check)
            evaluated(x)


def test_a_plan_made_on_a_float32_profile_warns_when_applied_to_a_bfloat16_model() -> None:
    x = torch.randn(32, 16)
    plan = _plan_of(_net().eval(), x)
    found = [m for m in _apply_warnings(plan, _net().eval().to(torch.bfloat16)) if "dtype" in m]
    assert len(found) == 1 and "bfloat16" in found[0] and "float32" in found[0]
    assert not [m for m in _apply_warnings(plan, _net().eval()) if "dtype" in m]


def test_a_plan_of_an_older_profile_without_the_mode_applies_without_a_warning() -> None:
    model, x = _net().train(), torch.randn(32, 16)
    prof = profile_quietly(model, lambda: model(x).sum().backward(), 2)
    profile = prof.profile
    profile.meta.get("memory", {}).pop("training", None)
    profile.meta.get("memory", {}).pop("dtype", None)
    profile.meta.get("environment", {}).pop("dtype", None)
    plan = profile.checkpoint_plan("50%", wrap_cost=None, runs=False)
    assert not [m for m in _apply_warnings(plan, _net().eval().double()) if "mode" in m or "dtype" in m]


@pytest.mark.parametrize("training", [True, False])
def test_the_memory_meter_keeps_the_mode_the_step_ran_in(training: bool) -> None:
    model, x = _net().train(training), torch.randn(8, 16)
    prof = profile_quietly(model, lambda: model(x).sum().backward(), 1)
    assert prof.profile.meta["memory"]["training"] is training


def test_a_frozen_model_that_saved_nothing_is_told_apart_from_one_run_under_no_grad() -> None:
    # Only a head outside the model trains (every parameter of the model frozen, its input needing no grad): with
    # gradients on, autograd saves nothing in it. The plan asked whether its forward ran under torch.no_grad.
    model, head, x = _net().requires_grad_(False), nn.Linear(1, 1), torch.randn(8, 16)
    frozen = profile_quietly(model, lambda: head(model(x)).sum().backward(), 2)
    plan = frozen.checkpoint_plan("50%", wrap_cost=None)
    assert plan.modules == [] and plan.saved_bytes_before == 0
    assert "no_grad" not in plan.note and "requires_grad" in plan.note and "frozen" in plan.note
    assert layerprof.loads(frozen.profile.to_json()).checkpoint_plan("50%", wrap_cost=None).note == plan.note

    trained = _net()

    def evaluation() -> None:
        with torch.no_grad():
            trained(x)

    under_no_grad = profile_quietly(trained, evaluation, 1).checkpoint_plan("50%", wrap_cost=None)
    assert "torch.no_grad" in under_no_grad.note and "frozen" not in under_no_grad.note


def test_a_plan_verifies_itself_and_its_verification_prints_as_text() -> None:
    # plan.verify(model, step) was an AttributeError (only layerprof.verify_plan(plan, model, step) existed), and
    # print(result) gave a dataclass repr of 15 fields on one line, where the command line prints text.
    model, x = _net().train(), torch.randn(32, 16)
    plan = _plan_of(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = plan.verify(model, lambda: model(x).sum().backward(), repeats=1)
    assert isinstance(result, layerprof.Verification) and not plan.is_applied
    assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after
    text = str(result)
    assert text.startswith("verified: saved ") and ", budget met; step " in text
    assert repr(result).startswith("Verification(predicted_saved_bytes=")
    # As a notebook cell's last value, IPython shows the text (it showed the ~470-character repr).
    pretty = pytest.importorskip("IPython.lib.pretty")
    assert pretty.pretty(result) == text


def _stack() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64)), nn.Tanh(),
                         nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64)), nn.Linear(64, 1))


@pytest.mark.parametrize("runs", [False, True])
def test_a_model_compiled_with_a_plan_applied_traces_its_checkpoints_whole(runs: bool) -> None:
    # plan.apply(model); torch.compile(model): the wrapper counted its runs in a list outside the checkpointed
    # function (a side effect dynamo refuses inside a checkpoint), so every wrapped region broke the graph, and
    # fullgraph=True failed with "Unsupported HOP: Unsafe side effect".
    x = torch.randn(32, 16)
    reference, model, compiled = _stack(), _stack(), _stack()
    reference(x).sum().backward()
    prof = profile_quietly(model, lambda: model(x).sum().backward(), 2)
    plan = prof.checkpoint_plan("40%", wrap_cost=None, runs=runs)
    assert plan.modules
    torch._dynamo.reset()
    try:
        with plan.applied(compiled):
            torch.compile(compiled, backend="eager", fullgraph=True)(x).sum().backward()
    finally:
        torch._dynamo.reset()
    for ours, theirs in zip(compiled.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_verifying_a_plan_on_a_step_that_accumulates_micro_batches_measures_one_at_a_time() -> None:
    # Profiled on one micro-batch (as the planner asks), verified on the training step of 4 accumulated: the
    # verification summed the 4 forwards' saved bytes, never held at once, and said "saved 40 KiB measured against
    # 10 KiB predicted (+300.0%), budget NOT met".
    model, xs = _stack(), [torch.randn(32, 16) for _ in range(4)]
    prof = profile_quietly(model, lambda: model(xs[0]).sum().backward(), 2)
    plan = prof.checkpoint_plan("50%", wrap_cost=None)

    def accumulated() -> None:
        for x in xs:
            (model(x).sum() / len(xs)).backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = plan.verify(model, accumulated, repeats=1)
    assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after
    assert result.meets_budget


def _mixed_precision_worker(rank: int) -> dict[str, Any]:
    """Profile an FSDP2 model with a bfloat16 MixedPrecisionPolicy, plan, apply the plan to the same model sharded
    the same way and run a step: the dtype check's warnings, and the dtype the plan keeps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (1,))

    def sharded() -> nn.Module:
        model = _stack()
        for unit in (model[1], model[3], model):
            fully_shard(unit, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        return model

    x, model = torch.randn(32, 16), sharded()
    prof = profile_quietly(model, lambda: model(x).sum().backward(), 2)
    plan = layerprof.loads(prof.profile.to_json()).checkpoint_plan("50%", wrap_cost=None, runs=False)
    found = _apply_warnings(plan, sharded())
    return {"modules": plan.modules, "profiled_as": plan.profiled_as,
            "warnings": [text for text in found if text.startswith("checkpoint plan")]}


def test_fsdp2_mixed_precision_is_the_dtype_of_the_step_on_both_sides(tmp_path: Any) -> None:
    # FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16) keeps float32 shards at rest and puts bfloat16 unsharded
    # parameters on the modules while they run. The profile's dtype was read at rest (float32), the plan's check in
    # the first wrapped call, inside the forward (bfloat16): the same model, sharded the same way, was told its
    # parameters were bfloat16 where the profiled model's were float32. Both now read the dtype the step ran in.
    result = run_ranks(_mixed_precision_worker, tmp_path, world_size=1)[0]
    assert result["modules"]
    assert result["profiled_as"] == {"training": True, "dtype": "bfloat16", "autocast": False,
                                     "batch_size": 32}
    assert result["warnings"] == []


def test_verifying_on_a_step_mixing_held_and_accumulated_forwards_refuses_before_timing_it() -> None:
    # Two forwards held together, then a third after their backward: neither one micro-batch's bytes nor a sum held
    # at once. The ValueError came only after the 2 * repeats timed steps had run (the plan taken off meanwhile); it
    # had no test.
    model, xs = _stack(), [torch.randn(32, 16) for _ in range(3)]
    prof = profile_quietly(model, lambda: model(xs[0]).sum().backward(), 2)
    plan = prof.checkpoint_plan("50%", wrap_cost=None)
    calls = []

    def mixed() -> None:
        calls.append(1)
        (model(xs[0]).sum() + model(xs[1]).sum()).backward()
        model(xs[2]).sum().backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="3 forwards that saved for backward, 1 of them after every earlier"):
            plan.verify(model, mixed, repeats=3)
    assert not plan.is_applied and not any(map(is_wrapped, model.modules()))
    assert len(calls) == 1  # the profiled step only: nothing timed for a verification that cannot be made


def test_the_mode_kept_is_the_one_the_step_saved_in_not_the_one_the_block_ended_in() -> None:
    # One profiled step that trains, then evaluates (model.eval(), no_grad) before the block ends: the meter kept
    # the mode as it stopped, eval, and the plan of this training step told the same model, training, that it was
    # profiled in eval mode. What the step saved was saved in training mode.
    model, x = _net().train(), torch.randn(32, 16)

    def train_then_evaluate() -> None:
        model.train()
        model(x).sum().backward()
        model.eval()
        with torch.no_grad():
            model(x)

    prof = profile_quietly(model, train_then_evaluate, 1)
    assert prof.profile.meta["memory"]["training"] is True
    plan = prof.checkpoint_plan("50%", wrap_cost=None, runs=False)
    assert not [m for m in _apply_warnings(plan, _net().train()) if "mode" in m]
