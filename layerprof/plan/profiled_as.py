"""What a plan's profile ran the model as, and where a model the plan is applied to differs.

Three settings change what a model's modules save for backward without changing its structure: its mode
(Dropout saves its mask in training only, BatchNorm its batch statistics), its parameters' dtype (what a step
saves is in that dtype) and the step's ``torch.autocast`` (a matrix product saves copies in autocast's dtype). A
training script that profiles in one process and plans in another builds the model again, and a model built for
evaluation (``model.eval()``), cast afterwards (``model.to(torch.bfloat16)``) or trained under autocast takes the
plan silently while its predicted bytes are another model's: a plan made in eval mode missed its budget in
training by the masks it never counted, and one made on a float32 step missed its budget under bfloat16 autocast
(GPT-2: 780,036 bytes saved against 668,420 predicted). So the plan keeps the profile's mode, dtype and autocast,
and the first wrapped call with gradients on after ``apply`` warns where the step then differs (``FirstCall``):
not ``apply`` itself, since a model is often applied to before a trainer sets its mode (``from_pretrained``
returns it in eval mode, and ``Trainer.train()`` or Lightning's ``fit`` calls ``model.train()``) or casts it
(Lightning's ``"bf16-true"``), and autocast is entered around each step.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any

from torch import nn

from .._machine import environment_in, memory_in
from ..metrics.memory import autocast_of, parameters_dtype

__all__ = ["profiled_as", "differences", "FirstCall"]


def profiled_as(meta: Any) -> dict[str, Any]:
    """``{"training": bool, "dtype": str, "autocast": str | False, "batch_size": int}`` of a profile's ``meta``:
    the model's mode, its first parameter's dtype (``"float32"``) and the dtype ``torch.autocast`` computed in
    (False: off) as the memory meter's step first saved for backward, read in the forward as ``differences`` reads
    them (FSDP2's mixed precision has bfloat16 parameters there, float32 shards at rest; the environment's dtype,
    read at rest, from an older file); None for any that the profile does not hold (one saved by an older
    layerprof, or written by hand). ``"batch_size"`` too: the first dimension of the first tensor the model was
    called with, which the model cannot be checked against (``verify_plan`` compares it with its step's), None
    where unknown."""
    memory = memory_in(meta)
    training = memory.get("training")
    dtype = memory.get("dtype") or environment_in(meta).get("dtype")
    autocast = memory.get("autocast")
    batch = environment_in(meta).get("batch_size")
    return {"training": training if isinstance(training, bool) else None,
            "dtype": dtype if isinstance(dtype, str) else None,
            "autocast": autocast if isinstance(autocast, (str, bool)) and autocast is not True else None,
            "batch_size": batch if isinstance(batch, int) and not isinstance(batch, bool) else None}


def _mode(training: bool) -> str:
    return "training mode (model.train())" if training else "eval mode (model.eval())"


def differences(profiled: dict[str, Any] | None, model: nn.Module) -> list[str]:
    """The warnings for ``model`` where its mode or dtype now is not the one the plan's profile (``profiled``, of
    ``profiled_as``) ran."""
    if not profiled:
        return []
    found = []
    name = type(model).__name__
    training = profiled.get("training")
    if training is not None and bool(model.training) != training:
        found.append(
            f"checkpoint plan: this {name} runs in {_mode(model.training)}, and the profile the plan was made on ran "
            f"it in {_mode(training)}: its modules save other tensors for backward in the other mode (Dropout saves "
            "its mask in training only, BatchNorm its batch statistics), so the plan's predicted bytes and times are "
            "not this model's, and it can miss its budget. "
            + ("Call model.train() before the step, if it is to train" if training else
               "Plan on a profile of a step in the mode you train in (model.train() before profiling)"))
    dtype = profiled.get("dtype")
    now = parameters_dtype(model)
    if dtype is not None and now is not None and now != dtype:
        found.append(
            f"checkpoint plan: this {name}'s parameters are {now}, and the profiled model's were {dtype}: what its "
            f"modules save for backward is in the parameters' dtype, so the plan's predicted bytes are the {dtype} "
            "model's, not this one's (it wraps more than this model needs, or misses its budget). Plan on a profile "
            "of the model in the dtype you train it in (model.to(dtype) before profiling)")
    autocast = profiled.get("autocast")
    now_autocast = autocast_of(model)
    if autocast is not None and now_autocast is not None and now_autocast != autocast:
        found.append(
            f"checkpoint plan: this {name}'s step runs {_autocast(now_autocast)}, and the profiled step ran "
            f"{_autocast(autocast)}: autocast changes the dtype of what its modules save for backward (a matrix "
            "product saves copies of its input and weight in autocast's dtype), so the plan's predicted bytes are "
            "the other step's, not this one's (it wraps more than this step needs, or misses its budget). Plan on "
            "a profile of the step as you train it (its forward under the same torch.autocast)")
    return found


def _autocast(dtype: str | bool) -> str:
    return f"under torch.autocast ({dtype})" if dtype else "without torch.autocast"


class FirstCall:
    """Called by the wrappers of one ``apply`` at their first call with gradients on (a training step's): warns, once,
    where the model (held weakly) then runs in another mode or dtype than the profile's (``differences``)."""

    def __init__(self, model: nn.Module, profiled: dict[str, Any] | None) -> None:
        self._model = weakref.ref(model)
        self._profiled = profiled

    def __call__(self) -> None:
        profiled, self._profiled = self._profiled, None
        model = self._model()
        if not profiled or model is None:
            return
        for text in differences(profiled, model):
            warnings.warn(text, UserWarning, stacklevel=4)
