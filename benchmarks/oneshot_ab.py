"""A one-shot block's cost outside its step, two versions of layerprof side by side: old against new, paired.

    python benchmarks/oneshot_ab.py OLD NEW [--rounds 30] [--only bert,linear_cold,linear_warm,cached10k]

OLD and NEW are folders holding a ``layerprof`` package (a worktree, or ``git archive REV layerprof | tar -x -C
DIR``). Each runs in a process of its own, started once and kept (so both stay warm); every round asks both for
each figure, in the order old-new on even rounds and new-old on odd ones (a linear drift of the machine cancels
over two rounds), and the paired difference new - old is taken per round. Printed per figure: both medians, the
median of the differences and their quartiles. Figures, CPU time of the process (``time.process_time``), one
thread, median of a few blocks per round:

- ``bert``: ``LayerProf()``, ``__enter__``, ``__exit__`` and freeing the dropped profile of a block around a training
  step of the 2-layer BERT of ``overhead.py`` (its step not counted), each block right after a plain step (what
  a one-shot block pays: the machine's caches hold the step's data then, not layerprof's);
- ``linear_cold``: the same for a one-module ``nn.Linear(16, 16)`` after a BERT step: the fixed cost of a block;
- ``linear_warm``: 200 blocks around a step of that Linear, less 200 plain steps, per block (all warm);
- ``cached10k``: ``__enter__`` + ``__exit__`` of an empty block on the 10,000-module stack of ``setup_cost.py``,
  whose plan an earlier block made, per module.

A version's own run-to-run spread shows in the quartiles; on a loaded machine the medians move together, and the
paired differences are the figure to read.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
FIGURES = {"bert": 3, "linear_cold": 3, "linear_warm": 2, "cached10k": 3}  # figure -> blocks (rounds) per ask


def _serve() -> None:
    """The child: answers ``FIGURE BLOCKS`` lines with a JSON median, for the layerprof on its path."""
    import torch
    from torch import nn

    sys.path.insert(0, str(HERE))
    import layerprof
    from layerprof import LayerProf
    from overhead import bert

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the empty blocks record no step, on purpose
    clock = time.process_time_ns
    torch.manual_seed(0)
    bert_model, bert_loss = bert()
    linear = nn.Linear(16, 16)
    x = torch.randn(4, 16)

    def linear_loss() -> Any:
        return linear(x).sum()

    stack = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(3333)])
    stack_modules = len(list(stack.modules()))

    def outside(model: nn.Module, loss: Callable[[], Any], blocks: int) -> float:
        values = []
        for _ in range(blocks):
            bert_model.zero_grad(set_to_none=True)
            bert_loss().backward()
            gc.collect(1)
            model.zero_grad(set_to_none=True)
            start = clock()
            prof = LayerProf(model)
            prof.__enter__()
            entered = clock()
            loss().backward()
            stepped = clock()
            prof.__exit__(None, None, None)
            del prof
            values.append((entered - start + clock() - stepped) / 1e3)
            gc.collect(1)
        return statistics.median(values)

    def linear_warm(rounds: int) -> float:
        blocks, values = 200, []
        for _ in range(rounds):
            start = clock()
            for _ in range(blocks):
                linear_loss().backward()
            plain = clock() - start
            start = clock()
            for _ in range(blocks):
                with LayerProf(linear):
                    linear_loss().backward()
            values.append((clock() - start - plain) / blocks / 1e3)
        return statistics.median(values)

    def cached10k(blocks: int) -> float:
        values = []
        for _ in range(blocks):
            prof = LayerProf(stack)
            start = clock()
            prof.__enter__()
            prof.__exit__(None, None, None)
            values.append((clock() - start) / 1e3 / stack_modules)
            del prof
        return statistics.median(values)

    measure: dict[str, Callable[[int], float]] = {
        "bert": lambda n: outside(bert_model, bert_loss, n),
        "linear_cold": lambda n: outside(linear, linear_loss, n),
        "linear_warm": linear_warm,
        "cached10k": cached10k,
    }
    for _ in range(3):  # plans made, code warm
        for figure in measure.values():
            figure(1)
    print(json.dumps({"ready": layerprof.__file__}), flush=True)
    for line in sys.stdin:
        figure, blocks = line.split()
        print(json.dumps(measure[figure](int(blocks))), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--only", default=",".join(FIGURES), help="figures to measure, comma-separated")
    args = parser.parse_args()
    figures = [name for name in args.only.split(",") if name]
    unknown = sorted(set(figures) - set(FIGURES))
    if unknown:
        parser.error(f"unknown figures {unknown}: choose from {sorted(FIGURES)}")
    children = {}
    for side, folder in (("old", args.old), ("new", args.new)):
        if not (folder / "layerprof" / "__init__.py").is_file():
            parser.error(f"{side}: {folder} holds no layerprof package")
        env = dict(os.environ, PYTHONPATH=str(folder.resolve()))
        child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout is not None
        print(f"{side}: {json.loads(child.stdout.readline())['ready']}")
        children[side] = child

    def ask(side: str, figure: str) -> float:
        child = children[side]
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(f"{figure} {FIGURES[figure]}\n")
        child.stdin.flush()
        return float(json.loads(child.stdout.readline()))

    values: dict[str, dict[str, list[float]]] = {name: {"old": [], "new": []} for name in figures}
    for round_ in range(args.rounds):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for figure in figures:
            for side in order:
                values[figure][side].append(ask(side, figure))
    for child in children.values():
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    print(f"{args.rounds} rounds, medians; paired difference new - old with its quartiles")
    for figure in figures:
        old, new = values[figure]["old"], values[figure]["new"]
        differences = [b - a for a, b in zip(old, new)]
        low, _, high = statistics.quantiles(differences, n=4)
        unit = "µs a module" if figure == "cached10k" else "µs"
        print(f"{figure:12s} old {statistics.median(old):8.2f}  new {statistics.median(new):8.2f}  "
              f"new - old {statistics.median(differences):+8.2f} ({low:+.2f} .. {high:+.2f}) {unit}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        main()
