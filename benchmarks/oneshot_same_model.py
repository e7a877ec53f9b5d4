"""A one-shot block against a profiler that stays on, both on one model: what the block's step and its own work cost.

    python benchmarks/oneshot_same_model.py [--rounds 60] [--models bert,resnet18,deep]

``overhead.py`` runs the profiler that stays on (its "steady" figure) on one copy of the model and the one-shot block
on a twin, because one model cannot carry both at once; each ratio is to its own copy's plain step. A step right after
a step of the other copy reads slower (measured here: 2-7 % on BERT, two identical plain steps), so that design leaves
a few percent of doubt in a quotient judged at 1.05. Here everything runs on one model, one thread, in the orders of a
balanced design (``overhead.balanced_orders``), each round:

- plain: a step without layerprof;
- one-shot: a fresh ``with LayerProf(model)`` around the step, timed whole (set-up, step, tear-down, the dropped
  profile freed), and the step inside it alone ("in-block step");
- steady: a ``LayerProf`` with ``schedule(wait=1, active=1)``, entered untimed; one wait and one profiled step
  untimed (so the timed profiled step is not its first); then a wait step and a profiled step, each timed; the
  block's end untimed. Hooks go on and off in ``prof.step()``, outside the timed steps, as in ``overhead.py``.

Figures: each as a ratio to the plain step (CPU time of the process, medians), the one-shot block over the profiled
step of the profiler that stays on (the cost issue's one-shot / steady quotient), the in-block step over that step,
and, in one more pass of 200 blocks after a plain step each (``time.perf_counter``), where the block's own time goes:
``LayerProf()``, ``__enter__``, ``__exit__`` and freeing the dropped profile.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any, Callable

import torch

import layerprof
from layerprof import LayerProf
from overhead import balanced_orders, bert, deep_stack, machine, resnet18

_clock = time.process_time


def measure(name: str, model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {key: [] for key in
                                       ("plain", "oneshot", "in_block", "steady_wait", "steady")}

    def timed() -> float:
        model.zero_grad(set_to_none=True)
        start = _clock()
        loss_fn().backward()
        return _clock() - start

    def plain() -> None:
        samples["plain"].append(timed())

    def oneshot() -> None:
        model.zero_grad(set_to_none=True)
        start = _clock()
        with LayerProf(model):
            inner = _clock()
            loss_fn().backward()
            samples["in_block"].append(_clock() - inner)
        samples["oneshot"].append(_clock() - start)  # (the dropped profile freed as the block's value goes)

    def steady() -> None:
        with LayerProf(model, schedule=layerprof.schedule(wait=1, active=1)) as prof:
            for key in (None, None, "steady_wait", "steady"):  # wait, profiled, wait, profiled
                took = timed()
                if key is not None:
                    samples[key].append(took)
                prof.step()
                gc.collect(1)

    variants: dict[str, Callable[[], None]] = {"plain": plain, "oneshot": oneshot, "steady": steady}
    for _ in range(3):  # warm: the plan made, every path run once
        for run in variants.values():
            run()
    for values in samples.values():
        values.clear()
    orders = balanced_orders(list(variants))
    for round_ in range(rounds):
        for key in orders[round_ % len(orders)]:
            variants[key]()
            gc.collect(1)  # what a variant left for the collector, collected untimed
    medians = {key: statistics.median(values) for key, values in samples.items()}
    result = {"plain_ms": medians["plain"] * 1e3}
    result.update({f"{key}_ratio": medians[key] / medians["plain"] for key in samples if key != "plain"})
    result["oneshot_over_steady"] = medians["oneshot"] / medians["steady"]
    result["in_block_over_steady"] = medians["in_block"] / medians["steady"]
    result.update(phases(model, loss_fn))
    print(f"{name}: plain step {result['plain_ms']:.2f} ms; ratios to it: one-shot block "
          f"{result['oneshot_ratio']:.3f}, in-block step {result['in_block_ratio']:.3f}, steady profiled step "
          f"{result['steady_ratio']:.3f} (its wait step {result['steady_wait_ratio']:.3f})")
    print(f"  one-shot / steady {result['oneshot_over_steady']:.3f}; in-block step / steady "
          f"{result['in_block_over_steady']:.3f}; the block's own time, µs: LayerProf() {result['init_us']:.0f}, "
          f"enter {result['enter_us']:.0f}, exit {result['exit_us']:.0f}, free {result['free_us']:.0f} "
          f"(sum {result['own_us']:.0f}, {result['own_us'] / 10 / result['plain_ms']:.1f} % of the plain step)",
          flush=True)
    return result


def phases(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], blocks: int = 200) -> dict[str, float]:
    """Where a one-shot block's own time goes, each block right after a plain step (wall clock, medians)."""
    clock = time.perf_counter
    taken: dict[str, list[float]] = {key: [] for key in ("init_us", "enter_us", "exit_us", "free_us")}
    for _ in range(blocks):
        model.zero_grad(set_to_none=True)
        loss_fn().backward()
        gc.collect(1)
        model.zero_grad(set_to_none=True)
        start = clock()
        prof: Any = LayerProf(model)
        made = clock()
        prof.__enter__()
        entered = clock()
        loss_fn().backward()
        stepped = clock()
        prof.__exit__(None, None, None)
        exited = clock()
        del prof
        freed = clock()
        for key, took in zip(taken, (made - start, entered - made, exited - stepped, freed - exited)):
            taken[key].append(took * 1e6)
        gc.collect(1)
    result = {key: statistics.median(values) for key, values in taken.items()}
    result["own_us"] = sum(result.values())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--models", default="bert", help="comma-separated subset of bert,resnet18,deep")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    factories = {"bert": ("bert 2x128 s32 b8", bert), "resnet18": ("resnet18 b2", resnet18),
                 "deep": ("500 x Sequential(Linear(16,16), ReLU)", deep_stack)}
    unknown = set(args.models.split(",")) - set(factories)
    if unknown:
        parser.error(f"--models: unknown {sorted(unknown)}; choose from {sorted(factories)}")
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, process CPU time; machine: {machine()}")
    for key in args.models.split(","):
        name, factory = factories[key]
        model, loss_fn = factory()
        measure(name, model, loss_fn, args.rounds)


if __name__ == "__main__":
    main()
