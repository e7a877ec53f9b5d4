"""A second reading of the comparison tables, tensor-parallel counting, the roofline of modules run in some steps
only and the warnings and refusals that came with them: each test fails on the code before its fix."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

import layerprof


@contextlib.contextmanager
def _fake_group(world_size: int = 2) -> Iterator[None]:
    """A process group of ``world_size`` ranks in this process, rank 0 (torch's fake backend: collectives do
    nothing), for DTensor's sharding without spawning ranks."""
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def test_tensor_parallel_bytes_are_the_ranks_shards_as_its_flops_are() -> None:
    """Under parallelize_module, FLOPs were each rank's shards but bytes the whole model's (fc1 960 bytes forward
    on each of 2 ranks, as unsharded), so the roofline set half the FLOPs against all the bytes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    with _fake_group():
        torch.manual_seed(0)
        model = _Net()
        parallelize_module(model, init_device_mesh("cpu", (2,)), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        with layerprof.LayerProf(model, metrics=("flops",)) as prof:
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()
                prof.step()
    fc1, fc2 = prof.records["fc1"], prof.records["fc2"]
    # fc1 (ColwiseParallel) on rank 0: addmm reads its bias shard (8 floats), the whole input x [4, 8] and its
    # weight shard [8, 8]; writes its output shard [4, 8]: 4 * (8 + 32 + 64 + 32) = 544 bytes (unsharded: 960).
    assert (fc1.flops_forward, fc1.bytes_forward) == (512, 544)
    # fc2 (RowwiseParallel): addmm reads bias (4, replicated), input shard [4, 8], weight shard [4, 8], and writes
    # a partial sum [4, 4] (all of it, on each rank): 4 * (4 + 32 + 32 + 16) = 336 bytes; mm's 16 + 32 + 32.
    assert (fc2.flops_forward, fc2.bytes_forward) == (256, 336)
