"""The inner calls' walks made as the outermost call returns, against each made as its call returns: side by side.

    python benchmarks/deferred_walks.py [--rounds 150] [--models resnet18,bert,deep]

One process, one thread, the models of ``overhead.py``. Each round times, in an order that alternates between rounds,
a plain step and two one-shot blocks around a step: one as layerprof runs (the walks of the calls inside the
model's call wait for it to return), and one with no hook at ``torch.autograd``'s engine entry, so that every walk
is made as its call returns (what layerprof did before). The figure is the step inside the block (CPU time of the
process, the block's set-up and tear-down not counted), as a ratio to the median plain step; then, in one more
pass of each, the time spent in the walks per step (wall clock, ``time.perf_counter`` around each walk or batch
of walks). Both variants run the same code but for when the walks are made.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

import layerprof.collect.tracker as tracker_module
from layerprof import LayerProf
from overhead import bert, deep_stack, resnet18

_clock = time.process_time
_ADD_ENTRY = tracker_module.add_backward_entry_hook


def _each_as_it_returns(hook: Callable[[], None]) -> None:
    return None  # no entry hook: the tracker then walks every call as it returns


def _block_step(model: torch.nn.Module, step: Callable[[], Any], deferred: bool) -> float:
    tracker_module.add_backward_entry_hook = _ADD_ENTRY if deferred else _each_as_it_returns
    try:
        with LayerProf(model):
            start = _clock()
            step()
            return _clock() - start
    finally:
        tracker_module.add_backward_entry_hook = _ADD_ENTRY


def _walk_time(model: torch.nn.Module, step: Callable[[], Any], deferred: bool, steps: int) -> float:
    """Microseconds a step spends in walks (each walk, or each batch of walks put off, timed)."""
    spent = [0.0]
    walk, walk_all = tracker_module._walk, tracker_module._walk_all

    def timed(function: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            start = time.perf_counter()
            function(*args)
            spent[0] += time.perf_counter() - start
        return run

    tracker_module._walk, tracker_module._walk_all = timed(walk), timed(walk_all)
    try:
        for _ in range(steps):
            _block_step(model, step, deferred)
    finally:
        tracker_module._walk, tracker_module._walk_all = walk, walk_all
    return spent[0] / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--models", default="resnet18,bert,deep")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    factories = {"resnet18": resnet18, "bert": bert, "deep": deep_stack}
    for name in args.models.split(","):
        model, step = factories[name]()
        rounds = max(10, args.rounds // 10) if name == "resnet18" else args.rounds
        for _ in range(3):  # warm-up
            step()
            _block_step(model, step, True)
            _block_step(model, step, False)
        times: dict[str, list[float]] = {"plain": [], "deferred": [], "as each returns": []}
        for index in range(rounds):
            order = ["plain", "deferred", "as each returns"]
            if index % 2:
                order.reverse()
            for variant in order:
                if variant == "plain":
                    start = _clock()
                    step()
                    times[variant].append(_clock() - start)
                else:
                    times[variant].append(_block_step(model, step, variant == "deferred"))
        plain = statistics.median(times["plain"])
        walk_steps = max(5, rounds // 5)
        walks = {variant: _walk_time(model, step, variant == "deferred", walk_steps)
                 for variant in ("deferred", "as each returns")}
        print(f"{name}: plain step {plain * 1e3:.2f} ms, {rounds} rounds")
        for variant in ("deferred", "as each returns"):
            median = statistics.median(times[variant])
            print(f"  {variant:16s} step in a one-shot block {median * 1e3:.2f} ms, {median / plain:.3f} of plain; "
                  f"walks {walks[variant]:.0f} µs a step")


if __name__ == "__main__":
    main()
