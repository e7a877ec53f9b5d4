"""What a one-shot profile costs outside the step: set-up and tear-down per module, and JSON out and in.

    python benchmarks/setup_cost.py [--repeats 5]

Models: 500 and 3,333 x Sequential(Linear(16, 16), ReLU) (1,501 and 10,000 modules). Set-up is ``__enter__``
(record tree, the default params meter, hooks on every module), tear-down ``__exit__`` with nothing run inside
(hooks off, statistics and meters filled, the Profile made); the median is over blocks on a model profiled
before (what the block reuses from the last one, ``collect/reuse.py``), the first block's figure beside it; JSON is ``to_json`` and ``layerprof.loads`` of a
profiled step of the 10,000-module model. Then the phases of a one-shot profile with a training step inside, on
the 1,501-module model: ``LayerProf(model)`` (which includes freeing the previous round's profile, dropped by the
assignment: a dropped profile is freed then, not by a later garbage collection), entering, the step (beside a
plain step), leaving. Medians of
``--repeats`` rounds (three times as many for the phases), one thread. Times are CPU time of this process
(``time.process_time``), which a machine shared with other work disturbs less than the wall clock.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import nn

import layerprof
from layerprof import LayerProf


def deep(blocks: int) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(blocks)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # "recorded no step": nothing runs inside these blocks on purpose
    print(f"torch {torch.__version__}, layerprof {layerprof.__version__}, median of {args.repeats} rounds")
    for blocks in (500, 3333):
        model = deep(blocks)
        modules = len(list(model.modules()))
        enter, leave = [], []
        first = 0.0
        for round_ in range(args.repeats + 1):  # round 0: the first block on this model, nothing to reuse yet
            prof = LayerProf(model)
            start = time.process_time()
            prof.__enter__()
            middle = time.process_time()
            prof.__exit__(None, None, None)
            end = time.process_time()
            if round_ == 0:
                first = end - start
                continue
            enter.append(middle - start)
            leave.append(end - middle)
        e, x = statistics.median(enter), statistics.median(leave)
        print(f"{modules} modules: enter {e * 1e3:.0f} ms, exit {x * 1e3:.0f} ms, "
              f"set-up + tear-down {(e + x) / modules * 1e6:.1f} µs per module "
              f"(the first block on the model: {first / modules * 1e6:.1f} µs per module)")
    phases(deep(500), 3 * args.repeats)
    with LayerProf(model) as prof:
        model(torch.randn(2, 16)).sum().backward()
    dump, load = [], []
    for _ in range(args.repeats):
        start = time.process_time()
        text = prof.to_json()
        middle = time.process_time()
        layerprof.loads(text)
        dump.append(middle - start)
        load.append(time.process_time() - middle)
    print(f"{modules} modules: to_json {statistics.median(dump) * 1e3:.0f} ms ({len(text) / 1e6:.1f} MB), "
          f"loads {statistics.median(load) * 1e3:.0f} ms")


def phases(model: nn.Module, repeats: int) -> None:
    """Per module: what constructing, entering, the step inside and leaving a one-shot profile cost."""
    x = torch.randn(4, 16)
    clock = time.process_time
    samples: dict[str, list[float]] = {key: [] for key in ("plain", "init", "enter", "step", "exit")}
    for round_ in range(repeats + 3):
        model.zero_grad(set_to_none=True)
        start = clock()
        model(x).sum().backward()
        plain = clock() - start
        model.zero_grad(set_to_none=True)
        t0 = clock()
        prof = LayerProf(model)
        t1 = clock()
        prof.__enter__()
        t2 = clock()
        model(x).sum().backward()
        t3 = clock()
        prof.__exit__(None, None, None)
        t4 = clock()
        if round_ >= 3:  # the first rounds warm up
            for key, value in zip(samples, (plain, t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                samples[key].append(value)
    medians = {key: statistics.median(values) for key, values in samples.items()}
    modules = len(list(model.modules()))
    per = {key: value / modules * 1e6 for key, value in medians.items()}
    print(f"{modules} modules, one-shot with a step inside, µs per module: LayerProf() {per['init']:.1f}, "
          f"enter {per['enter']:.1f}, step +{per['step'] - per['plain']:.1f} (plain step {medians['plain'] * 1e3:.1f} "
          f"ms), exit {per['exit']:.1f}; in all +{per['init'] + per['enter'] + per['step'] - per['plain'] + per['exit']:.1f}")


if __name__ == "__main__":
    main()
