"""The checkpoint planner on real models: each plan applied and measured with the memory meter.

One budget per model here (25 %, 50 % and 75 % rotate over the zoo) to keep the suite fast; the benchmark
(benchmarks/checkpoint_plan.py) runs every model at every budget at a larger size.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from layerprof import LayerProf

from .checkpoint_zoo import ZOO, zoo_step

pytest.importorskip("torchvision")
pytest.importorskip("transformers")

CASES = [("resnet50", 0.5), ("densenet121", 0.75), ("vit", 0.25), ("bert", 0.5), ("gpt2", 0.25), ("t5", 0.75),
         ("albert", 0.5)]


def _saved(model: torch.nn.Module, step) -> LayerProf:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory", "shapes")) as prof:
            step()
    return prof


def _state(model: torch.nn.Module) -> dict:
    return {name: (sorted(module.__dict__), dict(module._forward_hooks), dict(module._forward_pre_hooks))
            for name, module in model.named_modules()}


@pytest.mark.parametrize("name, budget", CASES)
def test_plan_meets_its_budget_as_measured(name: str, budget: float) -> None:
    model, step = zoo_step(name)
    allow = ZOO[name].allow_side_effects
    prof = _saved(model, step)
    before = _state(model)
    expected_out, expected_grads = step()
    plan = prof.checkpoint_plan(budget, allow_side_effects=allow)
    assert plan.feasible and plan.modules and plan.saved_bytes_after <= plan.budget_bytes
    with plan.applied(model):
        out, grads = step()
        measured = _saved(model, step).tree.saved_bytes
    assert torch.equal(out, expected_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads) if a is not None)
    assert measured <= plan.budget_bytes
    # Exact: the plan's figure is the profiled step's storages replayed with the plan's modules wrapped.
    assert measured == plan.saved_bytes_after
    assert _state(model) == before


def test_batchnorm_models_need_allow_side_effects() -> None:
    model, step = zoo_step("resnet50")
    plan = _saved(model, step).checkpoint_plan(0.5)
    # Every block holds a BatchNorm in training, and the stem's ReLU is in-place: nothing reaches half.
    assert not plan.feasible and "side effects" in plan.excluded["layer1.0"]
