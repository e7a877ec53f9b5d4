"""The fixed cost of wrapping a module in non-reentrant ``torch.utils.checkpoint``, beyond re-running its forward.

A checkpointed call pays, besides the recomputation, a set-up per call (the checkpoint's frame, its context
managers, the RNG state it keeps, in forward and again in backward) and a Python hook per tensor autograd saves in
the region, twice (once when the forward saves it, once when the recomputation does) plus the unpacking in
backward. ``wrap_cost()`` measures both on the host, once per process, on one thread (the cost is
Python on the calling thread; ``layerprof._threads``), and the
planner adds ``calls x per_call_ms + saved tensors x per_tensor_ms`` to each module's recompute time.

It measures them where a model runs them: cold. In a training step other modules run between two wrapped calls
and evict the checkpoint's code and data from the CPU caches, and the same wrapper then costs two to three times
what it costs called in a tight loop (measured in CPU time on a 2-core CPU: 0.21 ms a call in a loop of small
layers, 0.3-0.75 ms with a 512-wide Linear over 8-2,048 rows between the calls, more the more work between them;
0.57-0.87 ms a call on GPT-2's and ALBERT's GELUs, about 0.56 ms a call fitted over 24 plans of eight models). So
the stacks it times are wrapped blocks of small Linear layers with a small unwrapped feed-forward block (256 wide,
64 rows: a model's other layers in miniature) between each two, in forward and in backward, the blocks
differing only in how many tensors they save; the cost is the wrapped step minus the plain step minus the
blocks' own forward in the plain step, in thread CPU time, the median of 27 rounds (about 3 s, once per process:
with 9 rounds, calibrations repeated in one process read 0.33 to 1.01 ms a call; with 27, within
8-15 % of each other). The
cost is host-side Python: on a GPU whose kernels run behind the host it is partly hidden, and the measured figure
is an upper bound there.

Warmer, with less work between: the same small blocks are timed twice more, back to back with no filler and with a
filler over 8 rows instead of 64 (about 0.7 s more), and each reading less the cold per-tensor cost is the per-call
cost at that gap (``gap_points``: the gap is the plain step's forward outside the blocks, and its backward, per
block). On a 2-core CPU, one thread: 0.15-0.19 ms a call back to back, 0.30-0.59 ms after an 8-row filler (about
0.5 ms of forward, 0.9 of backward), 0.41-0.83 ms cold (1.2 and 2.3 ms); the per-tensor cost reads the same back to
back (12-13 µs) as cold (13-16 µs), so only the per-call cost follows the gap. The knapsack keeps the cold,
additive price of every wrapper: a module's cost may not depend on whether its neighbour is wrapped too. The chosen
plan's figures then price each of its wrapped calls at its gaps in the profiled step (``gaps.py``): the forward
work since the last wrapped call's forward and the backward work since the last wrapped call's backward began, each
side interpolated linearly between the points and cold past the last, the two sides averaged. So the knapsack's
figure (``cold_extra_ms``) is an upper bound of the plan's (``extra_ms``), equal where no wrapped call follows
another closely; DenseNet's consecutive dense layers, wrapped at 0.38 ms a call against 0.83 priced cold (run 9),
are what it is for.

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

from .._threads import calibrated
from .._torch import seeded_rng
from .apply import unwrap, wrap

__all__ = ["WrapCost", "wrap_cost", "check_wrap_cost", "calibration_stack"]

_CACHE: dict[str, WrapCost] = {}
_SMALL, LARGE = 1, 33  # Linear(4, 4) layers in a wrapped block of the two stacks; each saves its input and weight
_BLOCKS = 4  # wrapped blocks a stack, each followed by a filler
_FILLER_ROWS, _FILLER_WIDTH = 64, 256  # the unwrapped work between two wrapped calls (about 2.5 MB touched)
_GAP_ROWS = (0, 8)  # the fillers of the warmer calibrations (no filler: wrappers back to back), cold last
_REPEATS = 27  # rounds a stack; see the module doc


@dataclass(frozen=True)
class WrapCost:
    """What wrapping adds per step beyond the recomputed forward: ``per_call_ms`` for every call of a wrapped
    module (cold: other work ran since the last wrapper), ``per_tensor_ms`` for every tensor autograd saves inside
    it. ``gap_points``: how a call's cost falls when little other work runs between it and the last wrapped call,
    as (forward gap ms, backward gap ms, per_call_ms) from the least gap (back to back) to the most (the cold
    calibration, where ``per_call_ms`` holds); empty where the cost is given, not measured (every call cold)."""

    per_call_ms: float
    per_tensor_ms: float
    source: str = "given"
    gap_points: tuple[tuple[float, float, float], ...] = ()

    def of(self, calls: float, tensors: float) -> float:
        return calls * self.per_call_ms + tensors * self.per_tensor_ms

    def per_call_at(self, forward_gap_ms: float | None, backward_gap_ms: float | None) -> float:
        """A call's cost after ``forward_gap_ms`` of other forward work since the last wrapped call's forward, and
        ``backward_gap_ms`` of backward work since the last wrapped call's backward began (None: no wrapped call
        before it, cold): the mean of the two sides, each interpolated linearly between the calibrated gaps, and
        kept between 0 and the cold ``per_call_ms`` (points given with a WrapCost may lie above it: a plan's
        ``extra_ms`` stays at most its ``cold_extra_ms``)."""
        cold = self.per_call_ms
        forward = _interpolate(self.gap_points, 0, forward_gap_ms, cold)
        backward = _interpolate(self.gap_points, 1, backward_gap_ms, cold)
        return (min(cold, max(0.0, forward)) + min(cold, max(0.0, backward))) / 2


def _interpolate(points: tuple[tuple[float, float, float], ...], side: int, gap: float | None, cold: float
                 ) -> float:
    """The per-call cost at ``gap`` on ``side`` (0 forward, 1 backward) of ``points``; ``cold`` past the last
    point, with no points, or where there is no gap (None)."""
    if gap is None or not points:
        return cold
    if gap <= points[0][side]:
        return points[0][2]
    for before, after in zip(points, points[1:]):
        if gap <= after[side]:
            span = after[side] - before[side]
            share = (gap - before[side]) / span if span > 0 else 1.0
            return before[2] + share * (after[2] - before[2])
    return cold


class _Filler(nn.Module):
    """Work between two wrapped blocks that a model would do: a small feed-forward block (LayerNorm, Linear to
    four times the width, GELU, Linear back, Tanh) over a held batch, joined to the chain so that its backward
    runs between the blocks' backward too."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(_FILLER_WIDTH), nn.Linear(_FILLER_WIDTH, 4 * _FILLER_WIDTH), nn.GELU(),
                                  nn.Linear(4 * _FILLER_WIDTH, _FILLER_WIDTH), nn.Tanh())
        self.register_buffer("batch", torch.randn(rows, _FILLER_WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(self.batch).mean() * 0.0


def calibration_stack(layers: int, filler_rows: int = _FILLER_ROWS
                      ) -> tuple[nn.Sequential, list[nn.Sequential], torch.Tensor]:
    """A model in miniature, seeded: ``_BLOCKS`` blocks of ``layers`` Linear(4, 4) each, every block followed by
    a filler over ``filler_rows`` rows (none for 0: the blocks back to back); the stack, its blocks and an input
    that needs grad."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(*(nn.Linear(4, 4) for _ in range(layers))) for _ in range(_BLOCKS)]
    fillers = [[_Filler(filler_rows)] if filler_rows else [] for _ in blocks]
    stack = nn.Sequential(*(part for block, filler in zip(blocks, fillers) for part in [block, *filler]))
    return stack, blocks, torch.randn(2, 4, requires_grad=True)


def _overhead_ms(layers: int, filler_rows: int = _FILLER_ROWS) -> tuple[float, int, float, float]:
    """Median (checkpointed step - plain step - the wrapped blocks' forward in the plain step) per wrapped block,
    with ``layers`` Linear(4, 4) in each block and fillers over ``filler_rows`` rows; the tensors a block saves;
    and the gap between two blocks, forward and backward: the median of the plain step's forward outside the
    blocks, and of its backward (the blocks' own backward, a few µs, left in), per block."""
    stack, blocks, x = calibration_stack(layers, filler_rows)
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

    def timed() -> tuple[float, float]:
        """The step's time and its forward's, in ms."""
        start = time.thread_time_ns()
        out = stack(x).sum()
        middle = time.thread_time_ns()
        out.backward()
        return (time.thread_time_ns() - start) / 1e6, (middle - start) / 1e6

    differences, forward_gaps, backward_gaps = [], [], []
    for repeat in range(_REPEATS + 2):
        handles = [hook for block in blocks for hook in (block.register_forward_pre_hook(pre),
                                                         block.register_forward_hook(post))]
        inside[0] = 0
        try:
            plain, plain_forward = timed()
        finally:
            for handle in handles:
                handle.remove()
        forward = inside[0] / 1e6
        owns = [wrap(block) for block in blocks]
        try:
            wrapped = timed()[0]
        finally:
            for block, own in zip(blocks, owns):
                unwrap(block, own)
        if repeat >= 2:  # two warm-up rounds
            differences.append((wrapped - plain - forward) / _BLOCKS)
            forward_gaps.append((plain_forward - forward) / _BLOCKS)
            backward_gaps.append((plain - plain_forward) / _BLOCKS)
    if not filler_rows:  # back to back: no other work between the blocks
        return statistics.median(differences), saved[0], 0.0, 0.0
    return statistics.median(differences), saved[0], statistics.median(forward_gaps), statistics.median(backward_gaps)


def wrap_cost() -> WrapCost:
    """The per-call and per-saved-tensor cost of a checkpoint wrapper on this host, measured once per process, on
    one thread (``layerprof._threads``; cached)."""
    return calibrated(_CACHE, "cpu", _measure)


def _measure() -> WrapCost:
    with seeded_rng():  # the stacks are seeded: leave the caller's RNG as it was
        small, small_tensors, forward_gap, backward_gap = _overhead_ms(_SMALL)
        large, large_tensors = _overhead_ms(LARGE)[:2]
        warmer = [_overhead_ms(_SMALL, rows) for rows in _GAP_ROWS]
    per_tensor = max(0.0, (large - small) / (large_tensors - small_tensors))
    per_call = max(0.0, small - per_tensor * small_tensors)
    return WrapCost(per_call, per_tensor, "measured", gap_points(
        [(f, b, overhead - per_tensor * small_tensors) for overhead, _, f, b in warmer]
        + [(forward_gap, backward_gap, per_call)]))


def gap_points(measured: list[tuple[float, float, float]]) -> tuple[tuple[float, float, float], ...]:
    """The calibrations (forward gap, backward gap, per-call cost), least gap first, made what the interpolation
    needs: gaps and costs that never fall from one point to the next (a warmer calibration that read dearer
    than a colder one, by noise, is priced as the colder one), costs at least 0."""
    points: list[tuple[float, float, float]] = []
    cold = max(0.0, measured[-1][2])
    for forward, backward, cost in measured:
        last = points[-1] if points else (0.0, 0.0, 0.0)
        points.append((max(forward, last[0]), max(backward, last[1]), min(cold, max(cost, last[2]))))
    return tuple(points)


def check_wrap_cost(value: Any) -> WrapCost | None:
    """``wrap_cost=`` of ``checkpoint_plan``: "measured" (the default), None (recompute time only), or a pair
    (per_call_ms, per_tensor_ms) / a WrapCost."""
    if isinstance(value, str) and value == "measured":
        return wrap_cost()
    if value is None or isinstance(value, WrapCost):
        return value
    numbers = isinstance(value, (tuple, list)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if numbers and len(value) == 2 and all(0 <= v < float("inf") for v in value):  # (NaN fails the comparison)
        return WrapCost(float(value[0]), float(value[1]))
    # A wrong kind of value (3.0, a pair holding a string or a bool) is a TypeError; a string other than "measured",
    # a pair of other length, or a negative, infinite or NaN figure a ValueError.
    wrong = ValueError if isinstance(value, str) or numbers else TypeError
    raise wrong(
        f"wrap_cost must be 'measured', None (recompute time only) or a pair (per_call_ms, per_tensor_ms) of "
        f"non-negative numbers, got {value!r}"
    )
