"""FSDP2 (``fully_shard``) on 2 CPU processes with gloo: communication is in no module's time, and on its unit.

Each rank profiles an unsharded copy of the model first (the reference), then three shardings of it. Every
all-gather and reduce-scatter sleeps ``SLEEP_MS`` first (a custom FSDP comm around the default one), so that
communication is large, known and easy to tell from computation on a loaded machine: before the ``fsdp_comm``
meter, the sleeps of the backward all-gathers and reduce-scatters landed in whichever module's graph node ran
before them (a small ``fc3`` showed 20-100x its plain backward; under root-only sharding the reduce-scatter
landed in ``fc1``).
"""
from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.utils.checkpoint import checkpoint

from layerprof import LayerProf, loads
from layerprof._torch import FSDP2_HOOK_POINTS, fsdp2_param_groups
from layerprof.distributed.fsdp import FSDP_FIELDS, FsdpCommMeter

from .ranks import run_ranks

SLEEP_MS = 20.0
STEPS, WARMUP = 5, 2
SINGLE_STEPS = 3  # steps profiled one by one, for the sum of each step's figures against its wall time
BATCH = 32
# Parameter bytes of each Linear, float32: fc1 256*512 + 512, fc2 512*512 + 512, fc3 512*16 + 16 elements, 4 bytes
# each. All even, so FSDP pads nothing and an all-gather's output (both shards) is the whole parameter set.
FC_BYTES = {"fc1": (256 * 512 + 512) * 4, "fc2": (512 * 512 + 512) * 4, "fc3": (512 * 16 + 16) * 4}
assert FC_BYTES == {"fc1": 526336, "fc2": 1050624, "fc3": 32832}


class MLP(nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 16)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.act(self.fc1(x))
        if self.checkpointed:  # fc2's forward runs again in backward, its parameters gathered for it
            return self.fc3(checkpoint(self.fc2, hidden, use_reentrant=False))
        return self.fc3(self.fc2(hidden))


class SlowAllGather(DefaultAllGather):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(SLEEP_MS / 1000)
        return super().__call__(*args, **kwargs)


class SlowReduceScatter(DefaultReduceScatter):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(SLEEP_MS / 1000)
        return super().__call__(*args, **kwargs)


@functools.cache
def cpu_mesh() -> Any:
    """The ranks' CPU mesh: without one, ``fully_shard`` shards onto the machine's accelerator where it has one (a
    GPU machine moved these CPU ranks' parameters to CUDA, whose event clock no host-side pause can stop)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _shard(model: MLP, units: list[nn.Module], **options: Any) -> MLP:
    mesh = cpu_mesh()
    for unit in units:
        fully_shard(unit, mesh=mesh, **options)
        unit.set_custom_all_gather(SlowAllGather())
        unit.set_custom_reduce_scatter(SlowReduceScatter())
    return model


def _profile(model: nn.Module, sharded: bool = True) -> dict[str, Any]:
    """Profile STEPS steps (WARMUP dropped): per module the figures; then, when sharded, SINGLE_STEPS steps one by
    one: each step's root times, communication and wall times."""
    x = torch.randn(BATCH, 256, generator=torch.Generator().manual_seed(1))
    with LayerProf(model, warmup=WARMUP) as prof:
        for _ in range(STEPS):
            model(x).sum().backward()
            prof.step()
    fields = ("forward_ms", "backward_ms", "forward_ms_median", "backward_ms_median", "forward_ms_min",
              "backward_ms_min", "recompute_ms", "comm_forward_ms",
              "comm_backward_ms", "all_gather_bytes", "reduce_scatter_bytes")
    # Single steps, each its own profile, for the step's own figures beside its wall times.
    single_steps = []
    for _ in range(SINGLE_STEPS if sharded else 0):
        with LayerProf(model) as single:
            start = time.perf_counter()
            out = model(x)
            mid = time.perf_counter()
            out.sum().backward()
            end = time.perf_counter()
        root, comm = single.records[""], single.profile.meta["fsdp_comm"]
        single_steps.append({"wall_forward_ms": (mid - start) * 1e3, "wall_backward_ms": (end - mid) * 1e3,
                             "forward_ms": root.forward_ms, "backward_ms": root.backward_ms,
                             "comm_forward_ms": comm["comm_forward_ms"], "comm_backward_ms": comm["comm_backward_ms"]})
    return {
        "records": {name: {f: getattr(record, f, None) for f in fields} for name, record in prof.records.items()},
        "meta": prof.profile.meta.get("fsdp_comm"),
        "single_steps": single_steps,
    }


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.to_local().clone() if hasattr(p.grad, "to_local") else p.grad.clone()
            for p in model.parameters()]


def _worker(rank: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    torch.manual_seed(0)
    results["plain"] = _profile(MLP(), sharded=False)
    torch.manual_seed(0)
    results["plain_checkpointed"] = _profile(MLP(checkpointed=True), sharded=False)

    torch.manual_seed(0)
    model = MLP()
    model = _shard(model, [model.fc1, model.fc2, model.fc3, model])
    groups = [group for module in model.modules() for group in fsdp2_param_groups(module)]
    # Gradients bitwise those of an unprofiled step, and nothing left on FSDP's param groups afterwards.
    x = torch.randn(BATCH, 256)
    model(x).sum().backward()
    unprofiled = _grads(model)
    before = [sorted(vars(group)) for group in groups]  # after FSDP's lazy initialization
    model.zero_grad()
    with LayerProf(model):
        model(x).sum().backward()
    results["grads_equal"] = all(torch.equal(a, b) for a, b in zip(unprofiled, _grads(model)))
    results["groups"] = len(groups)
    results["groups_untouched"] = before == [sorted(vars(group)) for group in groups]
    results["patched_points"] = sorted(set(FSDP2_HOOK_POINTS) & set(vars(groups[0])))
    results["per_layer"] = _profile(model)
    with LayerProf(model) as prof:
        model(x).sum().backward()
    saved, loaded = prof.profile, loads(prof.profile.to_json())
    gathered = prof.gather()  # a collective: both ranks; rank 0 gets the view
    results["table"] = None if gathered is None else gathered.table()
    results["saved_fields_survive"] = all(
        getattr(loaded.records[name], field, None) == getattr(saved.records[name], field, None) is not None
        for name in ("fc1", "fc2", "fc3") for field in FSDP_FIELDS)

    torch.manual_seed(0)
    model = MLP()
    results["root_only"] = _profile(_shard(model, [model]))

    torch.manual_seed(0)
    model = MLP()
    results["no_reshard"] = _profile(_shard(model, [model.fc1, model.fc2, model.fc3, model],
                                            reshard_after_forward=False))

    torch.manual_seed(0)
    model = MLP(checkpointed=True)
    results["checkpointed"] = _profile(_shard(model, [model.fc1, model.fc2, model.fc3, model]))

    # The saved bytes: FSDP2's all-gathered parameters, saved by the layers' matmuls, are weights, not activations
    # (they read as 4 MiB "saved for backward" on 1024-wide layers, and plans freed them).
    torch.manual_seed(0)
    plain = MLP()
    with LayerProf(plain, metrics=("memory",)) as prof:
        plain(x).sum().backward()
    results["saved_plain"] = {name: record.saved_bytes for name, record in prof.records.items()}
    torch.manual_seed(0)
    model = MLP()
    model = _shard(model, [model.fc1, model.fc2, model.fc3, model])
    model(x).sum().backward()
    with LayerProf(model, metrics=("memory",)) as prof:
        model(x).sum().backward()
    results["saved_sharded"] = {name: record.saved_bytes for name, record in prof.records.items()}

    # LayerProf made before fully_shard: the fsdp_comm meter joins as profiling starts (else the communication
    # would be in the modules' times, without a word).
    torch.manual_seed(0)
    model = MLP()
    early = LayerProf(model)
    model = _shard(model, [model.fc1, model.fc2, model.fc3, model])
    model(x).sum().backward()
    with early:
        model(x).sum().backward()
    results["made_before_shard"] = ([meter.name for meter in early.metrics],
                                    early.profile.meta.get("fsdp_comm") is not None)

    # One unit of two modules (fully_shard([fc1, fc2])): billed to fc1, its param group (each of the two holds it)
    # wrapped once. Before, it was wrapped twice: its bytes counted twice, and a wrapper left on it after the block.
    torch.manual_seed(0)
    model = MLP()
    for unit in ([model.fc1, model.fc2], model.fc3, model):
        fully_shard(unit, mesh=cpu_mesh())
    groups = list({id(group): group for module in model.modules() for group in fsdp2_param_groups(module)}.values())
    model(x).sum().backward()
    before = [sorted(vars(group)) for group in groups]
    with LayerProf(model) as prof:
        model(x).sum().backward()
    results["two_module_unit"] = {
        "bytes": {name: (getattr(record, "all_gather_bytes", None), getattr(record, "reduce_scatter_bytes", None))
                  for name, record in prof.records.items()},
        "untouched": before == [sorted(vars(group)) for group in groups], "groups": len(groups)}
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    return run_ranks(_worker, tmp_path_factory.mktemp("fsdp"))


SCENARIOS = {
    # scenario: {unit: (all-gathers in forward, in backward, reduce-scatters)}, per step
    # per layer: every layer re-gathered in backward (reshard_after_forward=True); the root holds no parameter
    "per_layer": {"fc1": (1, 1, 1), "fc2": (1, 1, 1), "fc3": (1, 1, 1)},
    # root only: the root keeps its parameters after forward (FSDP's default for the root), reduces in the
    # end-of-backward callback (the model's input needs no gradient)
    "root_only": {"": (1, 0, 1)},
    "no_reshard": {"fc1": (1, 0, 1), "fc2": (1, 0, 1), "fc3": (1, 0, 1)},
    # per layer, fc2 under activation checkpointing: its recompute in backward finds it gathered already
    "checkpointed": {"fc1": (1, 1, 1), "fc2": (1, 1, 1), "fc3": (1, 1, 1)},
}
UNIT_BYTES = {**FC_BYTES, "": sum(FC_BYTES.values())}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_module_time_holds_communication(ranks: dict[int, dict[str, Any]], scenario: str) -> None:
    for rank, result in ranks.items():
        baseline = "plain_checkpointed" if scenario == "checkpointed" else "plain"
        plain, sharded = result[baseline]["records"], result[scenario]["records"]
        if scenario == "checkpointed":  # fc2 ran again in backward, inside its backward time
            assert sharded["fc2"]["recompute_ms"] > 0 and plain["fc2"]["recompute_ms"] > 0
        for name, row in sharded.items():
            reference = plain[name]
            # Every step sleeps 20 ms per collective: one billed to a module would be in each of its steps, so its
            # fastest step would hold it too. That stays within half a sleep of the module's unsharded median (the
            # fastest step, not the median: another process preempting a step on a loaded machine adds as much,
            # but not to every step; a quarter of a sleep was reached in every step at a load of 11 on 2 cores).
            for field, reference_field in (("forward_ms_min", "forward_ms_median"),
                                           ("backward_ms_min", "backward_ms_median")):
                assert row[field] < reference[reference_field] + SLEEP_MS / 2, (rank, scenario, name, row, reference)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_communication_is_on_the_unit_it_serves(ranks: dict[int, dict[str, Any]], scenario: str) -> None:
    units = SCENARIOS[scenario]
    for rank, result in ranks.items():
        records, meta = result[scenario]["records"], result[scenario]["meta"]
        assert meta["steps"] == STEPS - WARMUP and meta["units"] == sorted(units)
        for name, row in records.items():
            if name not in units:
                assert row["comm_forward_ms"] is None and row["all_gather_bytes"] is None, (name, row)
                continue
            forward_gathers, backward_gathers, reductions = units[name]
            # every collective sleeps 20 ms first: at least that per collective, in the pass that issued it
            assert row["comm_forward_ms"] >= forward_gathers * SLEEP_MS, (rank, scenario, name, row)
            assert row["comm_backward_ms"] >= (backward_gathers + reductions) * SLEEP_MS, (rank, scenario, name, row)
            # bytes per step: each all-gather outputs, and each reduce-scatter takes in, the unit's parameters
            assert row["all_gather_bytes"] == (forward_gathers + backward_gathers) * UNIT_BYTES[name]
            assert row["reduce_scatter_bytes"] == reductions * UNIT_BYTES[name]
        assert meta["all_gather_bytes"] == sum((f + b) * UNIT_BYTES[u] for u, (f, b, _) in units.items())


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_module_times_plus_communication_make_the_step(ranks: dict[int, dict[str, Any]], scenario: str) -> None:
    for rank, result in ranks.items():
        steps = result[scenario]["single_steps"]
        # forward: the root's call (FSDP's own hooks on the root run outside it, and are communication) plus every
        # unit's communication is model(x) as timed around it; backward likewise, with the loss's own graph node,
        # the engine's start and end and FSDP's bookkeeping outside its param groups left over: 0.3-0.4 ms
        # measured. The step closest to its wall time must be within a quarter of one collective's sleep: one
        # missing from the accounting (or counted twice) would be 20 ms off in every step, while another process
        # preempting a step on a loaded machine adds a few ms to that step only.
        for wall, module, comm in (("wall_forward_ms", "forward_ms", "comm_forward_ms"),
                                   ("wall_backward_ms", "backward_ms", "comm_backward_ms")):
            gaps = [step[wall] - (step[module] + step[comm]) for step in steps]
            assert min(abs(gap) for gap in gaps) < SLEEP_MS / 4, (rank, scenario, wall, gaps)
            assert all(step[comm] >= SLEEP_MS for step in steps)  # every step communicated, in this pass


def test_a_unit_of_two_modules_is_counted_once_and_left_as_found(ranks: dict[int, dict[str, Any]]) -> None:
    pair = FC_BYTES["fc1"] + FC_BYTES["fc2"]  # 1,576,960 bytes: the unit's parameters, gathered whole
    for result in ranks.values():
        found = result["two_module_unit"]
        assert found["groups"] == 2 and found["untouched"]
        # one all-gather in forward and one in backward (resharded after forward), one reduce-scatter
        # (the ranks' results come back through JSON: pairs as lists)
        assert found["bytes"]["fc1"] == [2 * pair, pair]
        assert found["bytes"]["fc2"] == [None, None] and found["bytes"]["fc3"] == [2 * FC_BYTES["fc3"],
                                                                                  FC_BYTES["fc3"]]


def test_profiling_leaves_gradients_and_fsdp_as_found(ranks: dict[int, dict[str, Any]]) -> None:
    for result in ranks.values():
        assert result["groups"] == 3  # fc1, fc2, fc3; the root's fully_shard has no parameter left to group
        assert result["grads_equal"] and result["groups_untouched"] and result["patched_points"] == []
        assert result["saved_fields_survive"]  # the unit's fields through to_json and loads
    assert ranks[1]["table"] is None and "FSDP2 communication (in no module's time): forward " in ranks[0]["table"]


def test_process_group_read_as_torch_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # needed_by reads c10d's world object directly (no properties' frames as a LayerProf is made): it must say what
    # torch.distributed.is_initialized() says, without a process group and with one set.
    from torch.distributed import distributed_c10d

    from layerprof._torch import process_group_initialized

    assert process_group_initialized() is dist.is_initialized() is False
    monkeypatch.setattr(distributed_c10d._world, "_default_pg", object())
    assert process_group_initialized() is dist.is_initialized() is True


def test_meter_runs_by_itself_only_on_fsdp2_models() -> None:
    assert not dist.is_initialized()
    assert not FsdpCommMeter.needed_by(MLP())  # no process group: not even a walk over the modules
    net = MLP()
    with pytest.warns(RuntimeWarning, match="no torch.distributed.fsdp.fully_shard unit"):
        with LayerProf(net, metrics=("fsdp_comm",)) as prof:
            net(torch.randn(2, 256)).sum().backward()
    assert "note" in prof.profile.meta["fsdp_comm"]
    with LayerProf(net) as prof:
        net(torch.randn(2, 256)).sum().backward()
    assert "fsdp_comm" not in prof.profile.meta


def test_pausable_clock_leaves_out_paused_time_and_nests() -> None:
    from layerprof.collect.clock import PausableClock

    clock = PausableClock()
    wall = time.perf_counter_ns()
    start = clock.now()
    clock.pause()
    clock.pause()  # nested: counted once, from the outermost pause to its resume
    frozen = clock.now()
    slept = time.perf_counter_ns()
    time.sleep(0.03)
    assert clock.now() == frozen  # stands still while paused
    clock.resume()
    time.sleep(0.03)
    slept = time.perf_counter_ns() - slept
    assert clock.now() == frozen  # still inside the outer pause
    clock.resume()
    end = clock.now()
    wall = time.perf_counter_ns() - wall
    # 60 ms slept, all of it paused: the clock saw the wall time less the sleeps at the most (the calls themselves;
    # measured, so a preemption between them cannot fail this), and was paused for all of them.
    assert end - start <= wall - slept and clock.paused_ms >= slept / 1e6 >= 60.0
    time.sleep(0.01)
    assert (clock.now() - end) / 1e6 >= 10.0  # runs again, behind the wall clock by the paused time
    paused = clock.paused_ms
    clock.resume()  # an unmatched resume changes nothing
    assert clock.paused_ms == paused and (clock.now() - end) / 1e6 >= 10.0


def test_summary_footer_totals_the_units_communication() -> None:
    from layerprof import ModuleRecord
    from layerprof.render.footer import summary_footer

    root = ModuleRecord("", "FSDPMLP")
    figures = {"": (1.0, 2.0, 4096, 4096), "fc1": (3.0, 5.0, 2 << 20, 1 << 20), "act": None,
               "fc2": (0.5, 0.25, 1024, 1024)}
    for name, values in figures.items():
        record = root if not name else ModuleRecord(name, "FSDPLinear", parent=root)
        if values is not None:
            for field, value in zip(("comm_forward_ms", "comm_backward_ms", "all_gather_bytes",
                                     "reduce_scatter_bytes"), values):
                setattr(record, field, value)
    # forward 1 + 3 + 0.5 = 4.5 ms, backward 2 + 5 + 0.25 = 7.25 ms; gathered 4096 + 2 MiB + 1024 B, reduced 4096
    # + 1 MiB + 1024 B; by time fc1 8 ms, the model 3 ms, fc2 0.75 ms
    assert summary_footer(root, top=2) == (
        "FSDP communication, in no module's time: forward 4.5 ms, backward 7.25 ms; all-gathered 2 MiB, "
        "reduce-scattered 1 MiB; most: 'fc1' 8 ms, the model 3 ms."
    )
    assert summary_footer(ModuleRecord("", "MLP")) == ""  # no unit: no line


def test_gathered_profile_spreads_fsdp_communication_over_ranks() -> None:
    from layerprof import GatheredProfile

    rows = {"": {"type": "FSDPMLP", "forward_ms": 1.0, "backward_ms": 2.0}}
    payloads = [{"rank": rank, "rows": rows,
                 "meta": {"fsdp_comm": {"comm_forward_ms": forward, "comm_backward_ms": backward}}}
                for rank, (forward, backward) in enumerate([(10.0, 40.0), (30.0, 20.0), (20.0, 60.0)])]
    gathered = GatheredProfile(payloads)
    forward, backward = gathered.fsdp_communication["comm_forward_ms"], gathered.fsdp_communication["comm_backward_ms"]
    # forward 10, 30, 20: median 20, slowest rank 1; backward 40, 20, 60: median 40, slowest rank 2
    assert (forward.min, forward.median, forward.max, forward.slowest_rank) == (10.0, 20.0, 30.0, 1)
    assert (backward.min, backward.median, backward.max, backward.slowest_rank) == (20.0, 40.0, 60.0, 2)
    assert gathered.communication == {}  # no ddp_comm
    assert ("FSDP2 communication (in no module's time): forward 10 ms / 20 ms / 30 ms; backward 20 ms / 40 ms / 60 ms"
            in gathered.table().splitlines())
    assert GatheredProfile([{"rank": 0, "rows": rows, "meta": {}}]).fsdp_communication == {}


def test_fsdp2s_gathered_parameters_are_not_saved_activations(ranks: dict[int, dict[str, Any]]) -> None:
    for results in ranks.values():
        assert results["saved_sharded"] == results["saved_plain"] and results["saved_plain"][""] > 0


def test_a_layerprof_made_before_fully_shard_times_the_communication_apart(ranks: dict[int, dict[str, Any]]) -> None:
    for results in ranks.values():
        meters, measured = results["made_before_shard"]
        assert "fsdp_comm" in meters and measured


def test_compare_reads_the_models_communication_from_the_meters_totals() -> None:
    """On FSDP2 rank files the model-level rows of ``compare`` read the root's record: its own unit's
    communication, or none where the root holds no parameter. They are the totals over units, which the
    ``fsdp_comm`` meter keeps in the profile's meta (here set by hand on two CPU profiles)."""
    import layerprof

    profiles = []
    for scale in (1.0, 2.0):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        with LayerProf(model) as prof:
            model(torch.randn(2, 4)).sum().backward()
        prof.profile.meta["fsdp_comm"] = {"steps": 1, "units": ["0"], "comm_forward_ms": 6.31 * scale,
                                          "comm_backward_ms": 10.3 * scale, "all_gather_bytes": 679_936,
                                          "reduce_scatter_bytes": 339_968 * scale, "per_step": []}
        profiles.append(prof.profile)
    rows = {row["metric"]: row for row in layerprof.compare(*profiles).model}
    assert rows["comm_forward_ms"]["a"] == pytest.approx(6.31) and rows["comm_forward_ms"]["b"] == pytest.approx(12.62)
    assert rows["all_gather_bytes"]["a"] == rows["all_gather_bytes"]["b"] == 679_936
    assert rows["reduce_scatter_bytes"]["ratio"] == pytest.approx(2.0)
