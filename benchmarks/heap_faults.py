"""Where a checkpoint plan's page faults come from: glibc's heap, step by step (Linux with glibc only), one thread.

    python benchmarks/heap_faults.py [--model albert] [--budget 0.25] [--pairs 15] [--trim-threshold BYTES]
                                     [--wrap MODULE]
    GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432 \\
        python benchmarks/heap_faults.py

A zoo model at the ``bench`` size (``tests/checkpoint_zoo.py``), profiled (the profile's clock on thread CPU time,
so that a shared machine does not inflate the prediction) and planned at ``--budget``; then ``--pairs`` pairs of
steps, plain and with the plan, alternating. Each step reads the process's minor page faults (``getrusage``) and
glibc's ``mallinfo2()`` at its start, when the model's forward returns, around the first recomputation in backward
(the plan's last wrapped call; ``RecomputeTimer`` with a clock that reads them) and at its end. Printed, medians over
the pairs: the faults in forward and in backward, the recomputation's own; the heap's size (``arena``) at each point;
the heap's free bytes (``fordblks``) at the recomputation's start against the bytes it holds when it ends
(``uordblks`` after less before); the free chunks by size when forward returns in the last step with the plan
(``malloc_info``, the main arena); the paired extra time (thread CPU time) against the plan's prediction.
``--wrap MODULE`` wraps that one module by hand instead of the plan (BERT's ``encoder``: a plan no budget makes).

``--trim-threshold BYTES`` sets glibc's trim threshold with ``mallopt`` after the warm-up steps: the heap's top is then
never given back, and the mmap threshold stays where glibc's dynamic rule had moved it (the environment variables
``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_TOP_PAD_`` at start-up instead fix it at 128 KiB, and every tensor above that is
mapped afresh each step). A diagnosis: the planner leaves the allocator as it is, and so does the benchmark unless
``--keep-heap``.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import re
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import layerprof.collect.clock as clock  # noqa: E402
from layerprof import LayerProf  # noqa: E402
from layerprof.plan.apply import RecomputeTimer, unwrap, wrap  # noqa: E402
from tests.checkpoint_zoo import ZOO, zoo_step  # noqa: E402

M_TRIM_THRESHOLD = -1  # mallopt's parameter number in glibc's malloc.h
KEPT = 2 ** 30  # a trim threshold above any heap here: its top is never given back
MIB = 2 ** 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=None)
def _glibc() -> ctypes.CDLL:
    """The C library, its malloc functions typed; glibc only (loaded when first needed, so that importing this
    module, as ``checkpoint_plan.py`` does, works anywhere)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    return libc


def keep_heap(threshold: int = KEPT) -> None:
    """Set glibc's trim threshold so that its heap's top is not given back to the system (``mallopt``). Call it after
    a model's first steps: it also stops glibc moving its mmap threshold, which stays where those steps left it."""
    if _glibc().mallopt(M_TRIM_THRESHOLD, threshold) != 1:
        raise RuntimeError(f"mallopt(M_TRIM_THRESHOLD, {threshold}) failed")


def _point() -> tuple[int, int, int, int]:
    """(minor faults, heap size, heap bytes in use, heap bytes free) now."""
    info = _glibc().mallinfo2()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt, info.arena, info.uordblks, info.fordblks


def free_chunks() -> list[tuple[int, int, int, int]]:
    """The main arena's free chunks by size class: (from, to, total bytes, count), from ``malloc_info``."""
    buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
    libc = _glibc()
    stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    main = buffer.value.decode().split('<heap nr="1">')[0]
    found = re.findall(r'<size from="(\d+)" to="(\d+)" total="(\d+)" count="(\d+)"/>', main)
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in found]


class _Probe:
    """The RecomputeTimer's clock: a reading at each of its stamps (four a wrapped call in forward, two around each
    recomputation)."""

    def __init__(self) -> None:
        self.points: list[tuple[int, int, int, int]] = []

    def __call__(self) -> float:
        self.points.append(_point())
        return time.thread_time()


def run_step(model: torch.nn.Module, step: Any, plan: Any | None,
             chunks: list[tuple[int, int, int, int]] | None = None) -> dict[str, float]:
    """One zoo step (gradients cloned at its end), read at its start, when the model's forward returns, around the
    first recomputation in backward and at its end. ``chunks``: filled with the free chunks when forward returns."""
    probe = _Probe()
    forward: list[tuple[int, int, int, int]] = []
    backward_start = [0]

    def returned(module: torch.nn.Module, args: Any, output: Any) -> None:
        forward.append(_point())
        backward_start[0] = len(probe.points)
        if chunks is not None:
            chunks.extend(free_chunks())

    handle = model.register_forward_hook(returned)
    try:
        start_time, start = time.thread_time(), _point()
        with (plan.applied(model) if plan is not None else contextlib.nullcontext()), RecomputeTimer(clock=probe):
            step()
        end, ms = _point(), (time.thread_time() - start_time) * 1e3
    finally:
        handle.remove()
    found = dict(ms=ms, forward_faults=forward[0][0] - start[0], arena_start=start[1], arena_forward=forward[0][1],
                 free_forward=forward[0][3], arena_end=end[1], backward_faults=end[0] - forward[0][0])
    recomputed = probe.points[backward_start[0]:backward_start[0] + 2]  # the first recomputation in backward
    if len(recomputed) == 2:
        (f0, a0, u0, free0), (f1, a1, u1, _) = recomputed
        found.update(recompute_faults=f1 - f0, arena_recompute_start=a0, arena_recompute_end=a1,
                     free_at_recompute=free0, recompute_holds=u1 - u0)
    return found


class Wrapped:
    """One module wrapped by hand, used where a plan is: ``applied(model)`` wraps it inside the block."""

    extra_ms = None

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        own = wrap(self.module, label="wrapped")
        try:
            yield model
        finally:
            unwrap(self.module, own)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="albert", choices=sorted(ZOO))
    parser.add_argument("--budget", type=float, default=0.25)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--trim-threshold", type=int, default=None, help="mallopt(M_TRIM_THRESHOLD) after warm-up")
    parser.add_argument("--wrap", default=None, metavar="MODULE",
                        help="wrap this module (its name in the model) instead of the plan; nothing is predicted")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, got {args.pairs}")
    if not 0.0 < args.budget <= 1.0:
        parser.error(f"--budget is a share of today's saved bytes, in (0, 1], got {args.budget}")
    torch.set_num_threads(1)
    clock.CpuClock.now = staticmethod(time.thread_time_ns)  # the profile in thread CPU time, as the check's steps
    model, step = zoo_step(args.model, "bench")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("memory",)) as prof:
            for _ in range(3):
                step()
                prof.step()
    if args.wrap is None:
        plan: Any = prof.checkpoint_plan(args.budget, allow_side_effects=ZOO[args.model].allow_side_effects)
        print(f"{args.model} at {args.budget:.0%}: {sorted(plan.modules)}, +{plan.extra_ms:.1f} ms predicted")
    else:
        plan = Wrapped(model.get_submodule(args.wrap))
        print(f"{args.model}: {args.wrap} wrapped by hand")
    for _ in range(2):
        run_step(model, step, None)
        run_step(model, step, plan)
    if args.trim_threshold is not None:
        keep_heap(args.trim_threshold)
        print(f"mallopt(M_TRIM_THRESHOLD, {args.trim_threshold}) set after the warm-up steps")
    rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    chunks: list[tuple[int, int, int, int]] = []
    for index in range(args.pairs):
        for planned in ((False, True) if index % 2 == 0 else (True, False)):
            last = index == args.pairs - 1 and planned
            rows[planned].append(run_step(model, step, plan if planned else None, chunks if last else None))
    extra = statistics.median(p["ms"] - b["ms"] for p, b in zip(rows[True], rows[False]))
    predicted = "" if plan.extra_ms is None else f", +{plan.extra_ms:.1f} predicted"
    print(f"extra step time: +{extra:.1f} ms measured (thread CPU time){predicted}")
    for planned, label in ((False, "plain"), (True, "with the plan")):
        got = {key: statistics.median(r[key] for r in rows[planned]) for key in rows[planned][0]}
        line = (f"{label:14s} faults: forward {got['forward_faults']:.0f}, backward {got['backward_faults']:.0f}"
                f"; heap MiB at start {got['arena_start'] / MIB:.1f}, after forward {got['arena_forward'] / MIB:.1f} "
                f"({got['free_forward'] / MIB:.1f} free), at the end {got['arena_end'] / MIB:.1f}")
        if "recompute_faults" in got:
            line += (f"\n{'':14s} recomputation: faults {got['recompute_faults']:.0f}, heap MiB "
                     f"{got['arena_recompute_start'] / MIB:.1f} -> {got['arena_recompute_end'] / MIB:.1f}; free at its "
                     f"start {got['free_at_recompute'] / MIB:.1f} MiB, held at its end "
                     f"{got['recompute_holds'] / MIB:.1f} MiB more")
        print(line)
    print("free chunks when forward returned (the last step with the plan; size classes holding 256 KiB or more): "
          + ", ".join(f"{count} of {low / 1024:.0f}-{high / 1024:.0f} KiB ({total / MIB:.1f} MiB)"
                      for low, high, total, count in chunks if total >= 256 * 1024))


if __name__ == "__main__":
    main()
