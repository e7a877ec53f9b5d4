"""The profiled loop: warm-up and measured steps of forward (and backward) on the model, with a progress bar."""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .._tensors import loss_of as _loss_of
from ..profile import Profile
from ..collect.compiled import RefusedModel
from ..collect.profiler import LayerProf
from ..metrics import make_meters
from ..render.progress import progress
from .errors import RunError, UsageError, one_line

__all__ = ["loss_of", "run_profile", "training_step", "progress", "metering_meters"]


def loss_of(output: Any) -> torch.Tensor:
    """What backward starts from (``_tensors.loss_of``); a run error when the output has nothing to backpropagate."""
    loss = _loss_of(output)
    if loss is None:
        raise RunError(
            "the model's output holds no floating tensor that requires grad, so there is nothing to "
            "backpropagate: profile the forward pass only with --no-backward or --eval"
        )
    return loss


def metering_meters(metrics: list[str] | None, warmup: int) -> list[str]:
    """The meters that need a step of their own: those that slow a step down (flops, memory...) count in the
    first profiled step, which the profile then leaves out of its times. A warm-up step serves; with ``--warmup
    0`` one more step runs for them, so that ``--steps N`` still gives N timed steps (else N - 1)."""
    if warmup:
        return []
    return [meter.name for meter in make_meters(metrics) if meter.distorts_timing]


def training_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The command's training step, profiled and verified alike: forward, then the backward of
    ``loss_of(output)`` with the output held until it ends (as a training loop's variable holds it: what the step's
    peak holds), gradients cleared."""
    output = model(*args, **kwargs)
    loss_of(output).backward()
    model.zero_grad(set_to_none=True)
    del output


def run_profile(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, steps: int, warmup: int,
                backward: bool, inference: bool, metrics: list[str] | None, sync: bool = False,
                show_progress: bool | None = None, untimed: bool = False) -> Profile:
    """Run ``warmup + steps`` steps under LayerProf (one more for the meters without a warm-up step:
    ``metering_meters``, unless ``untimed``: on the meta device, whose steps have no times to keep clean),
    calling ``prof.step()`` between them; returns the Profile.

    ``inference``: ``model.eval()`` and ``torch.inference_mode()``, forward only. Otherwise the model trains:
    forward, and with ``backward`` the backward of ``loss_of(output)``, gradients cleared after each step.
    """
    model.train(not inference)
    total = warmup + steps + (not untimed and bool(metering_meters(metrics, warmup)))
    grad_mode = torch.inference_mode() if inference else contextlib.nullcontext()
    try:
        prof = LayerProf(model, warmup=warmup, metrics=metrics, sync=sync)
    except RefusedModel as exc:  # (torch.compile'd, TorchScript): the spec's; another TypeError is a bug
        raise UsageError(f"{exc}") from exc
    try:
        with grad_mode, prof:
            for step in progress(range(total), total, show_progress):
                if backward and not inference:
                    training_step(model, args, kwargs)
                else:
                    model(*args, **kwargs)
                if step < total - 1:  # the `with` exit ends the last step
                    prof.step()
    except RunError:
        raise
    except Exception as exc:
        raise RunError(f"the model raised {one_line(exc)}") from exc
    return prof.profile
