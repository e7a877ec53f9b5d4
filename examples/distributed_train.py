"""Profile a DDP training step on every rank and compare the ranks (CPU, gloo).

    python examples/distributed_train.py                                  # starts 2 processes itself
    python examples/distributed_train.py --slow 1                         # rank 1 sleeps 20 ms in module 2.1
    torchrun --standalone --nproc_per_node=2 examples/distributed_train.py  # the same, started by torchrun
    python examples/distributed_train.py --nproc 1                        # no torch.distributed: one-rank view

Started by torchrun (``RANK`` set), it is one rank of torchrun's group; started with plain ``python``, it spawns
``--nproc`` processes (default 2) on this machine, each a rank of a gloo group on a free local port.
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Sequence

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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=-1, help="rank that sleeps 20 ms in module 2.1's forward")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--nproc", type=int, default=2,
                        help="processes to start without torchrun (default 2; 1: no torch.distributed)")
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    return args


def train(args: argparse.Namespace) -> None:
    """One rank: a few profiled DDP steps, then every rank's profile gathered and compared on rank 0."""
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
        # Every rank past its last collective before any tears its group down: a rank that leaves while rank 0
        # still receives (gather above) makes gloo abort rank 0 ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    # What torchrun would set: init_process_group's default env:// rendezvous reads these.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(args.nproc))
    train(args)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ or args.nproc == 1:  # started by torchrun, or asked for one process
        train(args)
    else:
        torch.multiprocessing.spawn(_rank, args=(args, _free_port()), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
