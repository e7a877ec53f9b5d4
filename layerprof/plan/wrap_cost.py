"""The fixed cost of wrapping a module in non-reentrant ``torch.utils.checkpoint``, beyond re-running its forward.

A checkpointed call pays, besides the recomputation, a set-up per call (the checkpoint's frame, its context
managers, the RNG state it keeps) and a Python hook per tensor autograd saves in the region, twice (once when the
forward saves it, once when the recomputation does) plus the unpacking in backward. On small blocks this is most
of what wrapping costs: measured on a 2-core CPU, about 0.3 ms per call and 25 µs per saved tensor, so a 16-layer
MLP of 4-wide Linears costs seven times its forward when wrapped. ``wrap_cost()`` measures both on the host, once
per process and thread count (about 0.1 s), by wrapping two small stacks of Linear layers that differ only in how
many tensors they save, and the planner adds ``calls x per_call_ms + saved tensors x per_tensor_ms`` to each
module's recompute time. The cost is host-side Python: on a GPU whose kernels run behind the host it is partly
hidden, and the measured figure is an upper bound there.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .apply import unwrap, wrap

__all__ = ["WrapCost", "wrap_cost", "check_wrap_cost"]

_CACHE: dict[int, WrapCost] = {}
_SMALL, _LARGE = 1, 17  # Linear layers in the two stacks; each saves its input and its weight
_REPEATS = 15


@dataclass(frozen=True)
class WrapCost:
    """What wrapping adds per step beyond the recomputed forward: ``per_call_ms`` for every call of a wrapped
    module, ``per_tensor_ms`` for every tensor autograd saves inside it."""

    per_call_ms: float
    per_tensor_ms: float
    source: str = "given"

    def of(self, calls: float, tensors: float) -> float:
        return calls * self.per_call_ms + tensors * self.per_tensor_ms


def _overhead_ms(layers: int) -> tuple[float, int]:
    """Median (checkpointed step - plain step - forward with grad) of a stack of ``layers`` Linear(4, 4), and the
    tensors it saves."""
    torch.manual_seed(0)
    stack = nn.Sequential(*(nn.Linear(4, 4) for _ in range(layers)))
    x = torch.randn(2, 4, requires_grad=True)
    saved = [0]

    def count(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        stack(x)

    def step() -> None:
        stack(x).sum().backward()

    def forward() -> None:
        stack(x)

    def timed(run: Any) -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    differences = []
    for repeat in range(_REPEATS + 2):
        plain, again = timed(step), timed(forward)
        own = wrap(stack)
        try:
            wrapped = timed(step)
        finally:
            unwrap(stack, own)
        if repeat >= 2:  # two warm-up rounds
            differences.append((wrapped - plain - again) * 1e3)
    return statistics.median(differences), saved[0]


def wrap_cost() -> WrapCost:
    """The per-call and per-saved-tensor cost of a checkpoint wrapper on this host, measured once per process and
    CPU thread count (cached)."""
    threads = torch.get_num_threads()
    found = _CACHE.get(threads)
    if found is None:
        small, small_tensors = _overhead_ms(_SMALL)
        large, large_tensors = _overhead_ms(_LARGE)
        per_tensor = max(0.0, (large - small) / (large_tensors - small_tensors))
        per_call = max(0.0, small - per_tensor * small_tensors)
        found = _CACHE[threads] = WrapCost(per_call, per_tensor, "measured")
    return found


def check_wrap_cost(value: Any) -> WrapCost | None:
    """``wrap_cost=`` of ``checkpoint_plan``: "measured" (the default), None (recompute time only), or a pair
    (per_call_ms, per_tensor_ms) / a WrapCost."""
    if isinstance(value, str) and value == "measured":
        return wrap_cost()
    if value is None or isinstance(value, WrapCost):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and v == v and v != float("inf")
            for v in value):
        return WrapCost(float(value[0]), float(value[1]))
    raise ValueError(
        f"wrap_cost must be 'measured', None (recompute time only) or a pair (per_call_ms, per_tensor_ms) of "
        f"non-negative numbers, got {value!r}"
    )
