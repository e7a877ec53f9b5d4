"""The checkpoint wrapper's own cost in a plan: saved tensors counted per module, the cost measured and priced;
the tail of a region that checkpoint's early stop does not re-run, and the profiler's own hooks inside a module,
left out of its recompute time."""
from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import layerprof
from layerprof import LayerProf
from layerprof.collect import hook_cost
from layerprof.plan.apply import unwrap, wrap
from layerprof.plan.candidates import candidates, descendant_calls, skipped_tail_ms
from layerprof.plan.wrap_cost import WrapCost, wrap_cost
from layerprof.record.records import preorder
from tests.checkpoint_zoo import zoo_step
from tests.measured import measured_until
from tests.test_checkpoint_bytes import _profile


def test_saved_tensors_are_counted_per_module() -> None:
    net = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    records = _profile(net, torch.randn(2, 8)).profile.records
    # Linear 0: x needs no grad, so addmm saves only x (for the weight's gradient): 1. ReLU: its result: 1.
    # Linear 2: its input (for the weight's gradient) and its weight (for the input's gradient): 2. The root: 4.
    assert [records[name].checkpoint_saved_tensors for name in ("0", "1", "2", "")] == [1, 1, 2, 4]


def test_shared_module_counts_every_call() -> None:
    layer = nn.Linear(4, 4)
    net = nn.Sequential(nn.Linear(4, 4), layer, nn.Tanh(), layer)
    records = _profile(net, torch.randn(2, 4)).profile.records
    # layer, called twice with inputs that need grad: 2 tensors a call (input, weight). Tanh: its result.
    # Linear 0: x only. The root: 1 + 2 + 1 + 2.
    assert records["1"].calls == 2 and records["1"].checkpoint_saved_tensors == 4
    assert records[""].checkpoint_saved_tensors == 6


def _blocks(count: int = 4, width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(count)))


def test_the_plan_prices_each_wrapper_and_the_choice_follows() -> None:
    model = _blocks()
    prof = _profile(model, torch.randn(4, 32, requires_grad=True))
    records = prof.profile.records
    cost = WrapCost(per_call_ms=1.0, per_tensor_ms=0.5)
    plan = prof.checkpoint_plan(0.25, wrap_cost=cost)
    assert plan.wrap_cost is cost and plan.feasible
    for chosen in plan.chosen:
        record = records[chosen.name]
        # one call a step: 1 ms, plus 0.5 ms for each tensor saved inside it
        assert chosen.wrap_ms == pytest.approx(1.0 * record.calls + 0.5 * record.checkpoint_saved_tensors)
        assert chosen.cost_ms == pytest.approx(chosen.recompute_ms + chosen.wrap_ms)
    assert plan.extra_ms == pytest.approx(sum(c.recompute_ms + c.wrap_ms for c in plan.chosen))
    # A wrapper dear enough per call: one wrapper over the whole model beats one per block.
    dear = prof.checkpoint_plan(0.25, wrap_cost=(1000.0, 0.0))
    assert dear.modules == [""]
    # No wrapper cost: recompute time alone, as the planner counted before.
    bare = prof.checkpoint_plan(0.25, wrap_cost=None)
    assert bare.wrap_cost is None and all(c.wrap_ms == 0 for c in bare.chosen)
    assert bare.extra_ms == pytest.approx(sum(c.recompute_ms for c in bare.chosen))
    assert plan.to_dict()["chosen"][0]["wrap_ms"] == plan.chosen[0].wrap_ms


def test_measured_cost_is_positive_and_cached() -> None:
    first = wrap_cost()
    # The per-tensor figure is a difference of two timings clamped at zero: on a loaded machine it can read 0.
    # The per-call one is positive whatever the load: the wrapped step's extra thread CPU time (0.4-0.8 ms a
    # call) is more than 32 times what a saved tensor costs (12-16 µs), which it would need to fall to 0.
    assert first.source == "measured" and first.per_call_ms > 0 and first.per_tensor_ms >= 0
    assert wrap_cost() is first
    # Its points: back to back (no work between: gaps 0), after the 8-row filler and the cold one (work between,
    # thread CPU time: above 0 on both sides), the cold cost last. How the cost falls with the gap is a property
    # of the host's caches, measured in benchmarks, not asserted here (a loaded host evicts the warm ones too).
    (forward0, backward0, _), (forward8, backward8, _), (forward, backward, cold) = first.gap_points
    assert forward0 == backward0 == 0.0 and min(forward8, backward8, forward, backward) > 0
    assert cold == first.per_call_ms


def test_the_calibration_is_assembled_from_its_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stacks' readings given (no clock): (overhead per block, tensors a block saves, forward gap, backward gap).
    from layerprof.plan import wrap_cost as module

    readings = {(1, 64): (0.5, 2, 1.2, 2.3), (33, 64): (1.46, 66, 1.3, 2.4), (1, 0): (0.2, 2, 0.0, 0.0),
                (1, 8): (0.35, 2, 0.5, 0.9)}
    asked = []

    def overhead_ms(layers: int, filler_rows: int = module._FILLER_ROWS) -> tuple[float, int, float, float]:
        asked.append((layers, filler_rows))
        return readings[layers, filler_rows]

    monkeypatch.setattr(module, "_overhead_ms", overhead_ms)
    monkeypatch.setattr(module, "_CACHE", {})
    cost = module.wrap_cost()
    # The small stack (1 layer, 64-row fillers: cold), the large one (33 layers), back to back, the 8-row fillers.
    assert asked == [(1, 64), (33, 64), (1, 0), (1, 8)]
    # A tensor: (1.46 - 0.5) / (66 - 2) = 0.015 ms. A call: 0.5 less its 2 tensors, 0.47. The warmer points less
    # their 2 tensors too: 0.2 - 0.03 = 0.17 back to back, 0.35 - 0.03 = 0.32 at the 8-row gaps; cold at the small
    # stack's gaps (the large one's are not used).
    assert cost.source == "measured"
    assert (cost.per_tensor_ms, cost.per_call_ms) == pytest.approx((0.015, 0.47))
    assert [point for triple in cost.gap_points for point in triple] == pytest.approx(
        [0.0, 0.0, 0.17, 0.5, 0.9, 0.32, 1.2, 2.3, 0.47])
    assert module.wrap_cost() is cost and len(asked) == 4  # cached: not measured again


@pytest.mark.parametrize("bad, error", [
    ("fast", ValueError), ((1.0,), ValueError), ((-1.0, 0.0), ValueError), ((float("nan"), 0.0), ValueError),
    ((1.0, float("inf")), ValueError),
    # a wrong kind of value: a ValueError before
    ((True, 0.0), TypeError), (3.0, TypeError), (("0.4", "0.01"), TypeError), ({"per_call_ms": 0.4}, TypeError),
])
def test_bad_wrap_cost_is_refused(bad, error) -> None:
    prof = _profile(_blocks(2), torch.randn(2, 32))
    with pytest.raises(error, match="wrap_cost must be 'measured', None"):
        prof.checkpoint_plan(0.5, wrap_cost=bad)


class _OwnSave(nn.Module):
    """A Linear and a Tanh, then its own code multiplies (which saves both factors) after them."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.tanh = nn.Linear(8, 8), nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tanh(self.linear(x))
        return y * x


def _recomputed_calls(model: nn.Module, x: torch.Tensor, wrapped: str) -> dict[str, int]:
    """Forward calls of each leaf that ran to the end in a step with ``wrapped`` checkpointed: 2 where the
    recomputation ran it (a forward hook does not run for a layer the early stop interrupted)."""
    counts: dict[str, int] = {}

    def count(name: str) -> Any:
        return lambda module, args, output: counts.__setitem__(name, counts.get(name, 0) + 1)

    handles = [module.register_forward_hook(count(name)) for name, module in model.named_modules()
               if not list(module.children())]
    own = wrap(model.get_submodule(wrapped))
    try:
        model(x).sum().backward()
    finally:
        unwrap(model.get_submodule(wrapped), own)
        for handle in handles:
            handle.remove()
    return counts


def test_early_stop_tail_is_not_priced_as_recomputed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Identity()),  # tail: Identity, then Linear
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()),  # Tanh saves its result: no tail
        _OwnSave(),  # its own multiply saves, at a place the records do not order: no tail read
        nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Tanh(), nn.Linear(8, 8))),  # the inner Sequential's Linear
    )
    x = torch.randn(4, 8, requires_grad=True)
    # What checkpoint does: the last Linear (and the Identity after it) of block 0 run once, the others twice.
    assert _recomputed_calls(model, x, "0") == {"0.0": 2, "0.1": 2, "0.2": 1, "0.3": 1, "1.0": 1, "1.1": 1,
                                                 "2.linear": 1, "2.tanh": 1, "3.0": 1, "3.1.0": 1, "3.1.1": 1}
    assert _recomputed_calls(model, x, "3")["3.1.1"] == 1 and _recomputed_calls(model, x, "3")["3.1.0"] == 2
    records = _profile(model, x).profile.records

    def forward(name: str) -> float:
        return records[name].forward_ms

    assert skipped_tail_ms(records["0"]) == pytest.approx(forward("0.2") + forward("0.3"))
    assert skipped_tail_ms(records["1"]) == 0.0
    assert skipped_tail_ms(records["2"]) == 0.0
    assert skipped_tail_ms(records["3"]) == pytest.approx(forward("3.1.1"))
    assert skipped_tail_ms(records["0.2"]) == 0.0  # a leaf: nothing inside it to read
    # The planner prices a candidate's recomputation as its forward less that tail.
    found = {c.name: c for c in candidates(records[""])}
    assert found["0"].recompute_ms == pytest.approx(forward("0") - forward("0.2") - forward("0.3"))
    assert found["1"].recompute_ms == forward("1")


def test_measuring_leaves_the_callers_rng_alone() -> None:
    from layerprof.plan import wrap_cost as module

    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    module._CACHE.clear()  # measure again, not from the cache
    module.wrap_cost()
    assert torch.equal(torch.rand(3), expected)


class _Stop(Exception):
    pass


def test_calibrations_run_on_one_thread_and_put_the_callers_count_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host figures are Python on the calling thread; timed on several threads, a busy host adds the ops' thread
    # barriers (layerprof/_threads.py). Each calibration runs on one, and the caller's count comes back, also where
    # the calibration raised.
    from layerprof.collect import hook_cost as hooks, live_op_cost as reader
    from layerprof.plan import wrap_cost as wrapper

    seen: list[tuple[str, int]] = []

    def overhead(layers: int, filler_rows: int = 64) -> tuple[float, int, float, float]:
        seen.append(("wrap", torch.get_num_threads()))
        return 0.5 + 0.01 * layers, 2 * layers, 1.0, 2.0  # readings given: the threads are what is tested

    def bare(*args: Any) -> list[float]:
        seen.append(("hooks", torch.get_num_threads()))
        raise _Stop

    def per_op() -> float:
        seen.append(("reader", torch.get_num_threads()))
        return 0.02

    monkeypatch.setattr(wrapper, "_overhead_ms", overhead)
    monkeypatch.setattr(wrapper, "_CACHE", {})
    monkeypatch.setattr(hooks, "_bare_block_ms", bare)
    monkeypatch.setattr(hooks, "_CACHE", {})
    monkeypatch.setattr(reader, "_measure", per_op)
    monkeypatch.setattr(reader, "_CACHE", {})
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        found = wrapper.wrap_cost()
        assert torch.get_num_threads() == 3
        with pytest.raises(_Stop):
            hooks.hook_cost(LayerProf, ())
        assert torch.get_num_threads() == 3
        assert reader.live_op_cost() == 0.02 and torch.get_num_threads() == 3
        torch.set_num_threads(2)
        assert wrapper.wrap_cost() is found  # one figure a process, whatever the caller's count
    finally:
        torch.set_num_threads(threads)
    # wrap_cost times the small and the large stack, then the two warmer gaps: four readings, every one on one thread.
    assert seen == [("wrap", 1)] * 4 + [("hooks", 1), ("reader", 1)]
    # per tensor (0.83 - 0.51) / (66 - 2) = 0.005 ms; per call 0.51 - 0.005 * 2 = 0.5 ms
    assert (found.per_tensor_ms, found.per_call_ms) == pytest.approx((0.005, 0.5))


def test_calibrations_of_two_threads_take_turns() -> None:
    # The thread count is the process's: two threads calibrating at once must not put back each other's 1, nor
    # measure one figure twice (the second finds it in the cache once its turn comes).
    import threading

    from layerprof._threads import calibrated

    cache: dict[str, float] = {}
    seen: list[int] = []

    def measure() -> float:
        seen.append(torch.get_num_threads())
        time.sleep(0.2)  # the other thread asks meanwhile
        return 1.5

    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        found: list[float] = []
        workers = [threading.Thread(target=lambda: found.append(calibrated(cache, "k", measure))) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
    assert seen == [1] and found == [1.5, 1.5] and cache == {"k": 1.5}


def test_descendant_calls_leave_out_a_shared_modules_foreign_calls() -> None:
    shared = nn.Linear(8, 8)
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Sequential(shared, nn.Tanh())),
                          nn.Sequential(shared, nn.Linear(8, 1)))
    records = _profile(model, torch.randn(2, 8, requires_grad=True)).profile.records
    ordered = preorder(records[""])
    index = {id(record): i for i, record in enumerate(ordered)}
    parents = [-1 if r.parent is None else index[id(r.parent)] for r in ordered]
    below = dict(zip((r.name for r in ordered), descendant_calls(ordered, parents)))
    # shared is "0.2.0" (its first name), called twice a step: from "0.2" and from "1", which does not contain
    # it (a foreign call, inside "1"'s forward but not below it in the tree). "0.2": shared's own call and
    # Tanh: 2. "0": 0.0, 0.1, 0.2 and those 2: 5. "1": 1.1 only: 1. The root: 5 + 1 + "0" and "1": 8.
    assert records["0.2.0"].calls == 2 and records["0.2.0"].foreign_calls == 1
    assert (below["0.2"], below["0"], below["1"], below[""], below["0.0"]) == (2, 5, 1, 8, 0)


def test_the_profilers_own_time_is_taken_off_each_ancestor() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.Tanh())),
                          nn.Linear(8, 1))
    prof = _profile(model, torch.randn(2, 8, requires_grad=True))
    records = prof.profile.records
    # Measured by the first plan (or save), not with every memory profile (most are never planned), then kept.
    assert "hook_ms" not in prof.meta
    hook_ms = prof.checkpoint_plan(0.5).hook_ms
    assert hook_ms > 0 and prof.meta["hook_ms"] == hook_ms and prof.checkpoint_plan(0.25).hook_ms == hook_ms
    plain = {c.name: c for c in candidates(records[""])}
    found = {c.name: c for c in candidates(records[""], hook_ms=0.01)}
    # "0" holds 5 module calls (0.0, 0.1, 0.2, 0.2.0, 0.2.1), "0.2" 2, a leaf none (clamped at 0 ms).
    assert found["0"].recompute_ms == pytest.approx(max(0.0, plain["0"].recompute_ms - 5 * 0.01))
    assert found["0.2"].recompute_ms == pytest.approx(max(0.0, plain["0.2"].recompute_ms - 2 * 0.01))
    assert found["0.0"].recompute_ms == plain["0.0"].recompute_ms
    # A saved profile keeps the figure of the host that profiled it.
    assert layerprof.loads(prof.profile.to_json()).meta["hook_ms"] == hook_ms


def _forward_wall_ms(model: nn.Module, names: list[str], step: Any, steps: int) -> dict[str, float]:
    """Each named module's fastest forward wall time over ``steps`` plain steps (the first left out), hooks on
    those modules only."""
    times: dict[str, list[float]] = {name: [] for name in names}
    started: dict[str, int] = {}
    handles = []
    for name in names:
        module = model.get_submodule(name)
        handles.append(module.register_forward_pre_hook(
            lambda m, a, name=name: started.__setitem__(name, time.perf_counter_ns())))
        handles.append(module.register_forward_hook(
            lambda m, a, o, name=name: times[name].append((time.perf_counter_ns() - started[name]) / 1e6)))
    try:
        for _ in range(steps):
            step()
    finally:
        for handle in handles:
            handle.remove()
    return {name: min(found[1:]) for name, found in times.items()}


def test_hook_time_brings_a_layers_profiled_forward_near_its_bare_forward() -> None:
    """On a real model: a ViT layer (12 modules inside) is profiled slower than it runs bare, by about its
    descendants' hooks; what the planner takes off (descendant calls x hook_ms) removes most of that excess."""
    pytest.importorskip("transformers")
    model, step = zoo_step("vit")
    layers = [f"layers.{name}" for name, _ in model.layers.named_children()]

    def measure() -> tuple[float, float]:
        """(the layers' profiled forward less their bare forward, what the planner takes off), ms."""
        hook_cost._CACHE.clear()  # a retry calibrates again: a preempted calibration is as likely as a preempted step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LayerProf(model, metrics=("memory",)) as prof:
                for _ in range(8):
                    step()
                    prof.step()
        bare = _forward_wall_ms(model, layers, step, 8)
        records = prof.profile.records
        profiled = sum(records[name].forward_ms_min for name in layers)
        taken = prof.checkpoint_plan(0.5).hook_ms * sum(len(preorder(records[name])) - 1 for name in layers)
        return profiled - sum(bare.values()), taken

    # Idle, on 2 CPU cores: ~0.27-0.37 ms excess a layer at hidden 128, ~0.16-0.2 taken off. Wall-clock times of
    # 8 steps, profiled and bare at different times: another process preempting some steps moves one and not the
    # other, so each side is its fastest step (a preemption only slows one) and the measurement is retried
    # (tests/measured.py); the test asks that the hooks show and the figure is of their size.
    def of_their_size(found: tuple[float, float]) -> bool:
        excess, taken = found
        return excess > 0 and 0.25 * excess < taken < 2.0 * excess

    # Five tries: under two test workers and a benchmark beside them (session 29) three tries all read the hooks'
    # price low (0.07 ms taken off against 0.51 excess); idle, the first try holds.
    found = measured_until(5, measure, of_their_size)
    assert of_their_size(found), found  # (excess, taken) of the last attempt
