"""Diagnostics for a CUDA machine lent for a few minutes (about 1 minute in all): what the CUDA clock's pieces cost
per call, where the per-module cost of a profiled step on the GPU goes (CUDA events against a wall clock, on the
deep stack and ResNet-50 of ``benchmarks/gpu.py``), and whether a profile's step peak is the plain step's (GPT-2 at
batch 16 of ``tests/test_cuda.py``, with and without the shapes metric).

    python benchmarks/gpu_diag.py [--repeats 9]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import MODELS, _step  # noqa: E402
from layerprof import LayerProf, schedule  # noqa: E402
from layerprof.collect import clock as clocks  # noqa: E402
from layerprof.collect import tracker as tracker_module  # noqa: E402


def per_call_us(work: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        work()
    return (time.perf_counter() - start) * 1e6 / n


def clock_pieces() -> None:
    n = 4000
    cuda = torch.device("cuda")
    clock = clocks.CudaEventClock(cuda)
    new_us = per_call_us(lambda: torch.cuda.Event(enable_timing=True), n)
    fresh_us = per_call_us(clock.now, n)  # the pool is empty: a new event and its record
    torch.cuda.synchronize()
    events = list(clock._used)
    pairs = list(zip(events, events[1:]))
    start = time.perf_counter()
    for a, b in pairs:
        clock.ms(a, b)
    elapsed_us = (time.perf_counter() - start) * 1e6 / len(pairs)
    clock.recycle()
    pooled_us = per_call_us(clock.now, n)  # from the pool: the record alone
    torch.cuda.synchronize()
    wall_us = per_call_us(time.perf_counter_ns, n)
    stream_us = per_call_us(lambda: torch.cuda.current_stream(), n)
    print(f"clock pieces (µs a call): new Event {new_us:.2f}; stamp with a new event {fresh_us:.2f}; stamp from the "
          f"pool {pooled_us:.2f}; elapsed_time {elapsed_us:.2f}; current_stream() {stream_us:.2f}; "
          f"perf_counter_ns {wall_us:.3f}", flush=True)


def steady(name: str, repeats: int) -> None:
    """Steady profiled steps against plain ones, with CUDA events and with the wall clock in their place."""
    model, loss_fn = MODELS[name]()
    modules = sum(1 for _ in model.modules())
    for _ in range(3):
        _step(model, loss_fn)
    cpu_start = time.perf_counter()
    for _ in range(5):
        model.zero_grad(set_to_none=True)
        loss_fn().backward()
    cpu_ms = (time.perf_counter() - cpu_start) * 1e3 / 5  # no synchronize: the host's side of a step
    torch.cuda.synchronize()
    figures = {}
    for label, patch in (("events", None), ("wall clock", lambda device, sync: clocks.CpuClock())):
        with mock.patch.object(tracker_module, "make_clock", patch) if patch else contextlib.nullcontext():
            prof = LayerProf(model, schedule=schedule(wait=1, active=1))
            plain, profiled, reads = [], [], []
            prof.start()
            try:
                for _ in range(repeats):
                    plain.append(_step(model, loss_fn))
                    prof.step()
                    profiled.append(_step(model, loss_fn))
                    start = time.perf_counter()
                    prof.step()  # the step's stamps are read here
                    reads.append(time.perf_counter() - start)
            finally:
                prof.stop()
        base = statistics.median(plain)
        figures[label] = (base, statistics.median(profiled) / base,
                          (statistics.median(profiled) - base) * 1e6 / modules,
                          statistics.median(reads) * 1e6 / modules)
    print(f"{name}: {modules} modules, host side of a step alone {cpu_ms:.2f} ms (5 steps after 3 warm-ups, no "
          f"synchronize); " + "; ".join(
              f"{label}: plain step {base * 1e3:.2f} ms, steady x{ratio:.3f}, {extra:.1f} µs a module in the step, "
              f"reading {read:.1f} µs a module after it" for label, (base, ratio, extra, read) in figures.items()),
          flush=True)


def gpt2_peaks() -> None:
    from layerprof.plan.verify import _cuda_peak
    from tests.checkpoint_zoo import ZOO
    from tests.models import scalar_loss

    torch.manual_seed(0)
    model, inputs = ZOO["gpt2"].build("bench")
    inputs = {key: value.repeat(8, 1).cuda() for key, value in inputs.items()}
    model = model.cuda().train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        scalar_loss(model(**inputs)).backward()

    step()
    for metrics in (("memory",), ("memory", "shapes"), ("memory",), ("memory", "shapes")):
        plain = _cuda_peak(step)
        with LayerProf(model, metrics=metrics) as prof:
            step()
        plan = prof.checkpoint_plan(0.5)
        print(f"gpt2 {'+'.join(metrics)}: plain peak {plain}, profiled {plan.profiled_peak_bytes} "
              f"({plan.profiled_peak_bytes - plain:+d}), at 50 %: predicted {plan.predicted_peak_bytes} "
              f"({plan.predicted_peak_phase} {plan.predicted_peak_at}), measured {_applied_peak(plan, model, step)}",
              flush=True)


def _applied_peak(plan: Any, model: torch.nn.Module, step: Callable[[], None]) -> int:
    from layerprof.plan.verify import _cuda_peak

    with plan.applied(model):
        return _cuda_peak(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    options = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_diag.py needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    gpt2_peaks()
    clock_pieces()
    for name in ("deep", "resnet50"):
        steady(name, options.repeats)


if __name__ == "__main__":
    main()
