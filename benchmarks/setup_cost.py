"""What a one-shot profile costs outside the step: set-up and tear-down per module, and JSON out and in.

    python benchmarks/setup_cost.py [--repeats 5]

Models: 500 and 3,333 x Sequential(Linear(16, 16), ReLU) (1,501 and 10,000 modules). Set-up is ``__enter__``
(record tree, the default params meter, hooks on every module), tear-down ``__exit__`` with nothing run inside
(hooks off, statistics and meters filled, the Profile made); JSON is ``to_json`` and ``layerprof.loads`` of a
profiled step of the 10,000-module model. Medians of ``--repeats`` rounds, one thread. Times are CPU time of this
process (``time.process_time``), which a machine shared with other work disturbs less than the wall clock.
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
        for _ in range(args.repeats):
            prof = LayerProf(model)
            start = time.process_time()
            prof.__enter__()
            middle = time.process_time()
            prof.__exit__(None, None, None)
            end = time.process_time()
            enter.append(middle - start)
            leave.append(end - middle)
        e, x = statistics.median(enter), statistics.median(leave)
        print(f"{modules} modules: enter {e * 1e3:.0f} ms, exit {x * 1e3:.0f} ms, "
              f"set-up + tear-down {(e + x) / modules * 1e6:.1f} µs per module")
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


if __name__ == "__main__":
    main()
