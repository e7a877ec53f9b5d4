"""Whole-model latency and throughput over many iterations, optionally with a per-module profile."""
from __future__ import annotations

import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._check import check_bool, check_int
from .collect.environment import environment
from .collect.profiler import LayerProf
from ._tensors import first_tensor, loss_of
from .profile import Profile
from .collect.statistics import RunningStat
from .render.progress import progress_bar
from .render.units import format_counted, format_ms

__all__ = ["BenchmarkResult", "benchmark"]


@dataclass
class BenchmarkResult:
    """Latency statistics in milliseconds per iteration, throughput in samples per second, where measured."""

    iters: int
    warmup: int
    backward: bool
    batch_size: int | None
    latency_ms: dict[str, float]
    throughput: float | None
    samples_ms: list[float] = field(repr=False)
    environment: dict[str, Any] = field(default_factory=dict, repr=False)
    profile: Profile | None = field(default=None, repr=False)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a cell's last value by this: the line ``print`` gives, not the dataclass's fields.
        printer.text(str(self))

    def __str__(self) -> str:
        lat = self.latency_ms
        mode = "forward+backward" if self.backward else "forward (inference_mode)"
        rate = f", {self.throughput:,.1f} samples/s" if self.throughput is not None else ""
        return (
            f"{mode}, {format_counted(self.iters, 'iteration')} after {self.warmup} warm-up: "
            f"median {format_ms(lat['median'])}, "
            f"mean {format_ms(lat['mean'])} ± {format_ms(lat['std'])}, p95 {format_ms(lat['p95'])}, "
            f"min {format_ms(lat['min'])}{rate}"
        )


def _split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def benchmark(model: nn.Module, inputs: Any, *, iters: int = 50, warmup: int = 10, backward: bool = False,
              per_module: bool = False, progress: bool | None = None) -> BenchmarkResult:
    """Time ``iters`` calls of ``model`` after ``warmup`` untimed ones.

    ``inputs`` is a tensor, a tuple of positional arguments, or a dict of keyword arguments. Forward-only under
    ``torch.inference_mode()`` by default; ``backward=True`` times forward + backward of the sum of the floating
    outputs. On CUDA each iteration is synchronized. ``per_module=True`` then profiles ``iters`` more steps with
    LayerProf (after one warm-up step with the hooks on, where ``warmup`` > 0: the model is warm from the timed
    ones) and attaches the Profile, so the latency figures stay free of hooks.

    >>> import torch
    >>> result = benchmark(torch.nn.Linear(4, 2), torch.randn(8, 4), iters=5, warmup=1)
    >>> result.batch_size, len(result.samples_ms)
    (8, 5)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"benchmark times a torch.nn.Module, got {type(model).__module__}.{type(model).__qualname__}")
    iters, warmup = check_int("iters", iters, minimum=None), check_int("warmup", warmup, minimum=None)
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    backward, per_module = check_bool("backward", backward), check_bool("per_module", per_module)
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (a bar for long runs on a terminal), got {progress!r}")
    args, kwargs = _split_inputs(inputs)
    example = first_tensor(args, kwargs)
    cuda = example is not None and example.is_cuda

    def run() -> None:
        with (nullcontext() if backward else torch.inference_mode()):
            output = model(*args, **kwargs)
            if backward:
                model.zero_grad(set_to_none=True)
                loss = loss_of(output)
                if loss is None:
                    raise ValueError("backward=True needs a model output that requires grad; none of its tensors does")
                loss.backward()

    profiled_steps = iters + min(warmup, 1)  # per_module: the model is warm from the timed calls, one step with hooks
    total = warmup + iters + (profiled_steps if per_module else 0)
    # Unless asked, a bar only for long runs, and only on a terminal (None).
    enabled = progress if progress is not None else (None if total >= 100 else False)
    bar = progress_bar(total, enabled, "layerprof benchmark", "it", required=bool(progress))
    samples: list[float] = []
    stat = RunningStat(max(iters, 1), random.Random(0))
    try:
        for index in range(warmup + iters):
            if cuda:
                torch.cuda.synchronize(example.device)
            start = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize(example.device)
            elapsed = (time.perf_counter() - start) * 1e3
            if index >= warmup:
                samples.append(elapsed)
                stat.add(elapsed)
            if bar is not None:
                bar.update(1)
        profile = None
        if per_module:
            with LayerProf(model, warmup=min(warmup, 1)) as prof:
                for _ in range(profiled_steps):
                    run()
                    prof.step()
                    if bar is not None:
                        bar.update(1)
            profile = prof.profile
    finally:
        if bar is not None:
            bar.close()
    summary = stat.summary()
    batch = int(example.shape[0]) if example is not None and example.dim() else None
    median = summary["median"]
    return BenchmarkResult(
        iters=iters, warmup=warmup, backward=backward, batch_size=batch, latency_ms=summary,
        throughput=(batch / (median / 1e3)) if batch and median > 0 else None, samples_ms=samples,
        environment={**environment(model, example)}, profile=profile,
    )
