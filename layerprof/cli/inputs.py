"""``--input`` specs (``[name=]2,3,224,224[:dtype]``) and the random tensors built from them."""
from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._torch import with_forward_pre_hooks
from ..render.units import format_bytes
from .errors import RunError, UsageError, one_line

__all__ = ["InputSpec", "parse_input", "parse_dtype", "make_inputs", "check_input_names", "check_input_vocab",
           "check_input_sizes", "check_forward_takes"]

_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}


def parse_dtype(text: str, what: str = "dtype") -> torch.dtype:
    """A torch dtype by name (``float32``, ``bfloat16``, ``int64``, ``long``, ``bf16``...); else a UsageError."""
    name = _ALIASES.get(text.strip().lower(), text.strip().lower()).removeprefix("torch.")
    dtype = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"unknown {what} {text!r}; use a torch dtype name such as float32, bfloat16 or int64")
    return dtype


@dataclass(frozen=True)
class InputSpec:
    """One input of the model: its shape, its dtype (None: the float default) and its keyword (None: positional)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    name: str | None = None

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape))
        dtype = f" {str(self.dtype).replace('torch.', '')}" if self.dtype is not None else ""
        return f"{self.name}=" * bool(self.name) + shape + dtype


def parse_input(text: str) -> InputSpec:
    """``'2,3,224,224'``, ``'2,32:int64'`` or ``'attention_mask=2,32:int64'`` as an InputSpec."""
    name, equals, rest = text.partition("=")
    if not equals:
        name, rest = "", text
    elif not name.isidentifier():
        raise UsageError(f"--input {text!r}: {name!r} is not a keyword argument name")
    shape_text, colon, dtype_text = rest.partition(":")
    dtype = parse_dtype(dtype_text, "input dtype") if colon else None
    parts = [part.strip() for part in shape_text.split(",")]
    if not shape_text.strip() or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise UsageError(
            f"--input {text!r} is not a shape: give positive sizes separated by commas, "
            "e.g. 2,3,224,224 or 2,32:int64"
        )
    shape = tuple(int(part) for part in parts)
    if math.prod(shape) >= 2**63:
        raise UsageError(f"--input {text!r} has {math.prod(shape):.3g} elements, more than a tensor can hold (2^63)")
    return InputSpec(shape, dtype, name or None)


def check_input_vocab(specs: list[InputSpec], vocab: int) -> None:
    """A UsageError where an integer input's dtype cannot hold the ids drawn for it, ``[0, vocab)``."""
    for spec in specs:
        dtype = spec.dtype
        if dtype is None or dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
            continue
        most = torch.iinfo(dtype).max
        if vocab - 1 > most:
            shown = str(dtype).replace("torch.", "")
            raise UsageError(f"--vocab {vocab}: input {spec} draws integers in [0, {vocab}), more than {shown} holds "
                             f"(at most {most}); give --vocab {most + 1} or less, or a wider dtype such as int64")


def check_input_names(specs: list[InputSpec]) -> None:
    """A UsageError for a keyword given twice: the second would silently replace the first."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise UsageError(f"--input {spec.name}= is given twice; give each keyword input once")
        if spec.name is not None:
            seen.add(spec.name)


def check_forward_takes(model: nn.Module, specs: list[InputSpec]) -> None:
    """A UsageError, before any step runs, when ``forward``'s signature cannot take these inputs (too many or too
    few positional ones, an unknown keyword): the command line's mistake, not the model's failure."""
    if with_forward_pre_hooks([model]):  # a pre-hook may supply or rewrite the arguments: only a call can tell
        return
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C++ forward: no signature to check against
        return
    positional = [spec for spec in specs if spec.name is None]
    try:
        signature.bind(*positional, **{spec.name: spec for spec in specs if spec.name is not None})
    except TypeError as exc:
        shown = ", ".join(map(str, specs))
        raise UsageError(f"--input: {type(model).__name__}.forward{signature} cannot take the inputs given "
                         f"({shown}): {exc}; give one --input per positional argument of forward, "
                         "NAME=SHAPE for a keyword") from None


def _random(spec: InputSpec, float_dtype: torch.dtype, vocab: int, device: torch.device) -> torch.Tensor:
    dtype = spec.dtype or float_dtype
    if dtype == torch.bool:
        return torch.randint(0, 2, spec.shape, device=device).bool()
    if dtype.is_floating_point and dtype.itemsize == 1:  # float8: randn has no kernel for it, a cast has
        return torch.randn(spec.shape, device=device).to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(spec.shape, dtype=dtype, device=device)
    return torch.randint(0, vocab, spec.shape, dtype=dtype, device=device)  # token ids, class labels...


def _memory_of(device: torch.device) -> int | None:
    """Bytes of memory on ``device`` (physical RAM for the CPU), None where unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass
    return None


def check_input_sizes(specs: list[InputSpec], float_dtype: torch.dtype, device: torch.device) -> None:
    """A UsageError, before the model is built, when the inputs alone cannot fit in the device's memory."""
    sizes = [math.prod(spec.shape) * (spec.dtype or float_dtype).itemsize for spec in specs]
    memory = _memory_of(device)
    if memory is not None and sum(sizes) > memory:
        largest = specs[sizes.index(max(sizes))]
        raise UsageError(f"--input {largest}: the inputs need {format_bytes(sum(sizes))}, more than the "
                         f"{format_bytes(memory)} of memory on {device}; give smaller shapes")


def make_inputs(specs: list[InputSpec], *, float_dtype: torch.dtype = torch.float32, vocab: int = 100,
                device: torch.device | str = "cpu") -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """Random ``(args, kwargs)`` for the model: floats from randn, integers in ``[0, vocab)``.

    >>> args, kwargs = make_inputs([parse_input("2,3"), parse_input("mask=2,8:int64")], vocab=5)
    >>> args[0].shape, args[0].dtype, kwargs["mask"].dtype, int(kwargs["mask"].max()) < 5
    (torch.Size([2, 3]), torch.float32, torch.int64, True)
    """
    tensors = []
    for spec in specs:
        try:
            tensors.append(_random(spec, float_dtype, vocab, torch.device(device)))
        except (RuntimeError, MemoryError) as exc:  # out of memory, most often: one line, not torch's C++ stack
            size = math.prod(spec.shape) * (spec.dtype or float_dtype).itemsize
            raise RunError(f"cannot make the input {spec} ({format_bytes(size)}): "
                           f"{one_line(exc)}") from exc
    args = tuple(t for spec, t in zip(specs, tensors) if spec.name is None)
    kwargs = {spec.name: t for spec, t in zip(specs, tensors) if spec.name is not None}
    return args, kwargs
