"""Second reading of the sweep's commits (3a6b566..931984e): one test per problem found."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf
from layerprof.plan.wrap_cost import WrapCost

from .conftest import profile_quietly


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(3)]
    return nn.Sequential(nn.Linear(16, 64), *blocks, nn.Linear(64, 1))


def _profile(model: nn.Module, step, steps: int = 2) -> LayerProf:
    return profile_quietly(model, step, steps)


# Back to back (a gap under 1,000 s) a wrapper costs nothing; cold, 1 ms a call.
_WARM_WHEN_CLOSE = WrapCost(1.0, 0.0, "given", ((1e6, 1e6, 0.0), (2e6, 2e6, 1.0)))


def test_a_call_under_no_grad_warms_no_wrapper_in_the_gap_pricing() -> None:
    # grad_calls prices the wrapper on the calls made with gradients on only (a wrapper called under no_grad runs
    # the forward as it is, no checkpoint set-up), but gaps.py still took every call of the last step as a wrapped
    # call: the reference pass's call of the model under no_grad, just before the training call, made that call
    # "warm" (0.75 ms instead of 1: its only checkpointed call is cold), and its own saving was averaged in.
    model = _mlp()
    x = torch.randn(8, 16)

    def step() -> None:
        with torch.no_grad():
            model(x)
        model(x).sum().backward()

    plan = _profile(model, step).checkpoint_plan(0.5, wrap_cost=_WARM_WHEN_CLOSE, runs=False)
    assert plan.modules == [""]
    assert plan.chosen[0].wrap_ms == pytest.approx(1.0)
    assert plan.extra_ms == pytest.approx(plan.cold_extra_ms)


def test_an_evaluation_step_first_then_one_training_step_is_named_as_the_memory_meters_step() -> None:
    # 4ce838c's note asked for root.steps > 1; with the memory meter the first step is left out of the timings, so
    # an evaluation pass then one training step (2 steps, as the plan's own doctest profiles) holds steps == 1 and
    # got the old note, "was its forward run under torch.no_grad?", of a profile whose timed step ran backward.
    model = _mlp()
    x = torch.randn(8, 16)
    steps = iter([True, False])

    def step() -> None:
        if next(steps):
            with torch.no_grad():
                model(x)
        else:
            model(x).sum().backward()

    prof = _profile(model, step, steps=2)
    assert prof.tree.steps == 1 and prof.tree.backward_ms
    plan = prof.checkpoint_plan(0.5)
    assert plan.modules == [] and "the memory meter's step (the first profiled)" in plan.note


def test_a_single_step_under_no_grad_keeps_the_no_grad_note() -> None:
    # (the other side of the note: one step, forward only under no_grad)
    model = _mlp()
    x = torch.randn(8, 16)

    def step() -> None:
        with torch.no_grad():
            model(x)

    plan = _profile(model, step, steps=1).checkpoint_plan(0.5)
    assert plan.modules == [] and "was its forward run under torch.no_grad" in plan.note


def test_plotting_backward_flops_without_the_flops_meter_still_names_the_meter() -> None:
    # dba2ba8: "this profile has no backward pass: call .backward() inside the block" replaced the meter's hint
    # whenever the profile had no backward, though its comment says "its meter ran": a forward-only profile without
    # the flops meter was told only to run backward, after which the plot failed again for the meter.
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with LayerProf(net) as prof:
        with torch.no_grad():
            net(torch.randn(2, 4))
    with pytest.raises(ValueError) as info:
        prof.plot("sunburst", metric="flops_backward")
    assert "metrics=('flops',)" in str(info.value)


class _CheckpointedAux(nn.Module):
    """A body run every step and an auxiliary head, checkpointed by the model itself, run only in some steps."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.aux = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor, with_aux: bool) -> torch.Tensor:
        h = self.body(x)
        if not with_aux:
            return h.sum()
        return h.sum() + torch.utils.checkpoint.checkpoint(self.aux, h, use_reentrant=False).sum()


def test_a_module_the_model_checkpoints_stays_already_recomputed_when_it_skipped_the_last_step() -> None:
    # fcdbdf3 keeps no call timings of a module that skipped the last recorded step; the planner's
    # outermost_recomputed reads them (a call with recompute) to name the modules the model checkpoints itself.
    # `aux`, checkpointed by the model and re-run in the timed step 1, skipped step 2: already_recomputed lost it
    # ([] against ['aux'] before fcdbdf3, and ['aux'] where it ran in the last step too), and with it the note
    # that a wrapper around it nests checkpoints.
    torch.manual_seed(0)
    net = _CheckpointedAux()
    x = torch.randn(8, 16)
    pattern = iter([True, True, False])
    prof = _profile(net, lambda: net(x, next(pattern)).backward(), steps=3)
    assert prof.records["aux"].steps_run == 1 and prof.records["aux"].recompute_ms
    assert prof.checkpoint_plan(0.5, wrap_cost=None).already_recomputed == ["aux"]
