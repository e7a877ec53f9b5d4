"""Resident memory over many profiled steps: does profiling a long run grow without bound?

    python benchmarks/memory_soak.py [--steps 10000] [--mode loop,one-shot]

A small MLP (6 modules) trained for ``--steps`` steps; the process's resident set size is read every tenth of
the run. ``loop``: one ``LayerProf`` with ``prof.step()`` after each step (every step recorded): per-module
statistics keep running sums and a bounded reservoir of step values (``max_samples``, 1,024 by default), so memory
should level off once the reservoirs are full. ``one-shot``: a fresh ``with LayerProf(model)`` around every step,
each profile dropped after it: what a profile keeps between blocks (the parameter figures of the model) must not
grow with the number of blocks.
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


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def soak(steps: int, one_shot: bool) -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    readings = []

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    start = time.perf_counter()
    if one_shot:
        for step in range(steps):
            with LayerProf(model) as prof:
                train_step()
            if step % max(1, steps // 10) == 0 or step == steps - 1:
                readings.append((step + 1, rss_mib()))
    else:
        with LayerProf(model) as prof:
            for step in range(steps):
                train_step()
                prof.step()
                if step % max(1, steps // 10) == 0 or step == steps - 1:
                    readings.append((step + 1, rss_mib()))
    elapsed = time.perf_counter() - start
    how = "one-shot profiles (a fresh with-block per step)" if one_shot else "profiled steps in one LayerProf"
    print(f"{steps} {how} of a 6-module MLP in {elapsed:.1f} s; resident memory (MiB) by step:")
    print("  " + ", ".join(f"{step}: {mib:.1f}" for step, mib in readings))
    settled = 1024 if not one_shot else min(steps, 1001)
    first_full = next((mib for step, mib in readings if step >= settled), readings[-1][1])
    print(f"growth from step {settled:,} on: {readings[-1][1] - first_full:+.1f} MiB; steps recorded in the last "
          f"profile: {prof.tree.steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--mode", default="loop,one-shot", help="comma-separated: loop, one-shot")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for mode in args.mode.split(","):
        if mode not in ("loop", "one-shot"):
            parser.error(f"--mode: unknown mode {mode!r}; choose from loop, one-shot")
        soak(args.steps, one_shot=mode == "one-shot")


if __name__ == "__main__":
    main()
