"""torch.distributed: per-rank profiles gathered on rank 0, cross-rank statistics, stragglers, DDP communication.

The multi-process tests spawn 2 CPU processes on the gloo backend (``tests/ranks.py``); each returns its results as
JSON and the parent asserts. Every wait has a timeout so that a hang fails the test instead of stalling CI.
"""
from __future__ import annotations

import contextlib
import csv as csv_module
import json
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import layerprof
from layerprof import GatheredProfile, LayerProf, register_timed_comm_hook
from layerprof.distributed.crossrank import cross_rank_stats, shown_names, spread
from layerprof.cli import main
from layerprof.distributed.gather import rank_payload
from layerprof.metrics import METERS, Meter, register_meter

from .ranks import run_ranks

SLEEP_S = 0.05  # rank 1's Sleepy module sleeps 50 ms in every forward
HOOK_SLEEP_S = 0.03  # the slow communication hook sleeps 30 ms per bucket


# -- cross-rank statistics on hand-made rows (no processes) ----------------------------------------------------
def _row(type_: str, forward: float | None, backward: float | None) -> dict[str, Any]:
    return {"type": type_, "forward_ms": forward, "backward_ms": backward}


HAND_MADE = {
    0: {"": _row("Net", 10.0, 20.0), "a": _row("Linear", 1.0, 2.0), "b": _row("ReLU", 0.5, None)},
    1: {"": _row("Net", 12.0, 20.0), "a": _row("Linear", 1.5, 2.5), "b": _row("ReLU", 0.5, None)},
    2: {"": _row("Net", 30.0, 30.0), "a": _row("Linear", 4.0, 2.0), "b": _row("ReLU", 0.7, None)},
}


def test_spread_min_median_max_and_ranks() -> None:
    values = spread({0: 3.0, 1: 4.0, 2: 6.0, 3: None})
    assert values is not None
    assert (values.min, values.median, values.max) == (3.0, 4.0, 6.0)
    assert (values.slowest_rank, values.fastest_rank) == (2, 0)
    assert values.values == {0: 3.0, 1: 4.0, 2: 6.0}  # rank 3 measured nothing
    tie = spread({0: 2.0, 1: 2.0})
    assert tie is not None and (tie.slowest_rank, tie.fastest_rank, tie.median) == (0, 0, 2.0)
    assert spread({0: None}) is None


def test_cross_rank_stats_on_known_numbers() -> None:
    step, modules = cross_rank_stats(HAND_MADE, margin=0.2)
    # step totals 30, 32, 60: median 32, straggler limit 32 * 1.2 = 38.4 -> rank 2
    assert (step.total_ms.min, step.total_ms.median, step.total_ms.max) == (30.0, 32.0, 60.0)
    assert step.total_ms.slowest_rank == 2 and step.stragglers == [2]
    a = modules["a"]
    # forward 1, 1.5, 4 -> median 1.5; backward 2, 2.5, 2 -> min 2 (ranks 0 and 2, the lowest wins), max 2.5 on rank 1
    assert (a.forward_ms.min, a.forward_ms.median, a.forward_ms.max, a.forward_ms.slowest_rank) == (1.0, 1.5, 4.0, 2)
    assert (a.backward_ms.min, a.backward_ms.max, a.backward_ms.fastest_rank, a.backward_ms.slowest_rank) == (2.0, 2.5, 0, 1)
    # totals 3, 4, 6 -> median 4, limit 4.8 -> rank 2
    assert (a.total_ms.median, a.stragglers) == (4.0, [2])
    b = modules["b"]
    assert b.backward_ms is None and b.total_ms.max == 0.7  # forward only: total = forward
    # totals 0.5, 0.5, 0.7: rank 2 is 40 % slower than the median 0.5, but by 0.2 ms, under the default floor of
    # 1 % of the median step (32 ms -> 0.32 ms); without the floor it is flagged
    assert b.stragglers == []
    assert cross_rank_stats(HAND_MADE, margin=0.2, min_ms=0.0)[1]["b"].stragglers == [2]
    assert list(modules) == ["", "a", "b"] and a.depth == 1 and modules[""].depth == 0


def test_straggler_margin_and_floor() -> None:
    _, loose = cross_rank_stats(HAND_MADE, margin=0.6)
    assert loose["a"].stragglers == [] and loose[""].stragglers == [2]  # 6 < 4 * 1.6 = 6.4; 60 > 32 * 1.6 = 51.2
    _, floored = cross_rank_stats(HAND_MADE, margin=0.2, min_ms=3.0)
    assert floored["a"].stragglers == [] and floored[""].stragglers == [2]  # a: 6 - 4 = 2 ms < 3 ms; step: 28 ms
    with pytest.raises(ValueError, match="margin"):
        cross_rank_stats(HAND_MADE, margin=-0.1)


def test_shown_names_strip_ddp_and_nested_fsdp_wrappers() -> None:
    ddp = {"": {"type": "DistributedDataParallel"}, "module": {"type": "Net"}, "module.fc": {"type": "Linear"},
           "module.module": {"type": "Linear"}}  # a user submodule named "module" under Net is kept
    assert shown_names(ddp) == {"": "", "module": "", "module.fc": "fc", "module.module": "module"}
    fsdp = {
        "": {"type": "FullyShardedDataParallel"},
        "_fsdp_wrapped_module": {"type": "Net"},
        "_fsdp_wrapped_module.layer": {"type": "FullyShardedDataParallel"},
        "_fsdp_wrapped_module.layer._fsdp_wrapped_module": {"type": "Linear"},
    }
    assert list(shown_names(fsdp).values()) == ["", "", "layer", "layer"]
    rows = {name: {**row, "forward_ms": 1.0, "backward_ms": 1.0} for name, row in fsdp.items()}
    step, modules = cross_rank_stats({0: rows, 1: rows})
    # the wrapped module's row is shown under the shared name; the outermost record is the step
    assert {name: (m.type, m.raw_name) for name, m in modules.items()} == {
        "": ("Net", "_fsdp_wrapped_module"), "layer": ("Linear", "_fsdp_wrapped_module.layer._fsdp_wrapped_module")}
    assert step.type == "FullyShardedDataParallel"
    # checkpoint_wrapper then FSDP2's fully_shard on a block: the wrapper's class is renamed FSDPCheckpointWrapper
    sharded = {"": {"type": "FSDPSequential"}, "2": {"type": "FSDPCheckpointWrapper"},
               "2._checkpoint_wrapped_module": {"type": "Linear"}}
    assert shown_names(sharded) == {"": "", "2": "2", "2._checkpoint_wrapped_module": "2"}
    rows = {name: {**row, "forward_ms": 1.0, "backward_ms": 1.0} for name, row in sharded.items()}
    assert {name: m.type for name, m in cross_rank_stats({0: rows})[1].items()} == {"": "FSDPSequential",
                                                                                    "2": "Linear"}


def test_gathered_profile_rows_table_and_communication() -> None:
    payloads = [{"rank": rank, "rows": rows, "meta": {"ddp_comm": {"comm_ms": 1.0 + rank, "exposed_ms": 10.0 * (rank == 0)}}}
                for rank, rows in HAND_MADE.items()]
    gathered = GatheredProfile(payloads, margin=0.2)
    assert gathered.ranks == [0, 1, 2] and gathered.straggler_ranks == [2]
    assert gathered.min_ms == pytest.approx(0.32)  # 1 % of the median step, 32 ms
    assert gathered.stragglers() == {"": [2], "a": [2]}
    # forward of a: 1, 1.5, 4 -> median 1.5, limit 1.8 -> rank 2; of b: 0.5, 0.5, 0.7 -> 0.2 ms over, under 0.32
    assert gathered.stragglers("forward_ms") == {"": [2], "a": [2]}
    # backward of the step: 20, 20, 30 -> limit 24 -> rank 2; of a: 2, 2.5, 2 -> median 2, limit 2.4 -> rank 1
    assert gathered.stragglers("backward_ms") == {"": [2], "a": [1]}
    assert gathered.communication["comm_ms"].median == 2.0
    assert gathered.communication_stragglers() == [0]  # exposed 10, 0, 0: the waiting rank
    row = gathered.to_dict()["a"]
    assert (row["total_ms_rank_min"], row["total_ms_rank_median"], row["total_ms_rank_max"], row["total_ms_slowest_rank"]) == (3.0, 4.0, 6.0, 2)
    table = gathered.table().splitlines()
    assert table[1] == "Step (Net): total 30 ms / 32 ms / 60 ms, slowest rank 2; stragglers: 2"
    line_a = next(line for line in table if line.startswith("  a "))
    assert line_a.split("  ")[-1] == "2" and "1 ms / 1.5 ms / 4 ms" in line_a and "3 ms / 4 ms / 6 ms" in line_a
    assert len(gathered.table(depth=0).splitlines()) == len(table) - 2  # a and b are at depth 1
    csv = gathered.to_table().to_csv().splitlines()
    assert len(csv) == 4 and csv[0].startswith("name,type,depth,raw_name,ranks,forward_ms_rank_min,")  # header + 3 rows


def test_gather_without_process_group_is_a_one_rank_view() -> None:
    assert not dist.is_initialized()
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with LayerProf(net) as prof:
        net(torch.randn(2, 4)).sum().backward()
    gathered = prof.gather()
    assert isinstance(gathered, GatheredProfile) and gathered.ranks == [0] and gathered.straggler_ranks == []
    assert list(gathered.modules) == ["", "0", "1", "2"]
    assert gathered.modules["0"].total_ms.median == pytest.approx(prof.records["0"].total_ms)
    payload = rank_payload(prof.profile)
    assert "call_times" not in payload["rows"]["0"] and json.dumps(payload)  # plain, small, serializable


# -- the meter hooks the core gained for this: end_step(recorded) and meta() ------------------------------------
def test_meter_end_step_sees_recorded_steps_and_meta_lands_in_profile() -> None:
    @register_meter
    class StepCounter(Meter):
        name = "test_step_counter"

        def __init__(self) -> None:
            self.seen: list[bool] = []

        def end_step(self, recorded: bool) -> None:
            self.seen.append(recorded)

        def meta(self) -> dict[str, Any]:
            return {"seen": list(self.seen)}

    try:
        net = nn.Linear(4, 1)
        with LayerProf(net, warmup=1, metrics=("test_step_counter",)) as prof:
            for _ in range(3):
                net(torch.randn(2, 4)).sum().backward()
                prof.step()
        # 3 steps ended by step(), warm-up first; the 4th (empty, ended by the with block) ran no module
        assert prof.profile.meta["test_step_counter"] == {"seen": [False, True, True, False]}
    finally:
        del METERS["test_step_counter"]


def test_ddp_comm_meter_on_a_plain_model_warns_and_notes() -> None:
    net = nn.Linear(4, 1)
    with pytest.warns(RuntimeWarning, match="not a DistributedDataParallel"):
        with LayerProf(net, metrics=("ddp_comm",)) as prof:
            net(torch.randn(2, 4)).sum().backward()
    assert "note" in prof.profile.meta["ddp_comm"]


# -- two processes, gloo --------------------------------------------------------------------------------------
class Sleepy(nn.Module):
    """Sleeps in forward on one rank: the straggler."""

    def __init__(self, slow_rank: int, seconds: float) -> None:
        super().__init__()
        self.slow_rank = slow_rank
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.get_rank() == self.slow_rank:
            time.sleep(self.seconds)
        return x * 2.0


class Net(nn.Module):
    def __init__(self, slow_rank: int = -1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.slow = Sleepy(slow_rank, SLEEP_S)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.slow(self.act(self.fc1(x))))


def _slow_allreduce(state: Any, bucket):  # noqa: ANN001 - DDP checks the annotations of comm hooks
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    time.sleep(HOOK_SLEEP_S)
    return allreduce_hook(state, bucket)


def _profile(model: nn.Module, steps: int = 3, metrics: tuple[str, ...] = (), backwards: int = 1) -> LayerProf:
    x = torch.randn(4, 8)
    with LayerProf(model, warmup=1, metrics=metrics) as prof:
        for _ in range(steps):
            for _ in range(backwards):  # several: gradient accumulation (DDP all-reduces each time here)
                model(x).sum().backward()
            prof.step()
    return prof


def _view(gathered: GatheredProfile | None) -> dict[str, Any] | None:
    if gathered is None:
        return None
    return {
        "modules": gathered.to_dict(),
        "step": gathered.step.to_dict(),
        "straggler_ranks": gathered.straggler_ranks,
        "per_rank_names": {rank: list(p["rows"]) for rank, p in gathered.per_rank.items()},
        "per_rank_types": {rank: [r["type"] for r in p["rows"].values()] for rank, p in gathered.per_rank.items()},
        "communication_stragglers": gathered.communication_stragglers(),
        "table": gathered.table(),
    }


def _worker(rank: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Net(slow_rank=1))
    prof = _profile(ddp, metrics=("ddp_comm",))
    result["ddp"] = {"names": list(prof.records), "comm": prof.profile.meta["ddp_comm"], "view": _view(prof.gather()),
                     "saved": prof.profile.to_json()}  # (each rank's file, as a user would save it)

    # a communication hook that takes 30 ms per bucket, one parameter per bucket after DDP's rebuild
    torch.manual_seed(0)
    slow_comm = nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=1e-6)
    register_timed_comm_hook(slow_comm, _slow_allreduce)
    prof = _profile(slow_comm, metrics=("ddp_comm",))
    result["slow_hook"] = {"comm": prof.profile.meta["ddp_comm"],
                           "backward_ms": {name: r.backward_ms for name, r in prof.records.items()}}

    torch.manual_seed(0)
    accumulating = nn.parallel.DistributedDataParallel(Net())
    result["accumulate"] = {"comm": _profile(accumulating, metrics=("ddp_comm",), backwards=2).profile.meta["ddp_comm"]}

    torch.manual_seed(0)
    fsdp1 = FullyShardedDataParallel(Net(), device_id=torch.device("cpu"))
    result["fsdp1"] = {"view": _view(_profile(fsdp1, steps=2).gather())}
    torch.manual_seed(0)
    fsdp2 = Net()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # not the machine's GPU, where it has one
    fully_shard(fsdp2.fc1, mesh=mesh)
    fully_shard(fsdp2, mesh=mesh)
    result["fsdp2"] = {"view": _view(_profile(fsdp2, steps=2).gather())}

    # tensor parallelism: fc1 split by columns, fc2 by rows; the meters read each rank's own shards
    torch.manual_seed(0)
    parallel = Net()
    parallelize_module(parallel, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    prof = _profile(parallel, steps=2, metrics=("memory",))
    result["tensor_parallel"] = {name: (prof.records[name].activation_bytes, prof.records[name].saved_bytes)
                                 for name in ("fc1", "act", "fc2")}

    # rank 1's block raises in its third step: its gather() still takes part in the collective, then raises
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    prof = LayerProf(net)
    try:
        with prof:
            for step in range(3):
                if rank == 1 and step == 2:
                    raise ValueError("bad batch")
                net(x).sum().backward()
                prof.step()
    except ValueError:
        pass
    try:
        gathered = prof.gather()
    except RuntimeError as error:
        result["failed"] = {"raised": str(error)}
    else:
        result["failed"] = {"view": _view(gathered),
                            "failed_ranks": None if gathered is None else gathered.failed_ranks}

    # rank 1 calls gather() inside its block (its profile not ready): it still takes part, then raises
    prof = LayerProf(net)
    with prof:
        net(x).sum().backward()
        if rank == 1:
            try:
                prof.gather()
            except RuntimeError as error:
                result["inside"] = {"raised": str(error).split(":")[0]}
    if rank == 0:
        gathered = prof.gather()
        result["inside"] = {"failed_ranks": None if gathered is None else gathered.failed_ranks}
    return result


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    return run_ranks(_worker, tmp_path_factory.mktemp("ranks"))


def test_a_rank_whose_block_raised_still_takes_part_in_gather(two_ranks: dict[int, dict[str, Any]]) -> None:
    """Rank 1's block raised: its ``gather()`` sends why it has no profile and raises as ``prof.profile`` does,
    and rank 0 gets its own profile with rank 1 listed as failed (before: rank 1 raised before the collective, and
    rank 0 waited in it until the group's timeout)."""
    # (rank 1 raised in its third step, steps 0 and 1 recorded)
    assert two_ranks[1]["failed"] == {"raised": "no profile: the block raised ValueError in step 2 (counted from 0), "
                                                "after 2 recorded step(s), and a `with LayerProf(model)` block "
                                                "that raises keeps none. To keep the steps completed before an "
                                                "error, profile with prof = "
                                                "LayerProf(model).start() and call prof.stop(partial=str(error), "
                                                "error=error) in your `except`; or fix the error and profile again "
                                                "with a new LayerProf(model)"}
    failed = two_ranks[0]["failed"]
    assert failed["failed_ranks"] == {"1": "the block raised ValueError"}  # (JSON keys)
    assert list(failed["view"]["per_rank_names"]) == ["0"]
    assert "Rank 1: no profile (the block raised ValueError)" in failed["view"]["table"].splitlines()
    # (the header said "Across 1 rank", as of a one-rank job, with rank 1's failure on the line below)
    assert failed["view"]["table"].startswith("Across 1 of 2 ranks, per step")


def test_tensor_parallel_bytes_are_each_ranks_shards(two_ranks: dict[int, dict[str, Any]]) -> None:
    """A DTensor's own storage is a placeholder of the global size: fc1's output and fc2's saved input, DTensors of
    [4, 16] whose shards are [4, 8] float32 (128 bytes) on each of the 2 ranks, read 256 bytes, twice their data."""
    for rank in (0, 1):
        # fc1: returns its shard (128), saves x [4, 8] (128); ReLU: returns and saves its [4, 8] (128, 128);
        # fc2: returns the all-reduced [4, 4] (64), saves its input's shard as RowwiseParallel hands it (128)
        assert two_ranks[rank]["tensor_parallel"] == {"fc1": [128, 128], "act": [128, 128], "fc2": [64, 128]}


def test_both_ranks_records_arrive_on_rank_0_with_the_same_structure(two_ranks: dict[int, dict[str, Any]]) -> None:
    names = ["", "module", "module.fc1", "module.act", "module.slow", "module.fc2"]
    assert two_ranks[0]["ddp"]["names"] == two_ranks[1]["ddp"]["names"] == names  # records keep DDP's names
    assert two_ranks[1]["ddp"]["view"] is None  # gather() returns None off rank 0
    view = two_ranks[0]["ddp"]["view"]
    assert view["per_rank_names"] == {"0": names, "1": names}
    assert view["per_rank_types"]["0"] == view["per_rank_types"]["1"]
    assert list(view["modules"]) == ["", "fc1", "act", "slow", "fc2"]  # the view shows the user's names
    assert view["modules"][""]["type"] == "Net" and view["step"]["type"] == "DistributedDataParallel"
    for row in view["modules"].values():
        assert row["ranks"] == [0, 1]
        assert row["total_ms_rank_min"] <= row["total_ms_rank_median"] <= row["total_ms_rank_max"]


def test_slowed_rank_is_the_straggler_for_its_module_and_the_model(two_ranks: dict[int, dict[str, Any]]) -> None:
    view = two_ranks[0]["ddp"]["view"]
    slow = view["modules"]["slow"]
    assert slow["stragglers"] == [1] and slow["forward_ms_slowest_rank"] == 1
    assert slow["forward_ms_rank_max"] >= SLEEP_S * 1000 > slow["forward_ms_rank_min"]  # only rank 1 sleeps
    assert view["step"]["stragglers"] == [1] and view["straggler_ranks"] == [1]
    assert view["modules"][""]["stragglers"] == [1]
    assert "slowest" in view["table"] and "\n    slow " not in view["table"]  # depth-1 rows are indented twice
    slow_line = next(line for line in view["table"].splitlines() if line.startswith("  slow "))
    assert slow_line.rstrip().endswith("1")


def test_ddp_communication_is_timed_and_the_fast_rank_waits(two_ranks: dict[int, dict[str, Any]]) -> None:
    comm = {rank: two_ranks[rank]["ddp"]["comm"] for rank in (0, 1)}
    for rank in (0, 1):
        # 3 steps, the first is warm-up; the model's 4 parameters (8*16 + 16 + 16*4 + 4 = 212 floats) fit in one bucket
        assert comm[rank]["steps"] == 2 and comm[rank]["buckets"] == 1
        assert comm[rank]["comm_ms"] >= comm[rank]["launch_ms"] >= 0
    # Rank 0 finishes its backward while rank 1 still sleeps in forward: its all-reduce waits for rank 1, after
    # its last backward node, so that wait is exposed communication, in no module's backward_ms.
    assert comm[0]["exposed_ms"] > SLEEP_S * 1000 / 2 > comm[1]["exposed_ms"]
    view = two_ranks[0]["ddp"]["view"]
    assert view["communication_stragglers"] == [0]  # the waiting rank, the victim of the straggler
    assert "DDP gradient all-reduce" in view["table"]


def test_gradient_accumulation_counts_every_backward(two_ranks: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        comm = two_ranks[rank]["accumulate"]["comm"]
        # 2 recorded steps (3 - 1 warm-up), 2 backward passes each, 1 bucket per backward
        assert comm["steps"] == 2 and [step["buckets"] for step in comm["per_step"]] == [2, 2]
        assert all(step["exposed_ms"] is not None and step["exposed_ms"] >= 0 for step in comm["per_step"])


def test_synchronous_comm_hook_time_is_inside_the_parents_backward_only(two_ranks: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        result = two_ranks[rank]["slow_hook"]
        comm, backward = result["comm"], result["backward_ms"]
        buckets = comm["buckets"]
        assert buckets >= 2  # tiny bucket_cap_mb: several buckets
        assert comm["launch_ms"] >= buckets * HOOK_SLEEP_S * 1000
        # One bucket per parameter (4). A bucket's hook runs right after its gradient's AccumulateGrad node, which
        # the engine runs first among ready nodes. A module's backward ends when the next node of the pass starts,
        # or when the pass finishes for the last one, so it holds its own parameters' AccumulateGrad nodes and
        # hooks: each Linear both of its buckets (2 x 30 ms), the root all four.
        assert buckets == 4
        assert 2 * HOOK_SLEEP_S * 1000 <= backward["module.fc2"] < 3 * HOOK_SLEEP_S * 1000
        assert 2 * HOOK_SLEEP_S * 1000 <= backward["module.fc1"] < 3 * HOOK_SLEEP_S * 1000
        assert backward["module.act"] < HOOK_SLEEP_S * 1000  # no parameter, no hook inside
        assert buckets * HOOK_SLEEP_S * 1000 <= backward["module"] < (buckets + 1) * HOOK_SLEEP_S * 1000


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_fsdp_on_cpu_gloo(two_ranks: dict[int, dict[str, Any]], kind: str) -> None:
    view = two_ranks[0][kind]["view"]
    assert two_ranks[1][kind]["view"] is None
    assert list(view["modules"]) == ["", "fc1", "act", "slow", "fc2"]
    types = {name: row["type"] for name, row in view["modules"].items()}
    if kind == "fsdp1":  # FullyShardedDataParallel: the wrapper's _fsdp_wrapped_module is removed from names
        assert view["step"]["type"] == "FullyShardedDataParallel" and types[""] == "Net" and types["fc1"] == "Linear"
        assert view["per_rank_names"]["0"][1] == "_fsdp_wrapped_module"
    else:  # fully_shard: same names, classes renamed FSDP<name>
        assert types[""] == "FSDPNet" and types["fc1"] == "FSDPLinear" and types["fc2"] == "Linear"
    for row in view["modules"].values():
        assert row["ranks"] == [0, 1] and row["backward_ms_rank_min"] is not None


def test_a_rank_that_gathers_inside_its_block_still_takes_part(two_ranks: dict[int, dict[str, Any]]) -> None:
    """Rank 1 called gather() while profiling: its profile is not ready, and it raised before the collective, so
    rank 0 waited in it until the group's timeout (30 minutes with gloo's default). It now takes part as a failed
    rank, then raises as ``prof.profile`` does."""
    assert two_ranks[1]["inside"] == {"raised": "the profile is not ready"}
    assert two_ranks[0]["inside"] == {"failed_ranks": {"1": "profiling was still running when it called gather()"}}


def test_saved_rank_files_know_their_rank_and_give_the_gathered_view(two_ranks: dict[int, dict[str, Any]],
                                                                     tmp_path: Any) -> None:
    """Each rank's saved profile held no rank or world size, and the cross-rank view of saved files needed the
    private ``rank_payload``: ``layerprof.gather_saved`` makes the view ``gather()`` made, from the files alone."""
    paths = []
    for rank in (1, 0):  # (in any order: each file knows its rank)
        path = tmp_path / f"layerprof-rank{rank}.json"
        path.write_text(two_ranks[rank]["ddp"]["saved"])
        assert layerprof.load(path).meta["distributed"] == {"rank": rank, "world_size": 2, "backend": "gloo"}
        paths.append(path)
    gathered = layerprof.gather_saved(paths)
    live = two_ranks[0]["ddp"]["view"]
    assert gathered.ranks == [0, 1] and gathered.failed_ranks == {}
    assert gathered.to_dict() == live["modules"]  # the very numbers rank 0 gathered
    assert gathered.straggler_ranks == [1] == live["straggler_ranks"]
    assert gathered.communication_stragglers() == [0]
    alone = layerprof.gather_saved([paths[0]])  # rank 1's file alone: rank 0 of the 2 is missing, and said so
    assert alone.ranks == [1] and alone.failed_ranks == {0: "no saved profile of it was given"}
    assert alone.table().startswith("Across 1 of 2 ranks, per step") and "slowest rank" not in alone.table()


def test_the_command_gathers_saved_rank_files(two_ranks: dict[int, dict[str, Any]], tmp_path: Any,
                                             capsys: Any) -> None:
    """``layerprof gather`` prints the view ``gather_saved`` makes of the same files (the command had no way to
    build it), writes its rows, and with ``--fail-on-stragglers`` exits 1 naming the straggler (rank 1 here)."""
    paths = []
    for rank in (0, 1):
        path = tmp_path / f"layerprof-rank{rank}.json"
        path.write_text(two_ranks[rank]["ddp"]["saved"])
        paths.append(str(path))
    expected = layerprof.gather_saved(paths)
    csv = tmp_path / "ranks.csv"
    assert main(["gather", *paths[::-1], "--csv", str(csv)]) == 0  # (in any order: each file knows its rank)
    out, err = capsys.readouterr()
    assert out == expected.table() + "\n"
    assert f"wrote {csv}" in err
    rows = list(csv_module.DictReader(csv.open()))
    assert [row["name"] for row in rows] == list(expected.modules)  # a row per module, as the view's
    for row in rows:
        wanted = expected.to_dict()[row["name"]]
        assert float(row["total_ms_rank_max"]) == pytest.approx(wanted["total_ms_rank_max"], rel=1e-6)
        assert int(row["total_ms_slowest_rank"]) == wanted["total_ms_slowest_rank"]
    assert main(["gather", *paths, "--fail-on-stragglers"]) == 1
    assert "rank 1 slower than the median step by more than 0.2" in capsys.readouterr().err
    # A margin no rank is past: the same files pass.
    assert main(["gather", *paths, "--fail-on-stragglers", "--margin", "1000"]) == 0
    assert "no straggler among 2 ranks" in capsys.readouterr().err
    assert main(["gather", paths[1], "--depth", "0"]) == 0  # rank 1 alone: rank 0 is said to be missing
    out = capsys.readouterr().out
    assert out.startswith("Across 1 of 2 ranks") and "Rank 0: no profile (no saved profile of it was given)" in out
    # As a check, a rank without a profile fails it: that rank may be the slow one (it passed, 1 rank compared).
    assert main(["gather", paths[1], "--fail-on-stragglers", "--margin", "1000"]) == 1
    assert ("1 of 2 ranks have no profile to compare (rank 0: no saved profile of it was given): give every rank's "
            "file") in capsys.readouterr().err


def test_the_gather_command_places_files_by_rank_and_refuses_what_it_cannot(tmp_path: Any, capsys: Any) -> None:
    """Files saved outside a process group hold no rank: given as RANK=PATH. A rank twice is a usage error
    (exit 2), a missing or foreign file exit 3, both before anything is printed."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    _one_rank_profile().to_json(first)
    _one_rank_profile().to_json(second)
    assert main(["gather", f"0={first}", f"1={second}"]) == 0
    assert capsys.readouterr().out.startswith("Across 2 ranks, per step")
    assert main(["gather", str(first), str(second)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "cannot tell which rank saved" in err and "{rank: path}" in err
    assert main(["gather", f"0={first}", f"0={second}"]) == 2
    assert "rank 0 is given twice" in capsys.readouterr().err
    assert main(["gather", f"0={first}", str(tmp_path / "missing.json")]) == 3
    assert "missing.json': no such file" in capsys.readouterr().err
    (tmp_path / "not.json").write_text("{}")
    assert main(["gather", str(tmp_path / "not.json")]) == 3
    assert "is not a layerprof profile" in capsys.readouterr().err
    assert main(["gather", str(first), "--margin", "-1"]) == 2
    assert "expected a finite fraction >= 0" in capsys.readouterr().err
    assert main(["gather", str(first), "--csv", str(tmp_path / "no" / "rows.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_gather_saved_refuses_files_it_cannot_place() -> None:
    """Profiles without a rank (saved outside a process group) are placed by ``{rank: profile}``; two of one rank,
    a rank its file contradicts, jobs of different sizes and a lone path string are refused, naming the fix."""
    first, second = _one_rank_profile(), _one_rank_profile()
    with pytest.raises(ValueError, match=r"cannot tell which rank saved profile 0: .*\{rank: path\}"):
        layerprof.gather_saved([first, second])
    assert layerprof.gather_saved({0: first, 1: second}).ranks == [0, 1]
    assert layerprof.gather_saved([first]).ranks == [0]  # one profile outside a group: the one-rank view
    with pytest.raises(TypeError, match="wrap a single one in a list"):
        layerprof.gather_saved("rank0.json")
    first.meta["distributed"] = {"rank": 1, "world_size": 2, "backend": "gloo"}
    second.meta["distributed"] = {"rank": 1, "world_size": 2, "backend": "gloo"}
    with pytest.raises(ValueError, match="rank 1 is given twice"):
        layerprof.gather_saved([first, second])
    with pytest.raises(ValueError, match="was given as rank 0, but it was saved by rank 1"):
        layerprof.gather_saved({0: first})
    second.meta["distributed"] = {"rank": 0, "world_size": 4, "backend": "gloo"}
    with pytest.raises(ValueError, match=r"jobs of different sizes: world sizes 2 \(profile 0\), 4 \(profile 1\)"):
        layerprof.gather_saved([first, second])


def _one_rank_profile(warmup: int = 0) -> Any:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.warns(RuntimeWarning, match="recorded no step") if warmup else contextlib.nullcontext():
        with LayerProf(model, warmup=warmup) as prof:
            model(torch.randn(2, 4)).sum().backward()
    return prof.profile


def test_a_rank_that_recorded_no_step_is_listed_not_compared() -> None:
    """A rank whose every step was warm-up sent a profile with no step: the view read as two ranks agreeing when
    it was rank 0 alone. It is now listed beside the failed ranks, and the table says so."""
    gathered = GatheredProfile([rank_payload(_one_rank_profile(), 0, 2), rank_payload(_one_rank_profile(5), 1, 2)])
    assert gathered.ranks == [0]
    assert gathered.failed_ranks == {1: "it recorded no step: every step was warm-up or outside the schedule"}
    table = gathered.table().splitlines()
    assert table[0].startswith("Across 1 of 2 ranks, per step")  # (was "Across 1 rank")
    assert gathered.world_size == 2
    assert repr(gathered).startswith("<GatheredProfile Sequential: 1 of 2 ranks, 3 modules")
    assert "Rank 1: no profile (it recorded no step: every step was warm-up or outside the schedule)" in table


def test_the_gathered_table_exports_show_the_spread_over_ranks() -> None:
    """``to_table()``'s Markdown and LaTeX held the name and type alone: the rank fields are detail fields."""
    gathered = GatheredProfile([rank_payload(_one_rank_profile(), rank, 2) for rank in (0, 1)])
    table = gathered.to_table()
    assert table.columns[:5] == ["name", "type", "forward_ms_rank_min", "forward_ms_rank_median",
                                 "forward_ms_rank_max"]
    assert "total_ms_slowest_rank" in table.columns
    header = table.to_markdown().splitlines()[0]
    assert header.count("|") == len(table.columns) + 1 and "rank max" in header.lower()


def test_a_module_list_in_the_cross_rank_rows_is_its_childrens_total() -> None:
    """A ModuleList is never called itself: the summary shows its children's sum, and the cross-rank rows read
    "—" (GPT-2's ``h``, its whole transformer stack)."""
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    model = Stack()
    with LayerProf(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
    gathered = GatheredProfile([rank_payload(prof.profile, rank, 2) for rank in (0, 1)])
    row = gathered.to_dict()["layers"]
    children = sum(prof.records[f"layers.{i}"].forward_ms for i in range(3))
    assert row["forward_ms_rank_median"] == pytest.approx(children)
    assert row["total_ms_rank_max"] == pytest.approx(children + sum(prof.records[f"layers.{i}"].backward_ms
                                                                     for i in range(3)))


def test_a_view_with_no_rank_to_compare_says_why() -> None:
    """Every rank's profile recorded no step (or failed): a clear error naming each rank's reason, not
    "no rank's rows to compare" from deep inside (the second reading)."""
    with pytest.raises(RuntimeError, match=r"no rank has a profile to compare \(rank 0: it recorded no step: every "
                                           r"step was warm-up or outside the schedule; rank 1: the block raised"):
        GatheredProfile([rank_payload(_one_rank_profile(5), 0, 2),
                         {"rank": 1, "world_size": 2, "failed": "the block raised ValueError"}])
