"""The checks every zoo model goes through (timm, transformers): a training step profiled under every meter that
changes nothing, and a half-budget checkpoint plan that measures as predicted."""
from __future__ import annotations

import socket
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from layerprof import LayerProf, verify_plan

from .conftest import hook_state
from .invariants import check_profile, check_truth, count_calls, parameter_modules_have_backward
from .models import scalar_loss

Step = Callable[[], "tuple[torch.Tensor, list[Any]]"]  # one training step: (loss, gradients)


def training_step(model: nn.Module, forward: Callable[[], Any]) -> Step:
    """A repeatable training step of ``model``: the loss of ``forward()``'s output (seeded: dropout draws the
    same), backpropagated from zeroed gradients; returns (loss, gradients)."""
    def step() -> tuple[torch.Tensor, list[Any]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = scalar_loss(forward())
        loss.backward()
        return loss.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    return step


def same_step(a: tuple[torch.Tensor, list[Any]], b: tuple[torch.Tensor, list[Any]]) -> bool:
    """Bitwise the same loss and gradients (None where a parameter got none)."""
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    return torch.equal(loss_a, loss_b) and len(grads_a) == len(grads_b) and all(
        (p is None and q is None) or (p is not None and q is not None and torch.equal(p, q))
        for p, q in zip(grads_a, grads_b))


def profiled_step_is_true(model: nn.Module, step: Step) -> tuple[LayerProf, tuple[torch.Tensor, list[Any]]]:
    """A plain step, then the same step under flops, memory and shapes: bitwise the same, nothing left on the
    model, the invariants, every module with its calls (checkpoint re-runs kept apart), every op priced. Returns
    the profile and the plain step's (loss, gradients)."""
    before_hooks, before_repr = hook_state(model), repr(model)
    plain = step()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "only one step was profiled")
        with count_calls(model) as reference, LayerProf(model, metrics=("flops", "memory", "shapes")) as prof:
            profiled = step()
    assert same_step(plain, profiled)
    assert hook_state(model) == before_hooks and repr(model) == before_repr
    check_profile(prof, model)
    check_truth(prof, model)
    parameter_modules_have_backward(prof, model)
    for name, record in prof.records.items():
        # The reference counts checkpoint re-runs too; layerprof keeps them apart from the calls.
        recomputed = sum(1 for timing in record.call_times if timing.recompute)
        assert record.calls + recomputed == reference[name], name
    assert prof.unknown_ops() == {}
    return prof, plain


def half_plan_measures_as_predicted(prof: LayerProf, model: nn.Module, step: Step,
                                    plain: tuple[torch.Tensor, list[Any]], allow_side_effects: bool,
                                    budget: float = 0.5) -> None:
    """A plan to half the saved bytes (or another ``budget``), applied and measured: exactly as predicted, within
    budget, the same step, nothing left on the model once removed."""
    before_hooks, before_repr = hook_state(model), repr(model)
    plan = prof.checkpoint_plan(budget, allow_side_effects=allow_side_effects)
    assert plan.feasible and plan.modules
    result = verify_plan(plan, model, step, repeats=1)
    assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after
    assert result.meets_budget and plan.saved_bytes_after <= plan.budget_bytes < prof.tree.saved_bytes
    with plan.applied(model):
        assert same_step(step(), plain)
    assert hook_state(model) == before_hooks and repr(model) == before_repr


def refuse_network(monkeypatch: pytest.MonkeyPatch, library: str) -> None:
    """Models built without weights download nothing: any connection the library or the Hub client tried fails
    the test."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a {library} test tried to reach the network: {args[-1]!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def flop_counter(model: nn.Module, forward: Callable[[], Any],
                 formulas: dict[Any, Any] | None = None) -> tuple[dict[str, int], int, int]:
    """FlopCounterMode over ``forward()`` and the backward of its output's loss: the forward FLOPs per module
    (qualified names, "" the model), the forward's total and the step's total. ``formulas``: its custom_mapping."""
    with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
        torch.manual_seed(1)
        out = forward()
        per_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
        forward_total = counter.get_total_flops()
        scalar_loss(out).backward()
    model.zero_grad(set_to_none=True)
    top = type(model).__name__
    return ({key[len(top) + 1:] if key != top else "": flops for key, flops in per_module.items()
             if key == top or key.startswith(top + ".")}, forward_total, counter.get_total_flops())
