"""Resident memory over many profiled steps: does profiling a long run grow without bound?

    python benchmarks/memory_soak.py [--steps 10000]

A small MLP (8 modules) trained for ``--steps`` steps under one ``LayerProf`` with ``prof.step()`` after each
(every step recorded); the process's resident set size is read every tenth of the run. Per-module statistics
keep running sums and a bounded reservoir of step values (``max_samples``, 1,024 by default), so memory should
level off once the reservoirs are full, whatever the number of steps.
"""
from __future__ import annotations

import argparse
import resource
import time

import torch
from torch import nn

from layerprof import LayerProf


def rss_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    readings = []
    start = time.perf_counter()
    with LayerProf(model) as prof:
        for step in range(args.steps):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            prof.step()
            if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
                readings.append((step + 1, rss_mib()))
    elapsed = time.perf_counter() - start
    print(f"{args.steps} profiled steps of an 8-module MLP in {elapsed:.1f} s; resident memory (MiB) by step:")
    print("  " + ", ".join(f"{step}: {mib:.1f}" for step, mib in readings))
    first_full = next((mib for step, mib in readings if step >= 1024), readings[-1][1])
    print(f"growth after the reservoirs filled (step 1,024 on): {readings[-1][1] - first_full:+.1f} MiB; "
          f"steps recorded: {prof.tree.steps}")


if __name__ == "__main__":
    main()
