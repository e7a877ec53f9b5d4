"""What a checkpoint wrapper costs in the zoo's MLP by what its region holds, against this process's calibration.

    python benchmarks/wrap_regions.py [--repeats 21] [--only "GELU"]

The MLP of ``tests/checkpoint_zoo.py`` at the ``bench`` size (256 rows, 512 wide; eight blocks of Linear, GELU,
Linear, Tanh), one thread. Each variant wraps the same region of blocks 1 to 7 (seven wrappers, one block apart, as
the zoo's 75 % plans do): a run of a block's children, or the whole block as a module. For each: the extra step
time (the median of ``--repeats`` paired differences in process CPU time, ``paired.py``), the recomputation in
backward and the wrappers' forward beyond their regions (``RecomputeTimer`` on thread CPU time, medians over as
many more steps), and what is left a call, the wrapper's own cost, beside its cold price in this process
(``wrap_cost()``: per call plus per tensor saved in the region, the tensors counted in a plain forward of one
region) and the steps' minor page faults (plain / wrapped). The planner prices each wrapper at the calibration
whatever its region holds; this shows whether what the region holds (how many tensors it saves, whether it
recomputes a large matrix product, whether checkpoint's early stop ends it) moves the cost. About a minute on a
2-core CPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layerprof.plan.apply import RecomputeTimer, unwrap, wrap, wrap_runs  # noqa: E402
from layerprof.plan.wrap_cost import wrap_cost  # noqa: E402
from tests.checkpoint_zoo import zoo_step  # noqa: E402

from benchmarks.paired import median_ci, run_pairs  # noqa: E402

BLOCKS = range(1, 8)  # the top-level Sequential's children 1..7: seven of the eight blocks
# (label, span of the block's children or None for the whole block as a module, checkpoint's early stop on)
VARIANTS: tuple[tuple[str, tuple[int, int] | None, bool], ...] = (
    ("[1:2] GELU", (1, 2), True),
    ("[1:3] GELU, Linear (the plans' run)", (1, 3), True),
    ("[1:3] early stop off", (1, 3), False),
    ("[0:2] Linear, GELU", (0, 2), True),
    ("[2:4] Linear, Tanh", (2, 4), True),
    ("[0:4] the block, as a module", None, True),
)


def saved_in(block: torch.nn.Module, span: tuple[int, int] | None, rows: int, width: int) -> int:
    """Tensors autograd saves in a plain forward of the region (the weights included)."""
    modules = list(block) if span is None else list(block)[span[0]:span[1]]
    count = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return tensor

    x = torch.randn(rows, width, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        for module in modules:
            x = module(x)
    return count[0]


def wrapped_step(model: torch.nn.Module, step: Callable[[], Any], span: tuple[int, int] | None
                 ) -> Callable[[], Any]:
    def run() -> Any:
        owned = []
        for index in BLOCKS:
            block = model[index]
            label = f"block{index}"
            owned.append((block, wrap(block, label=label) if span is None
                          else wrap_runs(block, [span], labels={span: label})))
        try:
            return step()
        finally:
            for block, own in reversed(owned):
                unwrap(block, own)
    return run


def measure(model: torch.nn.Module, step: Callable[[], Any], span: tuple[int, int] | None, early_stop: bool,
            repeats: int) -> dict[str, Any]:
    torch.utils.checkpoint.set_checkpoint_early_stop(early_stop)
    try:
        wrapped = wrapped_step(model, step, span)
        paired = run_pairs(step, {"wrapped": wrapped}, repeats)["wrapped"]
        inside = []
        for _ in range(repeats):
            with RecomputeTimer(clock=time.thread_time) as timer:
                wrapped()
            inside.append((sum(timer.ms.values()), sum(timer.wrapper_forward_ms.values())))
    finally:
        torch.utils.checkpoint.set_checkpoint_early_stop(True)
    return dict(extra=paired.median, ci=median_ci(paired.differences), faults=paired.median_faults,
                recompute=statistics.median(r for r, _ in inside), forward=statistics.median(f for _, f in inside))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="pairs of each variant's step (and as many "
                        "steps timed from inside)")
    parser.add_argument("--only", default="", help="run the variants whose label holds this text")
    args = parser.parse_args()
    if args.repeats < 6:
        parser.error("--repeats must be at least 6 (a 95 %% interval of the median needs 6 pairs)")
    torch.set_num_threads(1)
    model, step = zoo_step("mlp", "bench")
    for _ in range(3):
        step()
    cost = wrap_cost()
    calls = len(BLOCKS)
    first = model[BLOCKS[0]]
    rows, width = 256, first[0].in_features
    print(f"wrap_cost in this process: {cost.per_call_ms:.3f} ms a call (cold), {cost.per_tensor_ms * 1e3:.1f} µs "
          f"a saved tensor; {calls} wrappers a step")
    print(f"{'region':38s} {'tensors':>7s} {'extra ms (95 % interval)':>26s} {'recompute':>9s} {'wrapper fwd':>11s} "
          f"{'own a call':>10s} {'priced':>6s} {'ratio':>5s}  faults plain / wrapped")
    for label, span, early_stop in VARIANTS:
        if args.only and args.only not in label:
            continue
        tensors = saved_in(first, span, rows, width)
        found = measure(model, step, span, early_stop, args.repeats)
        own = (found["extra"] - found["recompute"]) / calls
        priced = cost.per_call_ms + tensors * cost.per_tensor_ms
        low, high = found["ci"]
        print(f"{label:38s} {tensors:7d} {found['extra']:8.2f} ({low:6.2f} to {high:6.2f}) "
              f"{found['recompute']:9.2f} {found['forward']:11.2f} {own:10.3f} {priced:6.3f} {own / priced:5.2f}  "
              f"{found['faults'][0]:.0f} / {found['faults'][1]:.0f}", flush=True)


if __name__ == "__main__":
    main()
