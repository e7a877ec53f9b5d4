"""The profiled loop: warm-up and measured steps of forward (and backward) on the model, with a progress bar."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from .._tensors import loss_of as _loss_of
from ..profile import Profile
from ..collect.compiled import RefusedModel
from ..collect.profiler import LayerProf
from ..metrics import make_meters
from ..render.progress import progress
from .errors import RunError, UsageError, one_line
from .inputs import parse_dtype

__all__ = ["loss_of", "run_profile", "training_step", "progress", "metering_meters", "autocast_in",
           "autocast_step"]

# The dtypes ``torch.autocast`` computes in.
_AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


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


def autocast_in(text: str, model_dtype: torch.dtype | None, device: torch.device) -> torch.dtype:
    """``--autocast TEXT``'s dtype, checked before the model is built: one that autocast computes in, over a float32
    model (autocast casts a float32 model's ops as they run; a model that ``--dtype`` cast has nothing left to
    cast), on a device that autocast runs on; else a UsageError."""
    dtype = parse_dtype(text, "--autocast")
    name = str(dtype).replace("torch.", "")
    if dtype not in _AUTOCAST_DTYPES:
        raise UsageError(f"--autocast {text}: torch.autocast computes in bfloat16 or float16 (the model stays "
                         "float32); give one of them")
    if model_dtype is not None and model_dtype != torch.float32:
        cast = str(model_dtype).replace("torch.", "")
        raise UsageError(f"--autocast {text} with --dtype {cast}: autocast runs a float32 model's matrix products in "
                         f"{name} as they run, --dtype casts the whole model; give --autocast for mixed precision, "
                         "--dtype for a model trained in one dtype")
    if not torch.amp.is_autocast_available(device.type):
        raise UsageError(f"--autocast {text}: torch.autocast does not run on {device.type}; use --device cpu or cuda")
    return dtype


def autocast_step(device: torch.device, dtype: torch.dtype | None) -> Callable[[], ContextManager[Any]]:
    """What each step's forward runs in: ``torch.autocast`` for ``device`` in ``dtype`` (the forward and the loss
    inside, backward outside, as a mixed-precision script runs them), nothing where ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device.type, dtype=dtype)


def training_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  precision: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
    """The command's training step, profiled and verified alike: forward (inside ``precision()``, ``autocast_step``),
    then the backward of ``loss_of(output)`` with the output held until it ends (as a training loop's variable holds
    it: what the step's peak holds), gradients cleared."""
    with precision():
        output = model(*args, **kwargs)
    loss_of(output).backward()
    model.zero_grad(set_to_none=True)
    del output


def run_profile(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, steps: int, warmup: int,
                backward: bool, inference: bool, metrics: list[str] | None, sync: bool = False,
                show_progress: bool | None = None, untimed: bool = False,
                precision: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> Profile:
    """Run ``warmup + steps`` steps under LayerProf (one more for the meters without a warm-up step:
    ``metering_meters``, unless ``untimed``: on the meta device, whose steps have no times to keep clean),
    calling ``prof.step()`` between them; returns the Profile.

    ``inference``: ``model.eval()`` and ``torch.inference_mode()``, forward only. Otherwise the model trains:
    forward, and with ``backward`` the backward of ``loss_of(output)``, gradients cleared after each step.
    ``precision``: what every forward runs inside (``autocast_step``).
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
                    training_step(model, args, kwargs, precision)
                else:
                    with precision():
                        model(*args, **kwargs)
                if step < total - 1:  # the `with` exit ends the last step
                    prof.step()
    except RunError:
        raise
    except Exception as exc:
        raise RunError(f"the model raised {one_line(exc)}") from exc
    return prof.profile
