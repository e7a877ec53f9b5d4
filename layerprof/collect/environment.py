"""Where a result was measured: host, OS, CPU, torch, threads, device, dtype, batch size, the rank."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._machine import machine as _machine
from .._torch import faked

__all__ = ["environment", "environment_of", "first_parameter", "input_facts", "on_input_device", "rank_facts",
           "untimed"]


@lru_cache(maxsize=64)
def _device_facts(device: torch.device | None, dtype: torch.dtype | None) -> dict[str, Any]:
    # Names of a device and a dtype, which a process reads at every block (formatting them is C++ code that a
    # block's exit would run cold after the step).
    return {
        "device": str(device) if device is not None else None,
        "gpu": torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else None,
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
    }


_END = object()


def first_parameter(model: nn.Module) -> torch.Tensor | None:
    """``next(model.parameters(), None)``, walking modules only until one holds a parameter (``parameters()``
    visits the whole model first: tens of microseconds on a transformer, on every profile), and a module's children
    one at a time (not every sibling stacked at once: a root of ten thousand children took 0.15 ms)."""
    walks, seen = [iter((model,))], set()
    while walks:
        module = next(walks[-1], _END)
        if module is _END:
            walks.pop()
            continue
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        for parameter in module._parameters.values():
            if parameter is not None:
                return parameter
        walks.append(iter(module._modules.values()))
    return None


def environment(model: nn.Module | None = None, example: torch.Tensor | None = None) -> dict[str, Any]:
    """Facts about the machine and run; ``model`` gives device and dtype, ``example`` the batch size."""
    return environment_of(first_parameter(model) if model is not None else None, example)


def environment_of(parameter: torch.Tensor | None, example: torch.Tensor | None = None) -> dict[str, Any]:
    """``environment`` of a model whose first parameter (``next(model.parameters(), None)``) is ``parameter``,
    where the caller knows it without a walk of the model."""
    if parameter is not None and parameter.is_cpu:
        # A CPU model's device facts by its dtype alone: no device object made and hashed (cold C++ code as a
        # block ends right after a step).
        dtype = parameter.dtype
        device_facts = _CPU_FACTS.get(dtype)
        if device_facts is None:
            device_facts = _CPU_FACTS[dtype] = _device_facts(parameter.device, dtype)
    else:
        device = parameter.device if parameter is not None else (example.device if example is not None else None)
        device_facts = _device_facts(device, parameter.dtype if parameter is not None else None)
    facts = {
        **_machine(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        **device_facts,
        **(input_facts(example) if example is not None else _NO_EXAMPLE),
    }
    if facts["device"] == "meta" and example is not None:
        facts = on_input_device(facts, example.device)
    return facts


def on_input_device(facts: dict[str, Any], device: torch.device | None) -> dict[str, Any]:
    """``facts`` of a model whose parameters are on the meta device, on the device of its input instead where that
    is a real one: a stateless base run with real parameters (``torch.func.functional_call``, model ensembling)
    works where its inputs are, and that device's roofs are the ones to measure."""
    if device is None or device.type == "meta":
        return facts
    return {**facts, **{k: v for k, v in _device_facts(device, None).items() if k != "dtype"}}


def untimed(facts: dict[str, Any], parameter: torch.Tensor | None, input_device: torch.device | None = None,
            input_fake: bool | None = None) -> str | None:
    """Why a step's times are not the model's: ``"meta"`` where it ran on the meta device (``facts``, the
    environment, already moved to a real input's device; for a model without parameters, ``input_device``, its
    first input's), ``"fake"`` where it ran on fake tensors (``FakeTensorMode``, a model built under it:
    ``parameter`` is its first, or ``input_fake``: its first input was one). Their ops compute nothing, so the
    time of a module is the host's bookkeeping of shapes, not the work; None where the step ran on a device."""
    if facts["device"] == "meta" or (parameter is None and input_device is not None and input_device.type == "meta"):
        return "meta"
    return "fake" if input_fake or faked(parameter) else None


# ``_device_facts`` of the CPU by dtype.
_CPU_FACTS: dict[torch.dtype, dict[str, Any]] = {}


_NO_EXAMPLE = {"batch_size": None, "input_dtype": None}


def input_facts(example: torch.Tensor | None) -> dict[str, Any]:
    """The batch size (first dimension), shape and dtype of a model's input ``example``, and ``autocast_dtype``
    where the call runs under ``torch.autocast`` for the input's device: the dtype its matrix products compute in,
    whose roofs the roofline needs (the parameters' float32 ones put a bf16 step's efficiency above 1)."""
    facts = {
        # (``size(0)``, not ``shape[0]``: a strided nested tensor has no sizes, but its first dimension)
        "batch_size": int(example.size(0)) if example is not None and example.dim() > 0 else None,
        "input_dtype": str(example.dtype).replace("torch.", "") if example is not None else None,
    }
    if example is not None:
        if not example.is_nested:  # (a strided nested tensor has no sizes)
            facts["input_shape"] = list(example.shape)
        device_type = example.device.type
        if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
            facts["autocast_dtype"] = str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
    return facts


def rank_facts() -> dict[str, Any] | None:
    """This process's global rank, the default group's size and its backend under an initialized
    torch.distributed (None outside one): what tells the per-rank files of one job apart once saved."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}
