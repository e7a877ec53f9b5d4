"""The fixed cost of wrapping a module in non-reentrant ``torch.utils.checkpoint``, beyond re-running its forward.

A checkpointed call pays, besides the recomputation, a set-up per call (the checkpoint's frame, its context
managers, the RNG state it keeps, in forward and again in backward) and a Python hook per tensor autograd saves in
the region, twice (once when the forward saves it, once when the recomputation does) plus the unpacking in
backward. ``wrap_cost()`` measures both on the host, once per process and thread count, and the
planner adds ``calls x per_call_ms + saved tensors x per_tensor_ms`` to each module's recompute time.

It measures them where a model runs them: cold. In a training step other modules run between two wrapped calls
and evict the checkpoint's code and data from the CPU caches, and the same wrapper then costs two to three times
what it costs called in a tight loop (measured in CPU time on a 2-core CPU: 0.21 ms a call in a loop of small
layers, 0.3-0.75 ms with a 512-wide Linear over 8-2,048 rows between the calls, more the more work between them;
0.57-0.87 ms a call on GPT-2's and ALBERT's GELUs, about 0.56 ms a call fitted over 24 plans of eight models). So
the stacks it times are wrapped blocks of small Linear layers with a small unwrapped feed-forward block (256 wide,
64 rows: a model's other layers in miniature) between each two, in forward and in backward, the blocks
differing only in how many tensors they save; the cost is the wrapped step minus the plain step minus the
blocks' own forward in the plain step, in thread CPU time, the median of 27 rounds (about 3 s, once per process
and thread count: with 9 rounds, calibrations repeated in one process read 0.33 to 1.01 ms a call; with 27, within
8-15 % of each other). The
cost is host-side Python: on a GPU whose kernels run behind the host it is partly hidden, and the measured figure
is an upper bound there.

What it does not follow: the same wrappers in the same model can cost a third more in one process than in the
next while the calibration reads the same in both. Timed from inside the steps (``benchmarks/checkpoint_plan.py
--split``, CPU time, three fresh processes on a loaded 2-core host), the zoo's MLP's wrappers cost 0.86, 0.90 and
1.17 ms a call on its three plans in one process and 0.58-0.86 (median 0.65) on the six of the other two, against
calibrations of 0.57, 0.59 and 0.48 ms a call (+ 12-19 µs a tensor); the excess was in backward, outside the
recomputation, with as many page faults as in the other processes. Calibrated two or three times in each of 18 fresh
processes (``benchmarks/wrap_cost_spread.py``), a wrapper over three saved tensors was priced 0.49-0.98 ms over all
and within 0.13 ms in 17 of the processes: more rounds or another statistic would make it steadier, not make it
follow what the wrappers cost in the model, and no figure of the profile does.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .apply import unwrap, wrap

__all__ = ["WrapCost", "wrap_cost", "check_wrap_cost", "calibration_stack"]

_CACHE: dict[int, WrapCost] = {}
_SMALL, LARGE = 1, 33  # Linear(4, 4) layers in a wrapped block of the two stacks; each saves its input and weight
_BLOCKS = 4  # wrapped blocks a stack, each followed by a filler
_FILLER_ROWS, _FILLER_WIDTH = 64, 256  # the unwrapped work between two wrapped calls (about 2.5 MB touched)
_REPEATS = 27  # rounds a stack; see the module doc


@dataclass(frozen=True)
class WrapCost:
    """What wrapping adds per step beyond the recomputed forward: ``per_call_ms`` for every call of a wrapped
    module, ``per_tensor_ms`` for every tensor autograd saves inside it."""

    per_call_ms: float
    per_tensor_ms: float
    source: str = "given"

    def of(self, calls: float, tensors: float) -> float:
        return calls * self.per_call_ms + tensors * self.per_tensor_ms


class _Filler(nn.Module):
    """Work between two wrapped blocks that a model would do: a small feed-forward block (LayerNorm, Linear to
    four times the width, GELU, Linear back, Tanh) over a held batch, joined to the chain so that its backward
    runs between the blocks' backward too."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(_FILLER_WIDTH), nn.Linear(_FILLER_WIDTH, 4 * _FILLER_WIDTH), nn.GELU(),
                                  nn.Linear(4 * _FILLER_WIDTH, _FILLER_WIDTH), nn.Tanh())
        self.register_buffer("batch", torch.randn(_FILLER_ROWS, _FILLER_WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(self.batch).mean() * 0.0


def calibration_stack(layers: int) -> tuple[nn.Sequential, list[nn.Sequential], torch.Tensor]:
    """A model in miniature, seeded: ``_BLOCKS`` blocks of ``layers`` Linear(4, 4) each, every block followed by
    a filler; the stack, its blocks and an input that needs grad."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(*(nn.Linear(4, 4) for _ in range(layers))) for _ in range(_BLOCKS)]
    stack = nn.Sequential(*(part for block in blocks for part in (block, _Filler())))
    return stack, blocks, torch.randn(2, 4, requires_grad=True)


def _overhead_ms(layers: int) -> tuple[float, int]:
    """Median (checkpointed step - plain step - the wrapped blocks' forward in the plain step) per wrapped block,
    with ``layers`` Linear(4, 4) in each block, and the tensors a block saves."""
    stack, blocks, x = calibration_stack(layers)
    saved = [0]

    def count(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        blocks[0](x)
    inside = [0]  # nanoseconds spent in the blocks' forward during the plain step

    def pre(module: nn.Module, args: Any) -> None:
        inside[0] -= time.thread_time_ns()

    def post(module: nn.Module, args: Any, output: Any) -> None:
        inside[0] += time.thread_time_ns()

    def timed() -> float:
        start = time.thread_time_ns()
        stack(x).sum().backward()
        return (time.thread_time_ns() - start) / 1e6

    differences = []
    for repeat in range(_REPEATS + 2):
        handles = [hook for block in blocks for hook in (block.register_forward_pre_hook(pre),
                                                         block.register_forward_hook(post))]
        inside[0] = 0
        try:
            plain = timed()
        finally:
            for handle in handles:
                handle.remove()
        forward = inside[0] / 1e6
        owns = [wrap(block) for block in blocks]
        try:
            wrapped = timed()
        finally:
            for block, own in zip(blocks, owns):
                unwrap(block, own)
        if repeat >= 2:  # two warm-up rounds
            differences.append((wrapped - plain - forward) / _BLOCKS)
    return statistics.median(differences), saved[0]


def wrap_cost() -> WrapCost:
    """The per-call and per-saved-tensor cost of a checkpoint wrapper on this host, measured once per process and
    CPU thread count (cached)."""
    threads = torch.get_num_threads()
    found = _CACHE.get(threads)
    if found is None:
        with torch.random.fork_rng(devices=[]):  # the stacks are seeded: leave the caller's RNG as it was
            small, small_tensors = _overhead_ms(_SMALL)
            large, large_tensors = _overhead_ms(LARGE)
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
