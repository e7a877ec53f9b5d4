"""What recomputing a layer that saves before it computes costs under ``torch.autocast``: its casts.

A Linear or a convolution saves its input and weight before it computes (``candidates._SAVES_BEFORE_COMPUTING``),
so non-reentrant checkpoint's early stop ends its recomputation before the product runs. Wrapped by itself, such a
layer frees only what its forward made before that save: under autocast, the copies of its weight (and of an
input in another dtype) in autocast's dtype. The recomputation makes those copies again (autocast's cache of
casts lives for one autocast region, and the recomputation runs in another, in backward) and stops. The profiled
forward holds the casts and the product: on resnet18 at 64x64 under bfloat16 autocast (2-core CPU, one thread),
layer4's 3x3 convolutions were priced 1.36-1.84 ms and re-ran in 0.73-0.92. Timed alone with checkpoint, the same
convolution recomputed in 0.75 ms where its forward took 6.1 (0.15 ms in float32, where nothing is cast and
nothing freed), and a cold cast of its weight took 0.58 ms.

``cast_cost(dtype)`` measures the recomputation itself, once per process on one thread: a bias-free Linear, small
and large, wrapped as a plan wraps it and timed by ``RecomputeTimer`` (what ``verify_plan`` measures) under
autocast of ``dtype``, with 16 MB of other work between the steps so that the weight is read cold as in a model;
the median of each, fitted as a fixed part plus a part per byte freed (the weight's copy, ``CastCost``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from torch import nn

from .._threads import calibrated
from .._torch import seeded_rng
from .apply import RecomputeTimer, unwrap, wrap

__all__ = ["CastCost", "cast_cost"]

_CACHE: dict[str, CastCost] = {}
_WIDTHS = (16, 1024)  # the Linear layers timed: a fixed part from the small, the part per byte from the large
_ROWS = 4
_REPEATS = 15  # steps a layer, after two to warm up
_FILLER = 4_000_000  # floats touched between two steps (16 MB: past a CPU's caches, as a model's other layers are)


@dataclass(frozen=True)
class CastCost:
    """A recomputation that stops at its first save: ``fixed_ms`` (the early stop's own cost) plus ``per_byte_ms``
    for every byte its casts make again (the bytes wrapping the layer frees)."""

    fixed_ms: float
    per_byte_ms: float

    def of(self, freed_bytes: float, calls: float) -> float:
        return calls * self.fixed_ms + freed_bytes * self.per_byte_ms


def cast_cost(dtype: str) -> CastCost:
    """The cost of a stopped recomputation under autocast of ``dtype`` (``"bfloat16"``) on this host's CPU,
    measured once per process (cached)."""
    return calibrated(_CACHE, dtype, lambda: _measure(getattr(torch, dtype)))


def _measure(dtype: torch.dtype) -> CastCost:
    with seeded_rng():
        points = [_recompute_ms(width, dtype) for width in _WIDTHS]
    (small_bytes, small_ms), (large_bytes, large_ms) = points
    per_byte = max(0.0, (large_ms - small_ms) / (large_bytes - small_bytes))
    return CastCost(max(0.0, small_ms - per_byte * small_bytes), per_byte)


def _recompute_ms(width: int, dtype: torch.dtype) -> tuple[int, float]:
    """(bytes of the weight's copy, the median ms of its recomputation) for a wrapped Linear(width, width)."""
    layer = nn.Linear(width, width, bias=False)
    x = torch.randn(_ROWS, width, dtype=dtype, requires_grad=True)
    filler = torch.ones(_FILLER)
    own = wrap(layer, "layer")
    times = []
    try:
        for repeat in range(_REPEATS + 2):
            filler.mul_(1.0)
            with RecomputeTimer() as timer:
                with torch.autocast("cpu", dtype=dtype):
                    out = layer(x)
                filler.mul_(1.0)
                out.float().sum().backward()
            if repeat >= 2:
                times.append(timer.ms.get("layer", 0.0))
    finally:
        unwrap(layer, own)
    return width * width * dtype.itemsize, statistics.median(times)
