"""How much ``wrap_cost()`` moves within a process and from one process to the next, one thread.

    python benchmarks/wrap_cost_spread.py [--processes 6] [--calibrations 3]

Every process (fresh, one after another, as the planner's users and ``checkpoint_plan.py`` run) calibrates
``--calibrations`` times, emptying the cache between; printed per process: each calibration's ms a call and µs a
saved tensor, and the ms of a wrapper over three saved tensors (what a ``[1:3]`` run of the MLP in
``tests/checkpoint_zoo.py`` is priced). At the end: the spread of that figure within processes (the largest range
in one) and over all of them, and the median. A prediction moves with the calibration of the process that made it,
so the spread over all is how far the same plan's predicted wrapper cost moves from process to process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TENSORS = 3  # a GELU's input, a Linear's input and weight: the MLP's [1:3] run

_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from layerprof.plan import wrap_cost as module
found = []
for _ in range({calibrations}):
    module._CACHE.clear()
    cost = module.wrap_cost()
    found.append((cost.per_call_ms, cost.per_tensor_ms))
print(json.dumps(found))
"""


def calibrate(calibrations: int) -> list[tuple[float, float]]:
    """``calibrations`` (ms a call, ms a saved tensor) measured in one fresh process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _CHILD.format(calibrations=calibrations)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return [tuple(pair) for pair in json.loads(out.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--calibrations", type=int, default=3, help="calibrations in each process")
    args = parser.parse_args()
    ranges, every = [], []
    for index in range(args.processes):
        found = calibrate(args.calibrations)
        priced = [call + TENSORS * tensor for call, tensor in found]
        ranges.append(max(priced) - min(priced))
        every += priced
        print(f"process {index + 1}: " + "; ".join(f"{call:.3f} ms + {tensor * 1e3:.1f} us = {price:.3f} ms"
                                                   for (call, tensor), price in zip(found, priced)), flush=True)
    print(f"\na wrapper over {TENSORS} saved tensors: median {statistics.median(every):.3f} ms; range within a "
          f"process up to {max(ranges):.3f} ms; over all {min(every):.3f} to {max(every):.3f} ms; load average "
          f"{' '.join(f'{value:.2f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
