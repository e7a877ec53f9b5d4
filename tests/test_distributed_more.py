"""torch.distributed beyond the basics, on 2 CPU processes with gloo: FLOPs and unknown ops under FSDP2 and tensor
parallelism, DDP variants (unused parameters, static graph, no_sync accumulation, a compression hook), the
cross-rank view of modules that only some ranks ran.

One spawn runs every scenario (``tests/ranks.py``, with its timeouts); each rank returns plain numbers and the
tests assert them. The model is tiny, so every FLOP count is written out with its arithmetic.
"""
from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from layerprof import LayerProf, register_timed_comm_hook

from .ranks import run_ranks

BATCH = 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Branchy(nn.Module):
    """Rank 0 runs ``a``, rank 1 runs ``b``: DDP needs ``find_unused_parameters=True``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.a = nn.Linear(16, 4)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x))
        return self.a(hidden) if dist.get_rank() == 0 else self.b(hidden)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _train(model: nn.Module, profiled: bool, metrics: tuple[str, ...] = (), accumulate: int = 1,
           no_sync: bool = False) -> tuple[LayerProf | None, list[torch.Tensor]]:
    """3 optimizer steps of ``accumulate`` backward passes each (all but the last under ``no_sync()`` when asked);
    the parameters after them, each rank's local part."""
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(BATCH, 8, generator=generator) for _ in range(3 * accumulate)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = LayerProf(model, metrics=metrics) if profiled else None
    with prof if prof is not None else contextlib.nullcontext():
        for step in range(3):
            for k in range(accumulate):
                skip = no_sync and k < accumulate - 1
                with model.no_sync() if skip else contextlib.nullcontext():
                    model(batches[step * accumulate + k]).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if prof is not None:
                prof.step()
    return prof, [_local(p).detach().clone() for p in model.parameters()]


def _hooks(model: nn.Module) -> list[tuple[int, ...]]:
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), len(m._backward_pre_hooks))
            for m in model.modules()]


def _compare(make: Any, metrics: tuple[str, ...] = (), **options: Any) -> tuple[LayerProf, dict[str, Any]]:
    """The same training unprofiled and profiled, from the same seed: bitwise equal parameters, hooks as found."""
    torch.manual_seed(0)
    _, plain = _train(make(), False, **options)
    torch.manual_seed(0)
    model = make()
    before = _hooks(model)
    prof, profiled = _train(model, True, metrics, **options)
    assert prof is not None
    return prof, {"equal": len(plain) == len(profiled) and all(torch.equal(a, b) for a, b in zip(plain, profiled)),
                  "hooks_as_found": _hooks(model) == before, "names": list(prof.records),
                  "modules": [name for name, _ in model.named_modules()]}


def _flops(prof: LayerProf) -> dict[str, Any]:
    return {name: (r.flops_forward, r.flops_backward, dict(r.unknown_ops)) for name, r in prof.records.items()}


def _worker(rank: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    def fsdp(**options: Any) -> Any:
        def make() -> nn.Module:
            model = Net()
            for unit in (model.fc1, model.fc2, model):
                fully_shard(unit, mesh=mesh, **options)
            return model
        return make

    prof, checks = _compare(fsdp(), metrics=("flops",))
    result["fsdp"] = {**checks, "flops": _flops(prof), "summary": prof.layerwise_summary(columns=("flops",))}
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    prof, checks = _compare(fsdp(mp_policy=bf16), metrics=("flops",))
    result["fsdp_bf16"] = {**checks, "flops": _flops(prof)}

    def tensor_parallel() -> nn.Module:
        model = Net()
        parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        return model

    prof, checks = _compare(tensor_parallel, metrics=("flops",))
    result["tensor_parallel"] = {**checks, "flops": _flops(prof)}

    offload = CPUOffloadPolicy(pin_memory=False)  # (pinned memory needs a GPU)
    prof, checks = _compare(fsdp(offload_policy=offload, reshard_after_forward=False), metrics=("flops",))
    result["fsdp_offload"] = {**checks, "flops": _flops(prof)}

    # DDP as users configure it, with the ddp_comm meter
    def fp16_compressed() -> nn.Module:
        model = DistributedDataParallel(Net())
        register_timed_comm_hook(model, fp16_compress_hook, dist.group.WORLD)
        return model

    torch.manual_seed(0)
    plain = DistributedDataParallel(Net())
    plain.register_comm_hook(dist.group.WORLD, fp16_compress_hook)
    _, reference = _train(plain, False)
    variants = {
        "unused": (lambda: DistributedDataParallel(Branchy(), find_unused_parameters=True), {}),
        "static_graph": (lambda: DistributedDataParallel(Net(), static_graph=True), {}),
        "bucket_view": (lambda: DistributedDataParallel(Net(), gradient_as_bucket_view=True), {}),
        "no_sync": (lambda: DistributedDataParallel(Net()), {"accumulate": 2, "no_sync": True}),
        "fp16": (fp16_compressed, {}),
    }
    for name, (make, options) in variants.items():
        prof, checks = _compare(make, metrics=("ddp_comm",), **options)
        comm = prof.profile.meta["ddp_comm"]
        gathered = prof.gather()
        result[name] = {**checks, "buckets": [step["buckets"] for step in comm["per_step"]],
                        "backward": {n: r.backward_ms is not None for n, r in prof.records.items()},
                        "table": None if gathered is None else gathered.table()}
    torch.manual_seed(0)
    _, timed = _train(fp16_compressed(), True)
    result["fp16"]["equal_to_untimed_hook"] = all(torch.equal(a, b) for a, b in zip(reference, timed))
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    return run_ranks(_worker, tmp_path_factory.mktemp("more"))


# Net on a batch of 4, per rank. fc1 = Linear(8, 16): forward 2*4*8*16 = 1024; backward only the weight's
# gradient (the input needs none) 2*4*8*16 = 1024. fc2 = Linear(16, 4): forward 2*4*16*4 = 512; backward the
# input's and the weight's gradients, 2 * 512 = 1024. ReLU: 0.
NET_FLOPS = {"": (1536, 2048), "fc1": (1024, 1024), "act": (0, 0), "fc2": (512, 1024)}


@pytest.mark.parametrize("scenario", ["fsdp", "fsdp_bf16", "fsdp_offload"])
def test_fsdp2_copies_are_not_unknown_ops(ranks: dict[int, dict[str, Any]], scenario: str) -> None:
    """FSDP2's copies into and out of its communication buffers (``fsdp.all_gather_copy_in``,
    ``fsdp.split_with_sizes_copy``, ``fsdp.chunk_cat``) were listed as ops without a FLOP formula, on the root
    and on every unit, and the summary said FLOPs were missing; they are data movement, priced 0 like a copy."""
    for rank in (0, 1):
        found = ranks[rank][scenario]
        assert found["equal"] and found["hooks_as_found"] and found["names"] == found["modules"]
        # each rank runs the whole (gathered) layers on its own batch: the unsharded model's counts
        assert {name: tuple(flops[:2]) for name, flops in found["flops"].items()} == NET_FLOPS
        assert all(flops[2] == {} for flops in found["flops"].values()), found["flops"]
    assert "FLOPs leave out" not in ranks[0]["fsdp"]["summary"]


def test_tensor_parallel_flops_are_each_ranks_shards(ranks: dict[int, dict[str, Any]]) -> None:
    """Under tensor parallelism each rank computes its shards, but the meter priced every op at the DTensors'
    global shapes: each rank reported the whole model's FLOPs (fc1 forward 1024), twice what it did on 2 ranks."""
    for rank in (0, 1):
        found = ranks[rank]["tensor_parallel"]
        assert found["equal"] and found["hooks_as_found"] and found["names"] == found["modules"]
        flops = {name: tuple(counts[:2]) for name, counts in found["flops"].items()}
        # fc1, ColwiseParallel: weight [8 of 16 outputs, 8]: forward 2*4*8*8 = 512, weight gradient 512.
        # fc2, RowwiseParallel: weight [4, 8 of 16 inputs], input [4, 8]: forward 2*4*8*4 = 256 (a partial sum,
        # all-reduced); backward input gradient [4, 4] @ [4, 8] = 256 and weight gradient 256.
        assert flops == {"": (768, 1024), "fc1": (512, 512), "act": (0, 0), "fc2": (256, 512)}
        assert all(counts[2] == {} for counts in found["flops"].values()), found["flops"]


@pytest.mark.parametrize("scenario", ["unused", "static_graph", "bucket_view", "no_sync", "fp16"])
def test_ddp_variants_train_as_unprofiled_and_time_every_bucket(ranks: dict[int, dict[str, Any]],
                                                                scenario: str) -> None:
    for rank in (0, 1):
        found = ranks[rank][scenario]
        assert found["equal"] and found["hooks_as_found"] and found["names"] == found["modules"]
        # 3 steps, none warm-up; Net's 212 parameters (Branchy's 212 + 68) fit one bucket, all-reduced once a step
        assert found["buckets"] == [1, 1, 1]
        unused = {"unused": {"module.b" if rank == 0 else "module.a"}}.get(scenario, set())
        assert {name for name, ran in found["backward"].items() if not ran} == unused
    assert ranks[0]["fp16"]["equal_to_untimed_hook"]  # the timed hook is the user's hook, bits and all
    assert ranks[1][scenario]["table"] is None
    table = ranks[0][scenario]["table"].splitlines()
    some = [line for line in table if line.startswith("Run on some ranks only")]
    assert some == (["Run on some ranks only (spread over those ranks): a on rank 0; b on rank 1"]
                    if scenario == "unused" else [])


# -- the cross-rank view of modules that some ranks never ran (hand-made rows, no processes) -------------------
def _rows(a_ms: float | None, b_ms: float | None) -> dict[str, dict[str, Any]]:
    def row(type_: str, ms: float | None) -> dict[str, Any]:
        return {"type": type_, "forward_ms": ms, "backward_ms": ms}
    return {"": row("Branchy", 10.0), "fc1": row("Linear", 2.0), "a": row("Linear", a_ms), "b": row("Linear", b_ms)}


def test_a_module_run_on_some_ranks_only_is_said_so() -> None:
    """An unused branch (DDP's find_unused_parameters, an MoE expert no token was routed to) has a row on every
    rank but timings on some only. The table showed its one rank's time as min / median / max with that rank as
    the slowest, as if every rank had been compared; it now names those modules and where they ran, and shows no
    slowest rank for a module measured on one rank."""
    from layerprof import GatheredProfile

    payloads = [{"rank": 0, "rows": _rows(1.0, None), "meta": {}}, {"rank": 1, "rows": _rows(None, 3.0), "meta": {}},
                {"rank": 2, "rows": _rows(1.5, None), "meta": {}}]
    gathered = GatheredProfile(payloads)
    table = gathered.table().splitlines()
    assert "Run on some ranks only (spread over those ranks): a on ranks 0, 2; b on rank 1" in table
    line_b = next(line for line in table if line.startswith("  b "))
    # b: total 3 + 3 = 6 ms, on rank 1 only: no slowest rank among one
    assert "6 ms / 6 ms / 6 ms" in line_b and line_b.split()[-1] == "—"
    line_a = next(line for line in table if line.startswith("  a "))
    # a: totals 2 ms (rank 0) and 3 ms (rank 2): the slower of the two that ran it
    assert "2 ms / 2.5 ms / 3 ms" in line_a and line_a.split()[-1] == "2"
    assert gathered.to_dict()["b"]["total_ms_rank_min"] == 6.0  # the rows themselves are unchanged
    same = GatheredProfile([{"rank": r, "rows": _rows(1.0, 1.0), "meta": {}} for r in (0, 1)])
    assert not any(line.startswith("Run on some ranks") for line in same.table().splitlines())
