"""Profile a DDP training step on every rank and compare the ranks.

    torchrun --nproc_per_node=2 examples/distributed_train.py            # CPU, gloo
    torchrun --nproc_per_node=2 examples/distributed_train.py --slow 1   # rank 1 sleeps 20 ms in layer2
    python examples/distributed_train.py                                 # no torch.distributed: one-rank view
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from layerprof import LayerProf


class Slowdown(nn.Module):
    """Identity, except on one rank where it sleeps: a stand-in for a slow host, a throttled GPU, a bad link."""

    def __init__(self, rank: int, seconds: float) -> None:
        super().__init__()
        self.rank, self.seconds = rank, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and dist.get_rank() == self.rank:
            time.sleep(self.seconds)
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow", type=int, default=-1, help="rank that sleeps 20 ms in layer2's forward")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(),
        nn.Sequential(nn.Linear(512, 512), Slowdown(args.slow, 0.02), nn.ReLU()),
        nn.Linear(512, 10),
    )
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    metrics = ("ddp_comm",) if distributed else ()
    with LayerProf(model, warmup=2, metrics=metrics) as prof:
        for _ in range(args.steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            prof.step()
    gathered = prof.gather(margin=0.2)  # a collective: every rank calls it; rank 0 gets the comparison
    if gathered is not None:
        print(gathered.table())
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
