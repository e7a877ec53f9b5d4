"""The live-bytes reader's own time per op, which a recomputation does not pay.

``metrics=("live_memory",)`` counts the CPU's live tensor bytes in a ``TorchDispatchMode`` that sees every op
(``layerprof.metrics.live_bytes``). It counts in the first profiled step only, which is left out of the times when
other steps were recorded; a profile of one step keeps it (``meta["timing_distorted_by"]``), and then every
module's forward holds the reader's time on each op inside it (a tiny GPT-2 layer's profiled forward: 1.6-2.0x its
figure under the memory meter alone, 16-20 µs an op, on a 2-core CPU). The memory meter counts those ops per
module (``live_forward_ops``), and the checkpoint planner prices a recomputation as the profiled forward less
``live_forward_ops x live_op_cost()``, as it takes off the hooks' ``hook_ms`` per module call.

``live_op_cost()`` times a loop of small ops that make new storages (a transformer layer's: linear, layer norm, GELU,
softmax, views, an add) with the reader open and without, in thread CPU time, in interleaved rounds (about 0.1 s,
once per process): the least watched round less the least bare one, per op the reader saw. Noise only adds time,
and a burst over a few rounds does not move the least of each; it moved a median of the rounds' differences: in
one CI run that came out at about 2.1x the reader's cost (as that run's test figures imply), which priced nearly
every recomputation of a live profile at 0 ms. The least reads a few percent below that median on an idle host
(15.4 against 16.1 µs an op, one calibration): the watched rounds vary more, partly with the reader's own work. It
errs on the side of taking less off a recomputation's price. Thread time, so that the figure
is the host's and not its load of the moment: on a loaded host the reader slows a profiled step more, in wall time,
than this takes off. The loop runs on one thread: the reader's cost is Python on the calling thread whatever the
thread count, and with more, a loaded host's spin-waits at the ops' thread barriers would land in the calling
thread's time, bare and watched alike, as noise.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .._threads import calibrated
from .._torch import seeded_rng
from ..metrics.live_bytes import LiveBytesReader

__all__ = ["live_op_cost"]

_CACHE: dict[str, float] = {}
_ROUNDS = 7  # the first is dropped (cold)
_LOOPS = 100


def _loop(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    # A transformer layer's kinds of op: a linear (t, addmm), a layer norm (three outputs), a GELU, a softmax over
    # a view, a residual add; most with several tensor arguments, whose storages the reader looks up.
    for _ in range(_LOOPS):
        y = F.linear(x, weight, bias)
        y = F.gelu(F.layer_norm(y, y.shape[-1:], bias, bias))
        y = x + F.softmax(y.view(2, -1), dim=-1).view_as(x)
        del y


def _round_ns(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              reader: LiveBytesReader | None) -> tuple[int, int]:
    """(thread ns of one loop, ops the reader saw in it: 0 without one)."""
    if reader is not None:
        reader.open()
    try:
        start = time.thread_time_ns()
        _loop(x, weight, bias)
        spent = time.thread_time_ns() - start
    finally:
        if reader is not None:
            reader.close()
    return spent, 0 if reader is None else reader.ops


def live_op_cost() -> float:
    """Milliseconds that the live-bytes reader adds to one op on this host's CPU (thread time), measured once per
    process (cached)."""
    return calibrated(_CACHE, "cpu", lambda: _measure())


def _measure() -> float:
    with seeded_rng(), torch.no_grad():
        x, weight, bias = torch.randn(8, 32), torch.randn(32, 32), torch.randn(32)
        bare, watched = [], []
        for index in range(_ROUNDS):
            spent, _ = _round_ns(x, weight, bias, None)
            seen, ops = _round_ns(x, weight, bias, LiveBytesReader())
            if index and ops:
                bare.append(spent / ops)
                watched.append(seen / ops)
    if not watched:
        raise RuntimeError("the live-bytes reader saw no op in any round: no cost per op to measure")
    return max(0.0, (min(watched) - min(bare)) / 1e6)
