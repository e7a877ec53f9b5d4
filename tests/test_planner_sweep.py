"""The checkpoint planner as a demanding user meets it: bugs found by a sweep, one test each."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import profile_quietly


def _mlp(depth: int = 3, width: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1), nn.Linear(width, width), nn.Tanh())
              for _ in range(depth)]
    return nn.Sequential(nn.Linear(16, width), *blocks, nn.Linear(width, 1))


def _profile(model: nn.Module, step, steps: int = 2) -> LayerProf:
    return profile_quietly(model, step, steps)


@pytest.mark.parametrize("runs", [False, True])
def test_the_wrapper_is_priced_on_the_calls_it_checkpoints_only(runs: bool) -> None:
    # A reference pass under no_grad (DPO, a teacher or EMA pass) calls every module twice a step, but a wrapper
    # called with gradients off calls the forward as it is, without the checkpoint's set-up: one wrapped call a
    # step costs the wrapper. Each module was priced at both calls, 2 ms for 1 here.
    model = _mlp()
    x = torch.randn(8, 16)

    def step() -> None:
        with torch.no_grad():
            model(x)
        model(x).sum().backward()

    plan = _profile(model, step).checkpoint_plan(0.5, wrap_cost=(1.0, 0.0), runs=runs)
    assert plan.chosen
    assert [chosen.wrap_ms for chosen in plan.chosen] == [1.0] * len(plan.chosen)


def test_hugging_faces_input_require_grads_hook_is_no_reason_to_warn() -> None:
    # gradient_checkpointing_enable() puts a forward hook on the input embeddings (make_inputs_require_grads:
    # output.requires_grad_(True), harmless run twice). Every plan around the embeddings of such a model warned to
    # take the hooks off, which would break the model's own checkpointing.
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable()
    assert model.transformer.wte._forward_hooks
    ids = torch.randint(0, 100, (2, 16))
    plan = _profile(model, lambda: model(input_ids=ids, labels=ids).loss.backward()).checkpoint_plan(
        0.01, wrap_cost=None)
    assert plan.modules == [""]  # the whole model, embeddings included
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with plan.applied(model):
            model(input_ids=ids, labels=ids).loss.backward()
    assert not [w for w in caught if "carry forward hooks" in str(w.message)]


def test_a_global_forward_hook_that_runs_again_warns() -> None:
    # torch.nn.modules.module.register_module_forward_hook: a hook on every module (an activation logger), which a
    # checkpoint runs again for each module inside a wrapped region, as a module's own hook. A module's hook
    # warned; a global one ran 33 times a step instead of 21, silently.
    model = _mlp()
    x = torch.randn(8, 16)
    plan = _profile(model, lambda: model(x).sum().backward()).checkpoint_plan(0.4, wrap_cost=None, runs=False)
    assert plan.modules
    calls: list[str] = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: calls.append("x"))
    try:
        with pytest.warns(UserWarning, match="forward hooks"):
            with plan.applied(model):
                pass
    finally:
        handle.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # without it: no warning
        with plan.applied(model):
            pass


def _evaluation_then_training() -> LayerProf:
    """3 steps profiled: an evaluation pass under no_grad (the memory meter's step), then two training steps."""
    model = _mlp()
    x = torch.randn(8, 16)
    steps = iter([True, False, False])

    def step() -> None:
        if next(steps):
            with torch.no_grad():
                model(x)
        else:
            model(x).sum().backward()

    return _profile(model, step, steps=3)


def test_a_first_step_without_backward_is_named_as_the_memory_meters_step() -> None:
    # The memory meter counts the first profiled step. An evaluation pass under no_grad first, then training
    # steps: the plan said "the profiled step saved nothing for backward (was its forward run under torch.no_grad
    # or inference_mode?)" of a profile whose steps ran backward, naming no step.
    plan = _evaluation_then_training().checkpoint_plan(0.5)
    assert plan.modules == [] and "the memory meter's step (the first profiled)" in plan.note
    assert "later steps ran backward" in plan.note


@pytest.mark.parametrize("steps", [2, 3])
def test_an_empty_batch_is_not_taken_for_an_evaluation_step(steps: int) -> None:
    # A training step on a batch of 0 ran its forward with gradients on and its backward, and saved 0 bytes: the
    # plan asked whether the forward ran under torch.no_grad (2 steps) or whether the memory meter's step was an
    # evaluation step (3 steps), neither of which it was.
    model = _mlp()
    x = torch.randn(0, 16)
    prof = profile_quietly(model, lambda: model(x).sum().backward(), steps)
    assert prof.tree.saved_bytes == 0 and prof.tree.backward_ms > 0
    plan = prof.checkpoint_plan(0.5)
    assert plan.modules == [] and plan.feasible
    assert plan.note.startswith("the profiled step ran its forward with gradients on and a backward, yet saved "
                                "nothing for it (were its tensors empty, a batch of 0")


def test_a_profile_without_the_no_grad_count_is_not_said_to_have_run_with_gradients_on() -> None:
    # An older file holds no count of the memory meter's calls under no_grad (None): the note for a batch of 0 read
    # that unknown as 0 and told an evaluation step first, then training steps, that its forward "ran with gradients
    # on", where before it asked whether that step was an evaluation step, as it was.
    profile = _evaluation_then_training().profile
    profile.tree.checkpoint_no_grad_calls = None  # (what a file saved before the count was kept reads as)
    plan = profile.checkpoint_plan(0.5)
    assert plan.modules == [] and "gradients on" not in plan.note
    assert "the memory meter's step (the first profiled)" in plan.note
