"""Second reading of the commits 9840e31..7ac4253 (and the plan's copy, 8cea2cd): one test per problem found."""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from layerprof import LayerProf

from .conftest import profile_quietly


def _profile(model: nn.Module, step, steps: int = 3) -> LayerProf:
    return profile_quietly(model, step, steps)


class _LayerDrop(nn.Module):
    """Layers the model checkpoints one by one, one of them dropped in some steps (LayerDrop)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64)) for _ in range(4))

    def forward(self, h: torch.Tensor, dropped: int | None) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            if index != dropped:
                h = checkpoint(layer, h, use_reentrant=False)
        return h


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.drop, self.head = nn.Linear(16, 64), _LayerDrop(), nn.Linear(64, 1)

    def forward(self, x: torch.Tensor, dropped: int | None) -> torch.Tensor:
        return self.head(self.drop(self.inp(x), dropped)).sum()


def test_layers_checkpointed_one_by_one_are_named_when_one_skipped_the_last_step() -> None:
    # 317aeb7 reads the calls of a module that skipped the last step from the last step it ran in; _rerun_together
    # then compared the children's first forward and first recomputation in the earliest step any of them re-ran
    # in, where only the dropped layer had calls: it was first both ways, and the encoder, never checkpointed as a
    # whole, read as re-run as one forward (['drop'] instead of its four layers).
    torch.manual_seed(0)
    net, x = _Encoder(), torch.randn(8, 16)
    dropped = iter([None, None, 3])
    prof = _profile(net, lambda: net(x, next(dropped)).backward())
    assert prof.records["drop.layers.3"].steps_run == 1 and prof.records["drop.layers.0"].steps_run == 2
    plan = prof.checkpoint_plan(0.5, wrap_cost=None)
    assert plan.already_recomputed == [f"drop.layers.{i}" for i in range(4)]


class _Holder(nn.Module):
    """A module that keeps its net's checkpoint plan (a LightningModule with ``self.plan``)."""

    def __init__(self, net: nn.Module, plan) -> None:
        super().__init__()
        self.net, self.plan = net, plan


def test_a_plan_copied_with_its_model_removes_the_copys_wrappers() -> None:
    # 8cea2cd: a plan pickled or deep-copied while applied reads not applied. Copied together with the model it is
    # applied to (an EMA deepcopy of a module that keeps its plan, torch.save of it), the copy's plan could remove()
    # the copy's wrappers before (its modules were the copy's, by the copy's memo); now it reads not applied,
    # remove() leaves the copy wrapped, and apply() on the copy refuses ("already wrapped").
    import copy
    import pickle

    from layerprof.plan.apply import is_wrapped

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), *(nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(3)),
                        nn.Linear(64, 1))
    x = torch.randn(8, 16)
    prof = _profile(net, lambda: net(x).sum().backward(), steps=1)
    plan = prof.checkpoint_plan(0.5, runs=False, wrap_cost=None)
    holder = _Holder(net, plan)
    with plan.applied(net):
        copies = [copy.deepcopy(holder), pickle.loads(pickle.dumps(holder))]
    for other in copies:
        assert any(is_wrapped(module) for module in other.net.modules())
        assert other.plan.is_applied
        other.plan.remove()
        assert not any(is_wrapped(module) for module in other.net.modules())


def test_compare_of_a_backward_field_a_forward_only_profile_lacks_names_the_backward_not_the_meter() -> None:
    # ab2ff12: module_fields=("flops_backward",) against a forward-only profile that ran the flops meter said to run
    # with metrics=('flops',), which it did: the hint that does not record it. It lacks the backward pass.
    import re

    import pytest

    import layerprof

    def profiled(backward: bool) -> LayerProf:
        torch.manual_seed(0)
        net, x = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)), torch.randn(8, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LayerProf(net, metrics=("flops",)) as prof:
                out = net(x).sum()
                if backward:
                    out.backward()
        return prof

    trained, forward_only = profiled(True), profiled(False)
    with pytest.raises(ValueError) as info:
        layerprof.compare(trained, forward_only, module_fields=("flops_backward",))
    message = str(info.value)
    assert "'flops_backward' was recorded by profile 'a' but not by 'b'" in message
    assert "metrics=('flops',)" not in message and re.search(r"no backward pass.*\.backward\(\)", message), message
