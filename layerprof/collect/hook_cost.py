"""The profiler's own time inside a module's profiled forward, which a recomputation does not pay.

A module's forward time in a profile is its inclusive wall time, and it holds the hooks layerprof ran for every
call of a module inside it (stamping the clock, recording the call, the shapes meter's reading): the parts of a
child's hooks that run outside the child's own window fall in its ancestors'. Checkpointing re-runs the bare
forward, without them. On a module with many descendants this is no rounding error: a ViT layer of 12 modules
at hidden 128 is profiled at 1.41-1.55 ms and runs in 1.15-1.28 ms bare, 21-31 µs per descendant call (CPU, one
thread), where its leaves are profiled within 2 µs of bare. So the planner prices a recomputation as the
profiled forward less ``descendant calls x hook_cost()``.

``hook_cost()`` measures that figure where a model runs its hooks: cold. It profiles the stack ``wrap_cost``
times (blocks of 33 small Linear layers, an unwrapped feed-forward filler after each) and sets each block's
profiled forward against its bare forward in plain steps, per Linear call, the median over the blocks (about
0.4 s, once per process and meter set, on one thread: ``layerprof._threads``). Each block's forward is its least
over the steps, profiled and bare: noise only adds time, and the profiled steps run after the bare ones, so a
burst over half of either side's steps moved their medians' difference (3.0-3.8x the figure over the profiled
steps, to 0 over the bare ones, in experiments that slowed five steps' Linear calls). The first two steps of each
side are left out (cold). In a tight loop of modules the same hooks cost a third of it, as the wrapper does
(``wrap_cost.py``). On a GPU the module times are device times, which the host's
hooks do not lengthen as long as the host runs ahead: there the figure is measured on the GPU, against the host's
time of each forward that the records hold beside the events' (``host_forward_ms``), and the planner takes it off
that (``plan/candidates.py``, ``less_hooks``).
"""
from __future__ import annotations

import statistics
import time
import warnings
from typing import Any, Callable

import torch

from .._threads import calibrated
from .._torch import seeded_rng
from ..plan.wrap_cost import LARGE, calibration_stack

__all__ = ["hook_cost"]

_CACHE: dict[tuple[str, ...], float] = {}
_STEPS = 9  # profiled and bare steps
_DROPPED = 2  # the first steps of each, cold


def _bare_block_ms(stack: torch.nn.Module, blocks: list[torch.nn.Module], x: torch.Tensor,
                   statistic: Callable[[list[float]], float] = min) -> list[float]:
    """Each block's least forward wall time over plain training steps (or another ``statistic`` of them), timed by
    hooks on the blocks alone."""
    times: list[list[float]] = [[] for _ in blocks]
    started = [0] * len(blocks)

    def hooks(index: int) -> tuple[Any, Any]:
        def pre(module: torch.nn.Module, args: Any) -> None:
            started[index] = time.perf_counter_ns()

        def post(module: torch.nn.Module, args: Any, output: Any) -> None:
            times[index].append((time.perf_counter_ns() - started[index]) / 1e6)
        return pre, post

    handles = []
    for index, block in enumerate(blocks):
        pre, post = hooks(index)
        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
    try:
        for _ in range(_STEPS):
            stack(x).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return [statistic(found[_DROPPED:]) for found in times]


def hook_cost(profiler: Callable[..., Any], metrics: tuple[str, ...] = (), device: str = "cpu") -> float:
    """Milliseconds that the hooks of ``profiler`` (LayerProf, which calls this as its profile is made) on one
    module call add to the profiled forward of the modules around it, on the CPU wall clock, with the meters
    ``metrics`` that run in every timed step (the memory meter counts in a step of its own and adds nothing);
    measured once per process, device and meter set, on one thread (``layerprof._threads``; cached). On a CUDA
    ``device`` the stack runs there, timed by CUDA events, and the figure is what the hooks add to the host's
    time of the forward (``host_forward_ms``, the mean over the steps, against the bare blocks' mean): the events'
    stamps and the per-call clock lookup are host work that the CPU's figure leaves out."""
    key = (device, *sorted(metrics))
    return calibrated(_CACHE, key, lambda: _measure(profiler, tuple(sorted(metrics)), device))


def _measure(profiler: Callable[..., Any], metrics: tuple[str, ...], device: str = "cpu") -> float:
    on_cuda = torch.device(device).type == "cuda"
    # Seeded: leave the caller's RNG as it was; a step with backward even where the caller's grad is off.
    with seeded_rng(), torch.enable_grad():
        stack, blocks, x = calibration_stack(LARGE)
        if on_cuda:
            stack, x = stack.to(device), x.detach().to(device).requires_grad_()
        bare = _bare_block_ms(stack, blocks, x, statistics.fmean if on_cuda else min)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a calibration, not the user's profile
            with profiler(stack, metrics=metrics, warmup=_DROPPED) as prof:
                for _ in range(_STEPS):
                    stack(x).sum().backward()
                    prof.step()
        records = prof.records
        field = "host_forward_ms" if on_cuda else "forward_ms_min"
        profiled = [float(getattr(records[str(2 * index)], field)) for index in range(len(blocks))]
    return max(0.0, statistics.median((inside - alone) / LARGE for inside, alone in zip(profiled, bare)))
