"""The checkpoint wrapper's own cost in a plan: saved tensors counted per module, the cost measured and priced."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof.plan.wrap_cost import WrapCost, wrap_cost
from tests.test_checkpoint_bytes import _profile


def test_saved_tensors_are_counted_per_module() -> None:
    net = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    records = _profile(net, torch.randn(2, 8)).profile.records
    # Linear 0: x needs no grad, so addmm saves only x (for the weight's gradient): 1. ReLU: its result: 1.
    # Linear 2: its input (for the weight's gradient) and its weight (for the input's gradient): 2. The root: 4.
    assert [records[name].checkpoint_saved_tensors for name in ("0", "1", "2", "")] == [1, 1, 2, 4]


def test_shared_module_counts_every_call() -> None:
    layer = nn.Linear(4, 4)
    net = nn.Sequential(nn.Linear(4, 4), layer, nn.Tanh(), layer)
    records = _profile(net, torch.randn(2, 4)).profile.records
    # layer, called twice with inputs that need grad: 2 tensors a call (input, weight). Tanh: its result.
    # Linear 0: x only. The root: 1 + 2 + 1 + 2.
    assert records["1"].calls == 2 and records["1"].checkpoint_saved_tensors == 4
    assert records[""].checkpoint_saved_tensors == 6


def _blocks(count: int = 4, width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(count)))


def test_the_plan_prices_each_wrapper_and_the_choice_follows() -> None:
    model = _blocks()
    prof = _profile(model, torch.randn(4, 32, requires_grad=True))
    records = prof.profile.records
    cost = WrapCost(per_call_ms=1.0, per_tensor_ms=0.5)
    plan = prof.checkpoint_plan(0.25, wrap_cost=cost)
    assert plan.wrap_cost is cost and plan.feasible
    for chosen in plan.chosen:
        record = records[chosen.name]
        # one call a step: 1 ms, plus 0.5 ms for each tensor saved inside it
        assert chosen.wrap_ms == pytest.approx(1.0 * record.calls + 0.5 * record.checkpoint_saved_tensors)
        assert chosen.cost_ms == pytest.approx(chosen.recompute_ms + chosen.wrap_ms)
    assert plan.extra_ms == pytest.approx(sum(c.recompute_ms + c.wrap_ms for c in plan.chosen))
    # A wrapper dear enough per call: one wrapper over the whole model beats one per block.
    dear = prof.checkpoint_plan(0.25, wrap_cost=(1000.0, 0.0))
    assert dear.modules == [""]
    # No wrapper cost: recompute time alone, as the planner counted before.
    bare = prof.checkpoint_plan(0.25, wrap_cost=None)
    assert bare.wrap_cost is None and all(c.wrap_ms == 0 for c in bare.chosen)
    assert bare.extra_ms == pytest.approx(sum(c.recompute_ms for c in bare.chosen))
    assert plan.to_dict()["chosen"][0]["wrap_ms"] == plan.chosen[0].wrap_ms


def test_measured_cost_is_positive_and_cached() -> None:
    first = wrap_cost()
    assert first.source == "measured" and first.per_call_ms > 0 and first.per_tensor_ms > 0
    assert wrap_cost() is first


@pytest.mark.parametrize("bad", ["fast", (1.0,), (-1.0, 0.0), (float("nan"), 0.0), (True, 0.0), 3.0])
def test_bad_wrap_cost_is_refused(bad) -> None:
    prof = _profile(_blocks(2), torch.randn(2, 32))
    with pytest.raises(ValueError, match="wrap_cost must be 'measured', None"):
        prof.checkpoint_plan(0.5, wrap_cost=bad)
