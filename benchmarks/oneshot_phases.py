"""Where a one-shot block's extra cost goes: its phases beside a steady profiled step, on one model.

    python benchmarks/oneshot_phases.py [--repeats 40] [--model bert|deep] [--after plain|torch.profiler]
        [--no-collect]

Each round, interleaved as in ``overhead.py``: a plain step and a steady profiled step on the model (one LayerProf
with ``schedule(wait=1, active=1)``), then on an identical twin a plain step and a one-shot block timed by phase:
``LayerProf(model)``, ``__enter__``, the step inside, ``__exit__``, and freeing the dropped profile. The step
inside is given as its extra over the twin's plain step, beside the steady step's extra over the model's plain
step. Garbage collections are timed with ``gc.callbacks`` (layerprof pauses collection while it builds, so a
block's collections fall in its step). CPU time of this process, medians of ``--repeats`` rounds after 3 warm-up
rounds, one thread. ``--after torch.profiler`` runs a step of the twin under torch.profiler (Python stacks) right
before the block, as ``overhead.py``'s balanced orders place a peer before it in some rounds; ``--no-collect``
leaves out the ``gc.collect(1)`` between steps. Models as in ``overhead.py``: BERT 2 layers (hidden 128, sequence
32, batch 8) or the 1,501-module deep stack.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import torch

import layerprof
from layerprof import LayerProf
from overhead import TorchProfiler, bert, deep_stack

_clock = time.process_time


class CollectionTimer:
    """CPU time spent in garbage collections since the last ``reset``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = _clock()
        else:
            self.total += _clock() - self._started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--model", choices=("bert", "deep"), default="bert")
    parser.add_argument("--after", choices=("plain", "torch.profiler"), default="plain",
                        help="the twin's step right before the one-shot block: a plain one (the default), or one "
                             "under torch.profiler with Python stacks, as overhead.py's shuffle can place it")
    parser.add_argument("--no-collect", action="store_true",
                        help="no gc.collect(1) between the steps: collections fall where the steps leave them")
    args = parser.parse_args()
    collect = (lambda: None) if args.no_collect else (lambda: gc.collect(1))
    torch.set_num_threads(1)
    factory = bert if args.model == "bert" else deep_stack
    torch.manual_seed(0)
    model, loss = factory()
    torch.manual_seed(0)
    twin, twin_loss = factory()
    twin.load_state_dict(model.state_dict())
    collections = CollectionTimer()
    gc.callbacks.append(collections)
    keys = ("plain", "steady", "twin_plain", "init", "enter", "step", "exit", "free", "collections")
    samples: dict[str, list[float]] = {key: [] for key in keys}
    steady = LayerProf(model, schedule=layerprof.schedule(wait=1, active=1))
    steady.start()
    try:
        for round_ in range(args.repeats + 3):
            values = []
            for profiled in (False, True):  # a wait step, then an active one
                model.zero_grad(set_to_none=True)
                start = _clock()
                loss().backward()
                values.append(_clock() - start)
                steady.step()
                collect()
            twin.zero_grad(set_to_none=True)
            start = _clock()
            twin_loss().backward()
            values.append(_clock() - start)
            collect()
            if args.after == "torch.profiler":
                twin.zero_grad(set_to_none=True)
                with TorchProfiler(twin):
                    twin_loss().backward()
                collect()
            twin.zero_grad(set_to_none=True)
            collections.total = 0.0
            t0 = _clock()
            prof = LayerProf(twin)
            t1 = _clock()
            prof.__enter__()
            t2 = _clock()
            twin_loss().backward()
            t3 = _clock()
            prof.__exit__(None, None, None)
            t4 = _clock()
            del prof
            t5 = _clock()
            values += [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, collections.total]
            collect()
            if round_ >= 3:
                for key, value in zip(keys, values):
                    samples[key].append(value)
    finally:
        steady.stop()
        gc.callbacks.remove(collections)
    m = {key: statistics.median(values) * 1e6 for key, values in samples.items()}
    steady_extra = m["steady"] - m["plain"]
    step_extra = m["step"] - m["twin_plain"]
    outside = m["init"] + m["enter"] + m["exit"] + m["free"]
    ratio = (m["twin_plain"] + outside + step_extra) / m["twin_plain"] / (m["steady"] / m["plain"])
    between = "no collections between steps" if args.no_collect else "gc.collect(1) between steps"
    print(f"torch {torch.__version__}, {args.model}, medians of {args.repeats} rounds, CPU time, µs; the block after "
          f"a {args.after} step, {between}")
    print(f"plain step {m['plain']:.0f} (twin {m['twin_plain']:.0f}); steady step +{steady_extra:.0f} "
          f"({m['steady'] / m['plain']:.3f})")
    print(f"one-shot: LayerProf() {m['init']:.0f}, enter {m['enter']:.0f}, step +{step_extra:.0f} (steady's "
          f"{step_extra - steady_extra:+.0f}), exit {m['exit']:.0f}, freeing {m['free']:.0f}; outside the step "
          f"{outside:.0f}; collections in the block {m['collections']:.0f} (mean "
          f"{statistics.mean(samples['collections']) * 1e6:.0f})")
    print(f"one-shot step / steady step, from the medians of the phases: {ratio:.3f}")


if __name__ == "__main__":
    main()
