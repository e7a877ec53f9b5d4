"""CheckpointPlan: the plan on a profile, applied and removed, predicted against measured, bad input."""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import io
import json
import platform
import re
import time
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import layerprof
from layerprof import LayerProf
from layerprof.plan.apply import RecomputeTimer, is_wrapped, unwrap, wrap, wrap_runs
from layerprof.plan.runs import parse_run, recomputed_children

from .conftest import profile_quietly


def _mlp(depth: int = 4, width: int = 128, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout), nn.Linear(width, width),
                            nn.Tanh()) for _ in range(depth)]
    return nn.Sequential(nn.Linear(16, width), *blocks, nn.Linear(width, 1))


def _profile(model: nn.Module, step, steps: int = 1) -> LayerProf:
    return profile_quietly(model, step, steps, ("memory", "shapes"))


def _state(model: nn.Module) -> dict:
    """Everything a plan could leave behind: instance attributes, hooks, parameters and buffers."""
    return {name: (sorted(module.__dict__), type(module).forward, dict(module._forward_hooks),
                   dict(module._forward_pre_hooks), dict(module._backward_hooks))
            for name, module in model.named_modules()}


def _run(model: nn.Module, x: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(x)
    out.pow(2).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_plan_meets_budget_and_is_bitwise_equal_with_dropout() -> None:
    model = _mlp(dropout=0.1)
    x = torch.randn(64, 16)
    prof = _profile(model, lambda: model(x).pow(2).sum().backward())
    before = _state(model)
    expected = _run(model, x)
    plan = prof.checkpoint_plan("50%")
    assert plan.feasible and plan.modules and plan.saved_bytes_after <= plan.budget_bytes == prof.tree.saved_bytes // 2
    names = plan.modules
    # Never an ancestor and its descendant both. (The whole model is a valid choice: with the wrapper's measured
    # cost, one wrapper around everything can come out cheapest on a loaded machine.)
    assert not any(a != b and (b.startswith(a + ".") or a == "") for a in names for b in names)
    with plan.applied(model):
        got = _run(model, x)  # same seed: Dropout draws the same masks in the forward and the recompute
        measured = _profile(model, lambda: model(x).pow(2).sum().backward())
    assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert measured.tree.saved_bytes == plan.saved_bytes_after  # the meter's figures add up exactly here
    for name in names:  # each wrapped module's children re-ran in backward (its own hooks do not see the re-run),
        children = recomputed_children(measured.records, name)  # or each child of a wrapped run
        assert children and all(child.recompute_ms > 0 for child in children)
    assert _state(model) == before and not plan.is_applied


def test_apply_remove_and_errors() -> None:
    model = _mlp()
    x = torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    # Recompute time only: with the wrappers' cost, wrapping the whole model once can come out as cheap as its
    # four blocks, and this test needs a plan of submodules. Nor the hooks' calibration: read 3-4x high (a burst
    # over its profiled steps), it prices every block's recomputation near 0 and the plan wraps the whole model.
    prof.profile.meta["hook_ms"] = 0.0
    plan = prof.checkpoint_plan(0.5, wrap_cost=None, runs=False)
    plan.apply(model)
    with pytest.raises(RuntimeError, match="already applied"):
        plan.apply(model)
    with pytest.raises(ValueError, match="already wrapped"):
        prof.checkpoint_plan(0.5, wrap_cost=None, runs=False).apply(model)  # the same plan again
    plan.remove()
    plan.remove()  # a second remove does nothing
    other = nn.Sequential(nn.Linear(16, 1))
    with pytest.raises(ValueError, match=r"model: the plan wraps module '\d+', which this Sequential does not have"):
        plan.apply(other)
    assert len(plan.modules) >= 2
    renamed = copy.deepcopy(model)
    last = plan.modules[-1]
    parent, _, attribute = last.rpartition(".")
    expected_type = type(renamed.get_submodule(last)).__name__
    setattr(renamed.get_submodule(parent), attribute, nn.Identity())  # same name, another type
    with pytest.raises(ValueError, match=f"is an Identity, the plan was made for {'an' if expected_type[0] in 'AEIOU' else 'a'} {expected_type}"):
        plan.apply(renamed)
    # All or nothing: the modules before the bad one were not wrapped either.
    assert not any("forward" in module.__dict__ for module in renamed.modules())
    with pytest.raises(TypeError, match="apply takes the nn.Module"):
        plan.apply("model")


@pytest.mark.parametrize("runs", [True, False], ids=["runs of a Sequential", "modules"])
def test_a_deep_copy_made_while_a_plan_is_applied_runs_its_own_modules(runs: bool) -> None:
    # An EMA or teacher copy made inside training, while a plan is applied: the copy's wrapped modules run the
    # copy's own forward and parameters (the wrapper is copied with its module), and the copy pickles
    model = _flat_mlp() if runs else _mlp()
    x = torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    prof.profile.meta["hook_ms"] = 0.0
    plan = prof.checkpoint_plan(0.5, wrap_cost=None, runs=runs)
    assert plan.modules and all(bool(parse_run(name)) == runs for name in plan.modules)
    before = _state(model)
    with plan.applied(model):
        copied = copy.deepcopy(model)
    assert _state(model) == before
    wrapped = [name for name, module in copied.named_modules() if is_wrapped(module)]
    assert wrapped == ([""] if runs else plan.modules)
    reference = copy.deepcopy(model)  # the same parameters, unwrapped
    with torch.no_grad():
        for mine, theirs in zip(copied.parameters(), reference.parameters()):
            mine.mul_(0.5)
            theirs.mul_(0.5)
    model.zero_grad(set_to_none=True)
    got, expected = _run(copied, x), _run(reference, x)
    assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert all(p.grad is None for p in model.parameters())  # none of it ran the original's modules
    buffer = io.BytesIO()
    torch.save(copied, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert [name for name, module in loaded.named_modules() if is_wrapped(module)] == wrapped
    assert torch.equal(_run(loaded, x)[0], got[0])


class _SelfAttentionBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x)  # needs grad: autograd unpacks each of its saved slots as a new object
        return self.attn(hidden, hidden, hidden)[0]


def test_a_wrapped_module_given_one_tensor_in_several_arguments_gets_it_once() -> None:
    # nn.MultiheadAttention takes its self-attention path on `query is key`: the wrapper passes the tensor to
    # checkpoint once, so the recomputation sees one object again, under saved-tensor hooks too (the memory meter,
    # which verify_plan runs; torch's save_on_cpu)
    torch.manual_seed(0)
    model = _SelfAttentionBlock()
    x = torch.randn(2, 5, 8)
    expected = _run(model, x)
    own = wrap(model.attn)
    try:
        with torch.autograd.graph.save_on_cpu():
            under_hooks = _run(model, x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one step under a distorting meter
            with LayerProf(model, metrics=("memory",)) as prof:
                profiled = _run(model, x)
    finally:
        unwrap(model.attn, own)
    for got in (under_hooks, profiled):
        assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    # What the wrapped attention keeps is its input, for the recomputation: [2, 5, 8] float32, 320 B
    assert prof.records["attn"].saved_bytes == 2 * 5 * 8 * 4


def test_budget_edges() -> None:
    model = _mlp()
    x = torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    today = prof.tree.saved_bytes
    nothing = prof.checkpoint_plan(today + 1)
    assert nothing.modules == [] and nothing.feasible and "not below today's saved memory" in nothing.note
    impossible = prof.checkpoint_plan(0)
    assert not impossible.feasible and impossible.modules == []
    assert f"least saved memory any plan reaches is {impossible.least_reachable_bytes} bytes" in impossible.note
    # The least reachable is what wrapping the whole model keeps: its input (8 x 16 float32 = 512 bytes).
    assert impossible.least_reachable_bytes == 512
    # A forward under no_grad saved nothing: the note says so rather than "not below today's saved memory".
    with LayerProf(model, metrics=("memory",)) as inference, torch.no_grad():
        model(x)
    assert inference.checkpoint_plan(0.5).note.startswith("the profiled step saved nothing for backward")
    with pytest.raises(ValueError, match="cannot read budget 'half'"):
        prof.checkpoint_plan("half")
    with pytest.raises(ValueError, match=re.escape("resolution must be >= 16, got 2")):
        prof.checkpoint_plan(0.5, resolution=2)
    with pytest.raises(TypeError, match=re.escape("resolution must be an int >= 16, got '4096' (str)")):
        prof.checkpoint_plan(0.5, resolution="4096")  # (a ValueError before)
    with pytest.raises(TypeError, match="allow_side_effects must be True or False, got 'yes'"):
        prof.checkpoint_plan(0.5, allow_side_effects="yes")


def test_profile_without_memory_figures() -> None:
    model = _mlp()
    with LayerProf(model) as prof:
        model(torch.randn(4, 16)).sum().backward()
    with pytest.raises(ValueError, match=r"has no memory figures: profile a training step .*metrics=\(\"memory\""):
        prof.checkpoint_plan(0.5)


def test_batchnorm_is_excluded_unless_allowed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Tanh()),
                          nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()), nn.Linear(64, 1))
    x = torch.randn(32, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.6)
    assert "side effects" in plan.excluded["1"] and "1.1" in plan.excluded and "" in plan.excluded
    assert not any(name in ("", "1", "1.1") for name in plan.modules)
    allowed = prof.checkpoint_plan(0.6, allow_side_effects=True)
    assert "1" not in allowed.excluded


def test_batchnorm_a_step_in_eval_mode_did_not_update_is_wrapped_with_a_warning() -> None:
    # Profiled in eval mode, BatchNorm updates nothing, so the plan does not exclude it; a step in training mode
    # would then update its running statistics twice (num_batches_tracked 2 a step), which applying the plan
    # warns of. With allow_side_effects=True, or where the profile saw the update (training mode), no warning.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Tanh()),
                          nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()), nn.Linear(64, 1))
    x = torch.randn(32, 16)
    model.eval()
    prof = _profile(model, lambda: model(x).sum().backward())
    model.train()
    plan = prof.checkpoint_plan(0.6)
    assert not plan.excluded  # (the BatchNorm inside the wrapped run or module: named by the warning below)
    with pytest.warns(UserWarning, match=r"the plan wraps modules that keep running statistics \('1.1'\), which the "
                                         r"profiled step did not update \(the model ran in eval mode"):
        with plan.applied(model):
            model(x).sum().backward()
    assert int(model[1][1].num_batches_tracked) == 2  # (what it warns of)
    for quiet in (prof.checkpoint_plan(0.6, allow_side_effects=True),
                  _profile(model, lambda: model(x).sum().backward()).checkpoint_plan(0.6)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with quiet.applied(model):
                pass


def test_pareto_and_plot(tmp_path) -> None:
    model = _mlp()
    x = torch.randn(32, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.5)
    points = plan.pareto()
    assert points[0].saved_bytes == prof.tree.saved_bytes and points[0].extra_ms == 0 and points[0].modules == ()
    assert points[-1].saved_bytes == plan.least_reachable_bytes
    assert all(a.saved_bytes > b.saved_bytes and a.extra_ms < b.extra_ms for a, b in zip(points, points[1:]))
    # The plan is on the frontier (priced cold, as the knapsack chose it): no point reaching the budget is cheaper.
    assert min(p.extra_ms for p in points if p.saved_bytes <= plan.budget_bytes) == pytest.approx(plan.cold_extra_ms)
    ax = prof.plot("checkpoint", budget=0.5, path=tmp_path / "frontier.png")
    gids = {artist.get_gid() for artist in ax.get_children()}
    assert {"checkpoint:frontier", "checkpoint:today", "checkpoint:chosen", "checkpoint:budget"} <= gids
    assert (tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    text = str(plan)
    assert text.startswith("Checkpoint plan for Sequential:") and all(name in text for name in plan.modules)


def test_a_budget_far_above_todays_keeps_the_frontier_readable() -> None:
    """A budget of "1e9" bytes on a model saving about 100 KiB drew its line at 954 MiB and squashed the frontier
    into the axis, in the plot and in the report's panel: the line goes to the legend, marked off the chart."""
    from layerprof.render.checkpoint import frontier_svg
    from layerprof.render.units import format_bytes

    model = _mlp()
    x = torch.randn(32, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan("1e9")
    today = plan.saved_bytes_before / 2**20
    ax = prof.plot("checkpoint", budget="1e9")
    assert ax.get_ylim()[1] < 1.25 * today  # (up to 954 MiB before)
    labels = ax.get_legend_handles_labels()[1]
    assert "budget 954 MiB (above the chart: nothing to wrap)" in labels
    svg = frontier_svg(plan)
    assert 'stroke="#d62728" stroke-dasharray' not in svg and "above the chart: nothing to wrap" in svg
    assert f"up to {format_bytes(plan.saved_bytes_before)}" in svg
    near = frontier_svg(prof.checkpoint_plan(0.5))  # a budget under today's: drawn as a line
    assert 'stroke="#d62728" stroke-dasharray' in near


def test_out_of_reach_for_side_effects_says_what_allowing_them_reaches() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.Tanh(), nn.Linear(64, 64), nn.BatchNorm1d(64))
    x = torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.25)
    # Every module holding a BatchNorm is excluded (the two BNs and the model): the Linears and the Tanh free only
    # what they alone save, and the BNs' inputs stay. Allowed, wrapping the whole model keeps only x: 8 x 16 x 4 B.
    assert not plan.feasible and set(plan.excluded) == {"", "1", "4"}
    allowed = prof.checkpoint_plan(0.25, allow_side_effects=True)
    assert allowed.feasible and allowed.least_reachable_bytes == 8 * 16 * 4
    assert plan.reachable_allowing_side_effects == 8 * 16 * 4 and allowed.reachable_allowing_side_effects is None
    assert plan.note.endswith(f"with allow_side_effects=True (3 modules excluded for side effects on recompute, "
                              f"such as BatchNorm's running statistics) a plan reaches {8 * 16 * 4} bytes. Plan for that "
                              "or more")
    assert "allow_side_effects" not in prof.checkpoint_plan(0, runs=False, allow_side_effects=True).note
    assert str(plan).endswith("excluded: 3 modules (3 side effects on recompute; plan.excluded names them)")


def test_verify_plan() -> None:
    model = _mlp(depth=3)
    x = torch.randn(32, 16)
    step = lambda: model(x).pow(2).sum().backward()  # noqa: E731
    prof = _profile(model, step)
    plan = prof.checkpoint_plan(0.5)
    before = _state(model)
    result = layerprof.verify_plan(plan, model, step, repeats=2)
    assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after
    assert result.meets_budget and result.budget_bytes == plan.budget_bytes
    assert set(result.recompute_ms) == set(plan.modules)
    for name, (predicted, measured) in result.recompute_ms.items():
        assert predicted == plan.chosen[plan.modules.index(name)].recompute_ms
        assert measured > 0, name  # every wrapped module or run, leaves too: its recomputation's wall time
    assert result.step_ms_before > 0 and result.step_ms_after > 0 and result.cuda_peak_bytes is None
    assert len(result.page_faults) == 2 and min(result.page_faults) >= 0  # Linux counts them
    assert 0 < result.fault_us < 1000  # µs a fault, timed in this process (1.5-4 on a 2-core VM)
    assert result.fault_ms == pytest.approx((result.page_faults[1] - result.page_faults[0]) * result.fault_us / 1e3)
    assert _state(model) == before and not plan.is_applied
    with pytest.raises(TypeError, match="step must be a callable"):
        layerprof.verify_plan(plan, model, "step")


class _SelfCheckpointing(nn.Module):
    """Four blocks that the model checkpoints itself once ``gradient_checkpointing`` is set (as Hugging Face's and
    diffusers' models do after ``gradient_checkpointing_enable()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4))
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.gradient_checkpointing else block(x)
        return x


def test_verify_says_when_the_model_checkpoints_itself_since_its_profile() -> None:
    torch.manual_seed(0)
    model, x = _SelfCheckpointing(), torch.randn(32, 16)
    step = lambda: model(x).pow(2).sum().backward()  # noqa: E731
    plan = profile_quietly(model, step, 2).checkpoint_plan(0.9)
    assert plan.modules and "" not in plan.modules and not plan.already_recomputed
    held = layerprof.verify_plan(plan, model, step, repeats=1)
    assert held.recomputed_since == () and "checkpointing was turned on" not in str(held)
    model.gradient_checkpointing = True  # turned on after the profile: the plan was made for another model
    result = layerprof.verify_plan(plan, model, step, repeats=1)
    ours = [name for entry in plan.modules for name in _entry_blocks(entry)]
    mine = tuple(f"blocks.{i}" for i in range(4) if f"blocks.{i}" not in ours)
    assert mine and result.recomputed_since == mine
    assert f"that its profiled step did not ({', '.join(mine)}): its own checkpointing was turned on" in str(result)
    # A profile of the model as it trains now counts them: its plan verifies without the note.
    again = profile_quietly(model, step, 2).checkpoint_plan(0.9)
    assert set(again.already_recomputed) == {f"blocks.{i}" for i in range(4)}
    assert layerprof.verify_plan(again, model, step, repeats=1).recomputed_since == ()


def _entry_blocks(entry: str) -> list[str]:
    """The blocks a plan entry covers: itself or its ancestor block ("blocks.1.0" is in "blocks.1"), or a run's."""
    run = parse_run(entry)
    if run is not None:
        return [f"{run[0]}.{i}" for i in range(run[1], run[2])]
    return [".".join(entry.split(".")[:2])]


def test_verification_text_says_when_the_plan_changes_page_faults() -> None:
    from layerprof.plan.verify import Verification
    from layerprof.render.checkpoint import verification_text

    def text(faults, fault_us=None):
        return verification_text(Verification(
            predicted_saved_bytes=1024, measured_saved_bytes=1024, budget_bytes=2048, predicted_extra_ms=18.8,
            measured_extra_ms=24.2, step_ms_before=41.0, step_ms_after=65.2, recompute_ms={"encoder": (14.1, 19.0)},
            page_faults=faults, fault_us=fault_us))

    # ALBERT's 25 % plan in a fresh process (BENCHMARKS.md): 128 faults a step without it, 3,024 with it. On glibc,
    # the line after says what keeps the pages (the heap's top, trimmed and taken again each step).
    keep = ["  (glibc gives the top of its heap back to the system and takes it again each step; after the first "
            "steps, ctypes.CDLL(\"libc.so.6\").mallopt(-1, 2**30), M_TRIM_THRESHOLD, keeps it, and the process its "
            "peak heap)"] if platform.libc_ver()[0] == "glibc" else []
    assert text((128, 3024)).splitlines() == [
        "verified: saved 1 KiB measured against 1 KiB predicted (+0.0%), budget met; step 41 ms -> 65.2 ms "
        "(+24.2 ms measured, +18.8 ms predicted)",
        "  recomputed per step, measured against predicted:",
        "    encoder      19 ms against   14.1 ms",
        "  page faults a step: 128 -> 3,024 (the allocator hands the recomputation fresh pages, which the "
        "prediction leaves out)",
        *keep,
    ]
    assert "mallopt" not in text((1664, 608))  # fewer faults: nothing to keep
    assert text((1664, 608)).splitlines()[-1].startswith("  page faults a step: 1,664 -> 608 (the allocator needs "
                                                           "fewer fresh pages")
    assert "page faults" not in text((1000, 1255)) and "page faults" not in text(None)  # under 256: not said
    # Priced at 2 µs a fault: (3,024 - 128) x 2 µs = 5.792 ms a step, and 24.2 - 5.792 = 18.408 ms measured less it.
    assert text((128, 3024), fault_us=2.0).splitlines()[-1] == (
        "  at 2.0 µs a fault (timed here) that is +5.79 ms a step; less that, the plan costs +18.4 ms against "
        "+18.8 ms predicted")
    # Fewer faults: (608 - 1,664) x 2.5 µs = -2.64 ms, so the plan would cost 24.2 + 2.64 = 26.84 ms without the saving.
    assert text((1664, 608), fault_us=2.5).splitlines()[-1].startswith("  at 2.5 µs a fault (timed here) that is "
                                                                       "-2.64 ms a step; less that, the plan costs "
                                                                       "+26.8 ms")
    assert "µs a fault" not in text((1000, 1255), fault_us=2.0)  # not said where the faults are not


class _Sleepy(nn.Module):
    """A leaf whose forward sleeps 20 ms before an op that saves its input (so a recomputation runs the sleep),
    keeping how long each sleep really took (ms): checks compare intervals, which no load can break."""

    def __init__(self) -> None:
        super().__init__()
        self.slept_ms: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        time.sleep(0.02)
        self.slept_ms.append((time.perf_counter() - start) * 1e3)
        return x.sin()


def test_recompute_timer_times_each_labelled_recomputation_only() -> None:
    net = nn.Sequential(nn.Linear(4, 4), _Sleepy(), nn.Sequential(_Sleepy(), nn.Tanh(), nn.Linear(4, 4)))
    x = torch.randn(2, 4, requires_grad=True)
    owns = [(net[1], wrap(net[1], label="1")), (net[2], wrap_runs(net[2], [(0, 2)], labels={(0, 2): "2[0:2]"}))]
    try:
        with RecomputeTimer() as forward_only:
            loss = net(x).sum()  # two sleeps of 20 ms in the forward: not recomputations
        assert forward_only.ms == {}
        with RecomputeTimer() as timer:
            start = time.perf_counter()
            loss.backward()
            backward_ms = (time.perf_counter() - start) * 1e3
        # Each region recomputed once in this backward: its sleep (the last of its _Sleepy's) and its sin (and
        # tanh), nothing more: each reading holds its own sleep, and the two are disjoint inside the backward's wall
        # time (a region that also timed the other's recomputation would sum to more than the backward took).
        assert set(timer.ms) == {"1", "2[0:2]"}
        assert timer.ms["1"] >= net[1].slept_ms[-1] and timer.ms["2[0:2]"] >= net[2][0].slept_ms[-1], timer.ms
        assert len(net[1].slept_ms) == len(net[2][0].slept_ms) == 2  # a forward and a recomputation each
        assert sum(timer.ms.values()) <= backward_ms
        with timer, pytest.raises(RuntimeError, match="already active"), RecomputeTimer():
            pass
    finally:
        for module, own in owns:
            unwrap(module, own)
    assert all("forward" not in module.__dict__ for module in net.modules())

def test_recompute_timer_splits_the_wrappers_forward_from_the_regions() -> None:
    net = nn.Sequential(nn.Linear(4, 4), _Sleepy(), nn.Sequential(_Sleepy(), nn.Tanh(), nn.Linear(4, 4)))
    x = torch.randn(2, 4, requires_grad=True)
    owns = [(net[1], wrap(net[1], label="1")), (net[2], wrap_runs(net[2], [(0, 2)], labels={(0, 2): "2[0:2]"}))]
    ticks = iter(range(1000))
    try:
        # A clock that reads 0, 1, 2, ... seconds, called by the timer only. Forward, per wrapper: the call starts
        # (t), the region starts (t + 1) and ends (t + 2), the call ends (t + 3): 3 s less the region's 1 s, 2000 ms.
        # Backward, per recomputation: it starts and ends, 1 s: 1000 ms. The region under the label "1" and the run
        # "2[0:2]" each once.
        with RecomputeTimer(clock=lambda: float(next(ticks))) as timer:
            net(x).sum().backward()
        assert timer.wrapper_forward_ms == {"1": 2000.0, "2[0:2]": 2000.0}
        assert timer.ms == {"1": 1000.0, "2[0:2]": 1000.0}
        assert next(ticks) == 2 * 4 + 2 * 2  # the timer read the clock 12 times
        # On the real clock the sleeps (20 ms each) are the regions' own forward, not the wrappers': each
        # wrapper's own forward is shorter than its region's sleep, each recomputation holds its region's sleep, and
        # the two recomputations are disjoint inside the backward's wall time.
        with RecomputeTimer() as timer:
            loss = net(x).sum()
            start = time.perf_counter()
            loss.backward()
            backward_ms = (time.perf_counter() - start) * 1e3
        sleeps = {"1": net[1].slept_ms, "2[0:2]": net[2][0].slept_ms}  # [..., this forward's, its recomputation's]
        assert all(0 < timer.wrapper_forward_ms[label] < slept[-2] for label, slept in sleeps.items()), (
            timer.wrapper_forward_ms, sleeps)
        assert all(timer.ms[label] >= slept[-1] for label, slept in sleeps.items()), (timer.ms, sleeps)
        assert sum(timer.ms.values()) <= backward_ms
    finally:
        for module, own in owns:
            unwrap(module, own)



def test_a_saved_profile_plans_the_same() -> None:
    model = _mlp()
    x = torch.randn(16, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    loaded = layerprof.loads(prof.to_json())
    for budget in (0.25, "50%", 0.75):
        # The file keeps the profiled step's storages (layerprof.record.step_tables): runs and the peak of saved
        # bytes are worked out from them as on the live profile.
        from_file, live = loaded.checkpoint_plan(budget).to_dict(), prof.checkpoint_plan(budget).to_dict()
        assert live["saved_peak_bytes"] > 0
        assert from_file == live
    assert any("[" in item["name"] for item in live["chosen"])  # the 75 % plan wraps a run: compared too


def test_a_profile_from_another_machine_planned_at_this_ones_wrapper_price_says_so() -> None:
    # The wrapper's cost is host-side Python, measured on the machine that plans; the recompute times and the
    # hooks' figure come from the file. Planned elsewhere, the plan's extra time held this host's price unsaid.
    model = _mlp()
    x = torch.randn(16, 16)
    saved = json.loads(_profile(model, lambda: model(x).sum().backward()).to_json())
    here = layerprof.loads(json.dumps(saved))
    saved["meta"]["environment"]["host"] = "gpu-node-17"
    elsewhere = layerprof.loads(json.dumps(saved))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        here.checkpoint_plan(0.5)  # this machine's profile: nothing to say
        elsewhere.checkpoint_plan(0.5, wrap_cost=(0.4, 0.012))  # that machine's price, given
    with pytest.warns(RuntimeWarning, match=r"another machine \(host 'gpu-node-17'\).*wrap_cost=\(per_call_ms"):
        plan = elsewhere.checkpoint_plan(0.5)
    assert plan.to_dict() == here.checkpoint_plan(0.5).to_dict()  # the same plan, only said


def test_report_has_a_checkpoint_panel_with_memory_figures() -> None:
    model = _mlp()
    x = torch.randn(16, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    page = prof.to_report()
    assert '<section id="checkpoint-section">' in page and 'class="checkpoint-frontier"' in page
    assert "today: " in page and "Checkpoint plan for Sequential" in page
    with LayerProf(model) as plain:
        model(x).sum().backward()
    assert 'id="checkpoint-section"' not in plain.to_report()  # (the stylesheet names it in every report)
    # A step of two micro-batches (gradient accumulation) is no step to plan on: the report is written, and its
    # panel says why (before: to_report raised the planner's ValueError, and no report was written).
    accumulated = _profile(model, lambda: [model(x).sum().backward() for _ in range(2)])
    with pytest.raises(ValueError, match="gradient accumulation"):
        accumulated.checkpoint_plan(0.5)
    page = accumulated.to_report()
    assert re.search(r'<section id="checkpoint-section">\n  <h2>Checkpoint plans</h2>\n  <p>No plan: in the profiled '
                     r"step, 1 forward\(s\) that saved for backward began after", page)
    assert "Checkpoint plan for Sequential" not in page and "</html>" in page


def _flat_mlp(depth: int = 6, width: int = 128) -> nn.Sequential:
    """An nn.Sequential of single layers, as checkpoint_sequential takes: runs of them are no module of the tree."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(16, width)]
    for _ in range(depth):
        layers += [nn.GELU(), nn.Dropout(0.1), nn.Linear(width, width)]
    return nn.Sequential(*layers, nn.Tanh(), nn.Linear(width, 1))


def test_runs_of_a_sequential_are_planned_applied_and_removed() -> None:
    model = _flat_mlp()
    x = torch.randn(64, 16)
    prof = _profile(model, lambda: model(x).pow(2).sum().backward())
    before = _state(model)
    expected = _run(model, x)
    plan = prof.checkpoint_plan("50%")
    by_modules = prof.checkpoint_plan("50%", runs=False)
    runs = [parse_run(name) for name in plan.modules if parse_run(name)]
    # The flat model's layers are leaves: one wrapper over a run of them holds one input where a wrapper per
    # layer holds each one's, so the plan takes runs, and costs less than the best plan over modules.
    assert runs and all(parent == "" and stop - first >= 2 for parent, first, stop in runs)
    assert plan.feasible and plan.saved_bytes_after <= plan.budget_bytes
    assert plan.extra_ms < by_modules.extra_ms
    assert all(c.type == "Sequential" for c in plan.chosen if parse_run(c.name))  # the type a run is cut from
    assert [c.run for c in plan.chosen] == [stop - first if (parent, first, stop) in runs else 0
                                            for parent, first, stop in map(lambda n: parse_run(n) or ("", 0, 0), plan.modules)]
    modules = len(plan.modules) - len(runs)
    counted = f"{len(runs)} run{'s' * (len(runs) > 1)}"
    counted = f"{modules} module{'s' * (modules > 1)} and {counted}" if modules else counted
    assert str(plan).splitlines()[0].endswith(f"{counted} wrapped") and counted in repr(plan)
    assert [entry["run"] for entry in plan.to_dict()["chosen"]] == [c.run for c in plan.chosen]
    with plan.applied(model):
        assert is_wrapped(model)  # the Sequential's forward, replaced
        got = _run(model, x)  # the same Dropout masks in forward and recompute: bitwise equal
        measured = _profile(model, lambda: model(x).pow(2).sum().backward())
    assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert measured.tree.saved_bytes == plan.saved_bytes_after  # the storages replayed with the runs wrapped
    for name in plan.modules:
        assert all(child.recompute_ms > 0 for child in recomputed_children(measured.records, name))
    assert _state(model) == before and not plan.is_applied
    assert any(parse_run(name) for point in plan.pareto() for name in point.modules)
    # A Sequential subclass has a forward of its own: a run of it is refused, and nothing is left wrapped.
    class Other(nn.Sequential):
        pass

    other = Other(*model)
    with pytest.raises(ValueError, match=r"the model, parent of run '\[\d+:\d+\]', is an Other, the plan was made "
                       r"for a Sequential"):
        plan.apply(other)
    assert not any("forward" in module.__dict__ for module in other.modules())
    # So has a Sequential whose instance carries a forward (another tool's hook, a patch): a run's wrapper would
    # replace it and change what the model computes; refused before anything is wrapped, the plan of modules taken.
    scaled = model.forward
    model.forward = lambda x: scaled(x * 0.5)  # type: ignore[method-assign]
    expected = _run(model, x)
    with pytest.raises(ValueError, match=r"the run '\[\d+:\d+\]' of the model \(a Sequential\), whose instance has "
                       r"a forward of its own .* plan without runs \(prof.checkpoint_plan\(..., runs=False\)\)"):
        plan.apply(model)
    assert not plan.is_applied and not any(is_wrapped(module) for module in model.modules())
    with by_modules.applied(model):
        got = _run(model, x)
    assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    del model.forward


def _every_run(name: str) -> tuple[Any, list[tuple[str, ...]]]:
    """The storage tables of a zoo model's profiled step, and every run of every Sequential in it (its children's
    names), runs from one child in order."""
    from layerprof.metrics.checkpoint_bytes import STORAGES_ATTRIBUTE
    from tests.checkpoint_zoo import zoo_step

    if name != "mlp":
        pytest.importorskip("torchvision")
    model, step = zoo_step(name)
    prof = _profile(model, step)
    runs = [tuple(child.name for child in record.children[first:stop])
            for record in prof.records.values() if record.type == "Sequential"
            for first in range(len(record.children)) for stop in range(first + 2, len(record.children) + 1)]
    return prof.tree.__dict__[STORAGES_ATTRIBUTE], runs


@pytest.mark.parametrize("name", ["mlp", "resnet50", "densenet121"])
def test_what_a_run_frees_is_the_replay_of_the_storages(name: str) -> None:
    """``freed_by_runs`` (which touches only a run's storages) against replaying every storage of the step with
    the run wrapped (``saved_after``), for every run of every Sequential of real models (nested calls inside)."""
    from layerprof.metrics.checkpoint_bytes import freed_by_runs, saved_after

    tables, runs = _every_run(name)
    before = saved_after(tables, set())
    assert len(runs) >= 10 and freed_by_runs(tables, runs) == [before - saved_after(tables, set(), [run]) for run in runs]


@pytest.mark.parametrize("name", ["mlp", "resnet50"])
def test_what_a_run_frees_does_not_hang_on_the_order_of_the_runs(name: str) -> None:
    """``freed_by_runs`` carries a run's calls and storages on to the next run where that one only adds a module
    (the planner's order): in reverse order no run extends the one before, and each is read afresh, with the
    same figures (nested calls, storages saved in several children)."""
    from layerprof.metrics.checkpoint_bytes import freed_by_runs

    tables, runs = _every_run(name)
    forward = freed_by_runs(tables, runs)
    assert len(runs) >= 10 and sum(1 for value in forward if value > 0) >= 5  # runs that free something
    assert freed_by_runs(tables, runs[::-1]) == forward[::-1]


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
def test_a_plan_names_what_the_model_already_recomputes() -> None:
    pytest.importorskip("transformers")
    from .models import CheckpointedBody
    from .test_zoo import _bert

    torch.manual_seed(0)
    model, inputs = _bert()
    model.gradient_checkpointing_enable()
    model.train()
    prof = _profile(model, lambda: model(**inputs).last_hidden_state.sum().backward())
    plan = prof.checkpoint_plan(0.5)
    # HF checkpoints each layer (its forward in transformers 5.24: the layers' children re-run, the layers' own
    # hooks do not; its __call__ in 5.17: the layers' hooks run again too); the encoder, whose only called children
    # are the layers, the model and the embeddings are not recomputed themselves
    assert plan.already_recomputed == ["encoder.layer.0", "encoder.layer.1"]
    assert plan.to_dict()["already_recomputed"] == ["encoder.layer.0", "encoder.layer.1"]
    assert ("note: the model already recomputes 2 modules in backward (its own checkpointing): encoder.layer.0, "
            "encoder.layer.1;") in str(plan)
    # an own checkpointed call is named itself, and not its parent (which only calls it)
    net = nn.Sequential(nn.Linear(8, 8), CheckpointedBody())
    prof = _profile(net, lambda: net(torch.randn(4, 8)).sum().backward())
    plan = prof.checkpoint_plan(0.5)
    assert plan.already_recomputed == ["1.body"]
    # a model that checkpoints nothing: no note
    plain = _mlp()
    prof = _profile(plain, lambda: plain(torch.randn(8, 16)).sum().backward())
    plan = prof.checkpoint_plan(0.5)
    assert plan.already_recomputed == [] and "already recomputes" not in str(plan)


class _TwoLayers(nn.Module):
    """Two MLP layers, checkpointed each by itself (``each``) or as one forward: the parent's own call is never
    re-run, its two layers' calls both are, in backward order or in forward order."""

    def __init__(self, each: bool) -> None:
        super().__init__()
        self.each = each
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(2))

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.each else layer(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x) if self.each else checkpoint(self._run, x, use_reentrant=False)


@pytest.mark.parametrize("each,named", [(True, ["1.layers.0", "1.layers.1"]), (False, ["1"])], ids=["each", "whole"])
def test_layers_checkpointed_each_are_named_and_not_their_parent(each: bool, named: list[str]) -> None:
    net = nn.Sequential(nn.Linear(8, 8), _TwoLayers(each), nn.Linear(8, 1))
    prof = _profile(net, lambda: net(torch.randn(4, 8)).sum().backward(), steps=2)
    # both layers' own calls re-ran, the parent's did not, either way (call_times: the last step's calls)
    assert [sum(t.recompute for t in prof.records[f"1.layers.{i}"].call_times) for i in (0, 1)] == [1, 1]
    assert not any(t.recompute for t in prof.records["1"].call_times)
    assert prof.checkpoint_plan(0.5).already_recomputed == named


class _SequentialHoldingAnAlias(nn.Module):
    """A Sequential whose first child is first named outside it ("a"): its record children are "seq.1" to
    "seq.5", at positions 0 to 4 of the record's children but 1 to 5 of the Sequential."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(256, 256)
        self.seq = nn.Sequential(self.a, nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.seq(x))


def test_no_run_of_a_sequential_whose_children_are_not_its_records_children() -> None:
    # A run is cut by the Sequential's positions when applied, and priced from the record's children: with a child
    # recorded under another name the two differ ("seq[1:4]" priced seq.2 to seq.4 and would wrap seq.1 to
    # seq.3), so such a Sequential offers no runs (its modules may still be wrapped one by one).
    model = _SequentialHoldingAnAlias()
    x = torch.randn(64, 256, requires_grad=True)
    prof = _profile(model, lambda: model(x).sum().backward())
    assert [c.name for c in prof.records["seq"].children] == [f"seq.{i}" for i in range(1, 6)]
    for budget in (0.9, 0.7, 0.5):
        plan = prof.checkpoint_plan(budget, wrap_cost=(0.01, 0.001))
        assert not any(parse_run(name) for point in plan.pareto() for name in point.modules), budget


def test_saved_peak_of_a_table() -> None:
    from layerprof.metrics.checkpoint_bytes import saved_after, saved_peak

    # Calls in forward order: a, b (calling b.x), c. Storages: 100 bytes saved by a, 1,000 saved by b.x, 10 taken
    # as b's input and saved by no one, 500 saved by c.
    table = {"names": ["a", "b", "b.x", "c"], "parents": [-1, -1, 1, -1], "sizes": [100, 1000, 10, 500],
             "savers": [[0], [2], [], [3]], "inputs": [[], [], [1], []]}
    assert saved_peak([table], set()) == (1600, None)  # nothing wrapped: all saved at the end of forward
    # b wrapped: 100 + 10 (its input, held) + 500 = 610 at the end of forward; when backward reaches b, c's 500 are
    # released and b's recomputation saves its 1,000 again beside a's 100 and its input: 1,110.
    assert saved_after([table], {"b"}) == 610 and saved_peak([table], {"b"}) == (1110, "b")
    # c wrapped (the last call): recomputed first in backward, with all before it still held: 1,100 + 500 = today's.
    assert saved_after([table], {"c"}) == 1100 and saved_peak([table], {"c"}) == (1600, "c")
    # b and c as one run: its recomputation saves 1,000 + 500 again beside a's 100 and b's input 10.
    assert saved_peak([table], set(), [["b", "c"]]) == (1610, "b")


def test_plan_text_notes_a_recomputation_that_brings_the_peak_back() -> None:
    from types import SimpleNamespace

    from layerprof.render.checkpoint import plan_text

    def notes(peak, where="encoder"):
        plan = SimpleNamespace(model_type="AlbertModel", saved_bytes_before=20 * 2**20, saved_bytes_after=2**20,
                               budget_bytes=5 * 2**20, extra_ms=23.1, chosen=[], note=None, excluded={},
                               saved_peak_bytes=peak, saved_peak_at=where)
        return [line for line in plan_text(plan).splitlines() if line.startswith("note")]

    # 20.5 MiB saved at once when backward recomputes the encoder: 102.5 % of today's 20 MiB, at least 95 %: noted.
    assert notes(int(20.5 * 2**20)) == [
        "note: when backward recomputes encoder, 20.5 MiB is saved at once, 102.5% of today's 20 MiB: the step's "
        "peak memory stays about where it is (a plan lowers what is held from forward to backward, not the peak), "
        "and the allocator may map fresh pages for the recomputation every step (page faults, not in the predicted "
        "time)"]
    assert notes(19 * 2**20) != []  # 95.0 %, the edge: noted
    assert notes(18 * 2**20) == []  # 90 %: the peak is lowered
    assert notes(20 * 2**20, where=None) == [] and notes(None, where=None) == []  # at the end of forward; no storages


def test_saved_peak_of_a_real_plan() -> None:
    model = _mlp(depth=4)
    x = torch.randn(64, 16)
    prof = _profile(model, lambda: model(x).pow(2).sum().backward())
    prof.profile.meta["hook_ms"] = 0.0  # the profiled times, as in test_apply_remove_and_errors
    # One wrapper around the whole model (the least reachable, which only it meets): it keeps x (64 x 16 float32,
    # 4,096 bytes), and its recomputation saves all the rest again beside it: today's bytes, at once.
    whole = prof.checkpoint_plan(prof.checkpoint_plan(1).least_reachable_bytes, wrap_cost=None, runs=False)
    assert whole.modules == [""] and whole.saved_bytes_after == 64 * 16 * 4
    assert (whole.saved_peak_bytes, whole.saved_peak_at) == (whole.saved_bytes_before, "")
    assert "note: when backward recomputes <model>, 420 KiB is saved at once, 100.0% of today's" in str(whole)
    # Half the saved bytes, blocks wrapped: the peak is lower than today's and not noted.
    half = prof.checkpoint_plan(0.5, wrap_cost=None, runs=False)
    assert half.saved_bytes_after <= half.saved_peak_bytes < 0.95 * half.saved_bytes_before
    assert "saved at once" not in str(half)
    assert half.to_dict()["saved_peak_bytes"] == half.saved_peak_bytes


def test_saved_peak_at_names_the_wrapped_run_not_its_first_child() -> None:
    # A run's recomputation is where the peak is reached: the plan names the run ("1[2:7]"), one of its wrapped
    # entries, not the run's first child ("1.2"), which it does not wrap by itself.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.Tanh())]),
                          nn.Linear(64, 16))
    x = torch.randn(32, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    at_runs = 0
    for budget in (0.9, 0.7, 0.5, 0.3):
        plan = prof.checkpoint_plan(budget, wrap_cost=(0.01, 0.001))
        assert plan.saved_peak_at is None or plan.saved_peak_at in plan.modules, (budget, plan.modules,
                                                                                  plan.saved_peak_at)
        at_runs += plan.saved_peak_at is not None and parse_run(plan.saved_peak_at) is not None
    assert at_runs >= 1  # (the model's one Sequential of 8 children: each budget's plan is a run of them)


def test_a_verified_steps_time_on_cuda_holds_its_kernels() -> None:
    """On CUDA a step returns when its kernels are queued: ``verify_plan`` synchronizes before the clock starts
    (the work queued earlier is not the step's) and before it stops (the step's kernels are)."""
    from layerprof.plan.verify import _timed

    calls: list[str] = []

    def sync() -> None:
        calls.append("sync")
        if len(calls) == 3:
            time.sleep(0.02)  # the step's kernels, still running when step() returned

    ms, _ = _timed(lambda: calls.append("step"), sync)
    assert calls == ["sync", "step", "sync"] and ms >= 20


def test_a_step_of_accumulated_micro_batches_is_refused_for_a_saved_bytes_budget() -> None:
    # Four micro-batches, each forward's backward before the next forward (gradient accumulation): the step's saved
    # bytes sum four of which one is held at a time, and a 50 % budget of that sum wrapped the whole model (five
    # times the recompute time of the plan for one micro-batch), verified "met" against the same sum.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))
    batches = [torch.randn(8, 64) for _ in range(4)]
    with LayerProf(model, metrics=("memory",)) as prof:
        for x in batches:
            model(x).sum().backward()
    one = 8 * 128 * 4 * 2 + 8 * 64 * 4  # per micro-batch, fp32: the two Tanh outputs (each also the next Linear's
    # saved input: one storage) and the first Linear's input, 10,240 bytes
    assert prof.profile.meta["memory"]["forwards_after_backward"] == 3 and prof.tree.saved_bytes == 4 * one
    message = ("checkpoint_plan: in the profiled step, 3 forward(s) that saved for backward began after the backward "
               "of every earlier one had run (gradient accumulation: micro-batches, each with its backward), so its "
               f"saved bytes ({4 * one}) sum forwards never held at once")
    with pytest.raises(ValueError, match=re.escape(message)):
        prof.profile.checkpoint_plan("50%")
    with pytest.raises(ValueError, match=re.escape(message)):  # a saved profile keeps what it ran
        layerprof.loads(prof.profile.to_json()).checkpoint_plan("50%")
    # One micro-batch a step, as the message says: planned on one micro-batch's bytes.
    with LayerProf(model, metrics=("memory",)) as prof:
        for x in batches:
            model(x).sum().backward()
            prof.step()
    assert "forwards_after_backward" not in prof.profile.meta.get("memory", {})
    plan = prof.profile.checkpoint_plan("50%", wrap_cost=None)
    assert plan.saved_bytes_before == one and plan.saved_bytes_after <= one // 2
    # A generator's forward held across a discriminator's backward (a GAN step: G, D on real and on fake, D's
    # backward, D on fake again, G's backward): not every earlier forward was released, so it is planned.
    generator, critic = nn.Linear(8, 64), nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    both = nn.ModuleDict({"generator": generator, "critic": critic})
    with LayerProf(both, metrics=("memory",)) as prof:
        fake = generator(torch.randn(8, 8))
        (critic(torch.randn(8, 64)) - critic(fake.detach())).mean().backward()
        critic(fake).mean().backward()
    assert "forwards_after_backward" not in prof.profile.meta.get("memory", {})
    # Two forwards and one backward of both (a siamese loss) hold both at once: planned on their sum.
    with LayerProf(model, metrics=("memory",)) as prof:
        (model(batches[0]) - model(batches[1])).pow(2).sum().backward()
    assert "forwards_after_backward" not in prof.profile.meta.get("memory", {})
    assert prof.profile.checkpoint_plan("50%", wrap_cost=None).saved_bytes_before == 2 * one


def test_calls_made_with_gradients_off_are_not_priced_as_recomputed() -> None:
    # A reference pass through the same modules under no_grad (DPO, a teacher or EMA pass), then the trained pass:
    # a checkpoint re-runs the second only. Before, each layer was priced at both calls' forward time (2-3x what
    # verify_plan measured on a PEFT Llama) and the knapsack chose other, costlier plans.
    from layerprof.plan.candidates import candidates

    torch.manual_seed(0)
    model = _mlp(depth=4, width=64)
    x = torch.randn(16, 16)

    def step() -> None:
        with torch.no_grad():
            model(x)
        model(x).sum().backward()

    prof = _profile(model, step, steps=3)
    record = prof.records["1"]
    assert record.calls == 2 and record.checkpoint_no_grad_calls == 1 and prof.tree.checkpoint_no_grad_calls == 1
    found = {candidate.name: candidate for candidate in candidates(prof.tree)}
    forward = record.forward_ms_median  # both calls; the one a checkpoint re-runs is half of it (same work)
    assert found["1"].recompute_ms == pytest.approx(forward / 2)
    assert found["1"].calls == 2  # (both calls; the wrapper is priced on the one with gradients: grad_calls)
    # Without the reference pass nothing is scaled.
    plain = _profile(model, lambda: model(x).sum().backward(), steps=3)
    assert plain.records["1"].checkpoint_no_grad_calls == 0
    assert {c.name: c for c in candidates(plain.tree)}["1"].recompute_ms == pytest.approx(
        plain.records["1"].forward_ms_median)


def test_a_plan_for_two_models_held_in_a_module_dict() -> None:
    # One LayerProf on a ModuleDict of a generator and a critic (as the refusal of two profilers on shared modules
    # advises): the root is never called, so it has no figures of its own. The plan was refused ("it has no memory
    # figures"); it now plans over the two models, and verify_plan measures what it predicts.
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 64))
    critic = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
    both = nn.ModuleDict({"generator": generator, "critic": critic})
    z, real = torch.randn(32, 8), torch.randn(32, 64)

    def step() -> list[torch.Tensor]:
        both.zero_grad(set_to_none=True)
        fake = generator(z)
        (critic(real) - critic(fake.detach())).mean().backward()
        critic(fake).mean().backward()
        return [p.grad.clone() for p in both.parameters()]

    plain = step()
    before = _state(both)
    prof = _profile(both, step, steps=2)
    assert prof.tree.saved_bytes is None and prof.tree.calls == 0
    # the generator's 32x8 input and its 32x256 Tanh output, and the critic's three calls' 32x64 input and two
    # 32x256 Tanh outputs, fp32: 4 * (32 * 8 + 32 * 256 + 3 * (32 * 64 + 2 * 32 * 256)) = 254,976 bytes
    plan = prof.profile.checkpoint_plan("50%", wrap_cost=None)
    assert plan.saved_bytes_before == 4 * (32 * 8 + 32 * 256 + 3 * (32 * 64 + 2 * 32 * 256)) == 254_976
    assert plan.feasible and plan.saved_bytes_after <= plan.budget_bytes and plan.modules
    with plan.applied(both):
        assert all(torch.equal(a, b) for a, b in zip(step(), plain))
    assert _state(both) == before
    result = layerprof.verify_plan(plan, both, step, repeats=1)
    assert result.measured_saved_bytes == plan.saved_bytes_after


def test_accumulated_micro_batches_are_refused_under_the_live_bytes_meter_too() -> None:
    # The live-bytes meter is the memory meter with more: its meta is under its own name.
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with LayerProf(model, metrics=("live_memory",)) as prof:
            for _ in range(2):
                model(torch.randn(8, 16)).sum().backward()
    assert prof.profile.meta["live_memory"]["forwards_after_backward"] == 1
    with pytest.raises(ValueError, match=r"1 forward\(s\) that saved for backward began after the backward"):
        prof.profile.checkpoint_plan("50%")
    assert prof.profile.checkpoint_plan(peak="90%", wrap_cost=None).peak_budget_bytes > 0  # by the peak: planned


class _Ema(nn.Module):
    """Keeps a running mean of its inputs and a count of its calls in buffers (an EMA codebook's pattern)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
                self.calls += 1
        return x - self.mean


def test_modules_whose_forward_updates_buffers_are_excluded_with_their_callers() -> None:
    # A spectral norm advances its power-iteration vectors each time the weight is read in training: recomputed,
    # they advanced twice and 7 gradients differed from the unwrapped model's (5.9e-3), with nothing excluded. The
    # older hook-based spectral_norm updates its Linear's buffers in a forward pre-hook; an EMA counted 2 calls a step.
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(64, 64)), nn.Tanh()),
        nn.Sequential(nn.utils.spectral_norm(nn.Linear(64, 64)), nn.Tanh()),
        nn.Sequential(nn.Linear(64, 64), _Ema(64), nn.Tanh()),
        nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()), nn.Linear(64, 1))
    x = torch.randn(32, 16)
    twin = copy.deepcopy(model)
    prof = _profile(model, lambda: model(x).sum().backward(), steps=2)
    plan = prof.checkpoint_plan(0.95)
    side = {name for name, why in plan.excluded.items() if why.startswith("side effects")}
    assert side == {"", "1", "1.0", "1.0.parametrizations.weight", "1.0.parametrizations.weight.0", "2", "2.0", "3",
                    "3.1"}
    assert plan.modules and not any(name in side or name.startswith(("1", "2", "3")) for name in plan.modules)
    # Applied to a copy in the profiled model's state: the step is bitwise the unwrapped one's, and so are the buffers.
    twin.load_state_dict(model.state_dict())
    wrapped = copy.deepcopy(twin)
    expected = _run(twin, x)
    with plan.applied(wrapped):
        got = _run(wrapped, x)
    assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert all(torch.equal(a, b) for a, b in zip(wrapped.buffers(), twin.buffers()))
    assert int(wrapped[3][1].calls) == int(twin[3][1].calls) == 3  # two profiled steps and this one: once each
    assert "1" not in prof.checkpoint_plan(0.95, allow_side_effects=True).excluded


def test_a_gradient_penalty_step_is_planned_not_taken_for_micro_batches() -> None:
    # WGAN-GP: the critic on interpolates, its input gradient with create_graph=True (a backward that keeps the
    # graph), then the critic on fake and real and one backward through all. The first forward's saved tensors are
    # held to the end, but a backward of it had run before the next forward: refused as gradient accumulation.
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    real, fake, alpha = torch.randn(16, 32), torch.randn(16, 32), torch.rand(16, 1)

    def step() -> None:
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
        grad, = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
        (critic(fake).mean() - critic(real).mean() + 10 * (grad.norm(dim=1) - 1).pow(2).mean()).backward()

    prof = _profile(critic, step, steps=2)
    assert "forwards_after_backward" not in prof.profile.meta.get("memory", {})
    plan = prof.checkpoint_plan("50%", wrap_cost=None)
    assert plan.modules and plan.feasible
    result = layerprof.verify_plan(plan, critic, step, repeats=2)
    assert result.measured_saved_bytes == result.predicted_saved_bytes and result.meets_budget


def test_applying_a_plan_over_modules_with_forward_hooks_warns_and_names_them() -> None:
    # A checkpoint re-runs the wrapped forward in backward, hooks included: a feature-capturing hook ran 6 times a
    # step instead of 3, silently.
    model = _mlp(depth=3)
    x = torch.randn(32, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no hook: no warning
        with plan.applied(model):
            pass
    features: list[torch.Tensor] = []
    for block in list(model)[1:4]:
        block[4].register_forward_hook(lambda module, args, output: features.append(output))
    with pytest.warns(UserWarning, match=r"the plan wraps modules that carry forward hooks \(('[123]\.4'(, )?)+\): "
                                         "a checkpoint runs their forward again in backward") as caught:
        with plan.applied(model):
            model(x).sum().backward()
    named = re.findall(r"'([123])\.4'", str(caught[0].message))
    assert named and all(any(m.startswith(n) or m.startswith(f"[") for m in plan.modules) for n in named)
    # What it warns of: the named hooks ran again (those at a region's end may not: checkpoint stops its
    # recomputation once it has every tensor backward needs).
    assert 3 < len(features) <= 3 + len(named)
    # A hook on a wrapped module itself runs in its __call__, around the checkpoint, once a step: no warning.
    model = _mlp(depth=3)
    plan = _profile(model, lambda: model(x).sum().backward()).checkpoint_plan(0.25, runs=False)
    calls: list[int] = []
    for name in plan.modules:
        model.get_submodule(name).register_forward_hook(lambda module, args, output: calls.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with plan.applied(model):
            model(x).sum().backward()
    assert len(calls) == len(plan.modules)
    # Torch's own weight-computing pre-hooks (the older weight_norm) are the recomputation itself: no warning.
    model = _mlp(depth=3)
    for block in list(model)[1:4]:
        nn.utils.weight_norm(block[0])
    plan = _profile(model, lambda: model(x).sum().backward()).checkpoint_plan(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with plan.applied(model):
            pass


def test_a_plan_applied_to_a_model_whose_submodule_was_compiled_says_so() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()),
                          nn.Linear(64, 1))
    x = torch.randn(32, 16)
    plan = _profile(model, lambda: model(x).sum().backward()).checkpoint_plan(0.7)
    assert plan.modules == ["1[0:3]"], plan.modules
    model[1] = torch.compile(model[1])  # (made, not compiled: nothing runs)
    with pytest.raises(ValueError, match=re.escape("'1' of this model was compiled since the profile (model.1 = "
                                                   "torch.compile(...) puts an OptimizedModule in its place)")):
        plan.apply(model)


@dataclasses.dataclass
class _Batch:
    x: torch.Tensor
    scale: float = 1.0
    seen: list = dataclasses.field(default_factory=list)  # what the module reading it appends (an auxiliary loss)


class _TakesContainers(nn.Module):
    """Blocks handed their input in an OrderedDict, a dataclass and (into an LSTM) a PackedSequence."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(12)  # (keeps the root out of the plan: side effects)
        self.mapped = _Reads(lambda inp: (inp.__setitem__("read", True), inp["x"])[1])
        self.boxed = _Reads(lambda inp: (inp.seen.append(1), inp.x * inp.scale)[1])
        self.given: list = []  # the containers of the last call, to see what the modules wrote into them
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mapping = collections.OrderedDict(x=self.norm(self.inp(x)))
        h = self.mapped(mapping)
        batch = _Batch(h, 0.5)
        h = self.boxed(batch)
        self.given = [mapping, batch]
        packed = nn.utils.rnn.pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
        return self.head(self.lstm(packed)[1][0][-1])


class _Reads(nn.Module):
    """Reads its input out of a container, then two layers of its own code: no child to wrap instead of it."""

    def __init__(self, read) -> None:
        super().__init__()
        self.read = read
        self.up, self.down = nn.Parameter(torch.randn(64, 16) / 4), nn.Parameter(torch.randn(16, 64) / 8)

    def forward(self, inp) -> torch.Tensor:
        return torch.tanh(nn.functional.linear(torch.tanh(nn.functional.linear(self.read(inp), self.up)), self.down))


def test_inputs_in_other_containers_are_the_checkpoints_inputs() -> None:
    # Tensors in an OrderedDict, a dataclass or a PackedSequence stayed in the wrapper's closure: the checkpoint
    # did not see them, and the memory measured after the plan read below the prediction (18,560 against 26,752
    # for an OrderedDict; 6,496 against 9,536 for the LSTM's PackedSequence).
    torch.manual_seed(0)
    model = _TakesContainers()
    x, lengths = torch.randn(4, 12, 8), torch.tensor([12, 5, 9, 7])
    step = lambda: model(x, lengths).sum().backward()  # noqa: E731
    plan = _profile(model, step, steps=2).checkpoint_plan(0.3, runs=False)
    assert {"mapped", "boxed", "lstm"} <= set(plan.modules), plan.modules
    model.zero_grad(set_to_none=True)
    out = model(x, lengths)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    result = layerprof.verify_plan(plan, model, step, repeats=1)
    assert result.measured_saved_bytes == result.predicted_saved_bytes
    model.zero_grad(set_to_none=True)
    with plan.applied(model):
        wrapped = model(x, lengths)
        wrapped.sum().backward()
    assert torch.equal(out, wrapped) and all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    # The modules get the caller's containers: what they write reaches it (a copy lost it: an auxiliary loss
    # appended to a list in a dataclass dropped out of training).
    mapping, batch = model.given
    assert mapping["read"] is True and batch.seen[0] == 1


def test_a_run_wrapper_runs_the_sequentials_children_as_they_are_now() -> None:
    # The runs' wrapper ran the children it found when applied: a head swapped for fine-tuning, a block replaced or a
    # module appended while the plan was applied did not run, silently (the old 10-class head gave the outputs).
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)], nn.Linear(16, 10))
    x = torch.randn(8, 16)
    with wrap_runs_applied(model, [(1, 4)]):
        model[2] = nn.Identity()
        model[4] = nn.Linear(16, 3)
        assert torch.equal(model(x), model[4](model[3](model[1](model[0](x)))))
        model.append(nn.Tanh())
        output = model(x)
        assert output.shape == (8, 3) and torch.equal(output, torch.tanh(model[4](model[3](model[1](model[0](x))))))
        output.sum().backward()  # (the run still checkpointed: its recomputation gives the same gradients)
    assert "forward" not in vars(model)


@contextlib.contextmanager
def wrap_runs_applied(model: nn.Sequential, spans: list[tuple[int, int]]) -> Any:
    applied = wrap_runs(model, spans)
    try:
        yield
    finally:
        unwrap(model, applied)


@pytest.mark.parametrize("runs", [False, True], ids=["module", "run"])
def test_remove_leaves_a_forward_another_tool_put_over_the_wrapper(runs: bool) -> None:
    # A tool that puts its own forward on a module (accelerate's hooks keep the old one, ours, inside): remove()
    # deleted that forward, dropping the tool's hook while it was still attached, and the tool's own removal later
    # put the checkpoint wrapper back with no plan to take it off.
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    target = model if runs else model[1]
    applied = wrap_runs(model, [(0, 2)]) if runs else wrap(target)
    inner = target.forward
    seen: list[int] = []

    def tool_forward(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return inner(*args, **kwargs)

    target.forward = tool_forward
    with pytest.warns(RuntimeWarning, match=r"plan.remove\(\): the forward of a (Sequential|Linear) was replaced "
                      r"while the plan was applied"):
        unwrap(target, applied)
    model(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert seen == [1] and vars(target)["forward"] is tool_forward  # the tool's forward kept, and run
    target.forward = inner  # (the tool taking its hook off puts back what it found: the wrapper, now off)
    assert not is_wrapped(target)


def test_prunings_weight_hooks_are_no_hooks_a_plan_warns_of() -> None:
    # torch.nn.utils.prune's forward pre-hook makes the weight from weight_orig and the mask: running it again is
    # the recomputation itself, as weight_norm's is (it warned "those hooks can run twice a step").
    import torch.nn.utils.prune as prune

    model = _mlp(depth=3, width=64)
    for block in model[1:4]:
        prune.l1_unstructured(block[0], "weight", amount=0.5)
    x = torch.randn(16, 16)
    prof = _profile(model, lambda: model(x).sum().backward(), steps=2)
    plan = prof.checkpoint_plan(0.2, runs=False)
    assert plan.modules and all(name in ("", "1", "2", "3") for name in plan.modules)  # (regions holding one)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with plan.applied(model):
            model(x).sum().backward()


class ResidualInPlace(nn.Module):
    """``x += block(x)``: the block's input is modified in place by its caller, after the block returned (a
    Dropout first: nothing of the block saves x itself, so the plain model trains)."""

    def __init__(self) -> None:
        super().__init__()
        # (nested: the inner Sequential and its Dropout are handed x too, and returned before their caller's +=)
        self.block = nn.Sequential(nn.Sequential(nn.Dropout(0.1), nn.Linear(64, 256), nn.GELU()), nn.Linear(256, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        x += self.block(x)
        return x


def test_a_module_whose_input_its_caller_modifies_in_place_is_excluded() -> None:
    # A plan wrapped such a block (nothing excluded), and the first step with the plan failed in backward: the
    # checkpoint holds x for the recomputation, and x's version had moved.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), *[ResidualInPlace() for _ in range(3)], nn.Linear(64, 10))
    x = torch.randn(32, 64)
    prof = _profile(model, lambda: model(x).sum().backward(), steps=2)
    handed_x = [f"{i}.{inner}" for i in (1, 2, 3) for inner in ("block", "block.0", "block.0.0")]
    assert [prof.records[name].checkpoint_inputs_changed_later for name in handed_x] == [1] * 9
    assert prof.records["1"].checkpoint_inputs_changed_later == 0  # (its own input is left as it is)
    assert prof.records["1.block.0.1"].checkpoint_inputs_changed_later == 0  # (handed the Dropout's output)
    for budget in ("80%", "95%"):
        plan = prof.checkpoint_plan(budget, runs=False)
        assert all(plan.excluded[name] == "its input is modified in place after it returns (x += block(x))"
                   for name in handed_x)
        assert not set(handed_x) & set(plan.modules)
        with plan.applied(model):
            model(x).sum().backward()


def test_code_that_reads_a_wrapped_forwards_code_is_told_to_take_the_plan_off() -> None:
    # torch.export and torch.jit.script read forward.__code__ / __globals__: "'_Checkpointed' object has no
    # attribute '__code__'", which said nothing of the plan.
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    applied = wrap(model[0])
    try:
        with pytest.raises(AttributeError, match=r"__code__: this forward is layerprof's checkpoint wrapper \(a "
                           r"checkpoint plan is applied\), not a function: take the plan off"):
            model[0].forward.__code__
        assert not hasattr(model[0].forward, "__func__") and model[0].forward.__name__ == "forward"
    finally:
        unwrap(model[0], applied)


def test_a_wrapper_made_over_an_old_one_keeps_its_own_fields() -> None:
    # functools.update_wrapper copies the wrapped forward's __dict__: a wrapper made over an old wrapper (turned off
    # by remove(), put back by another tool) took its fields, and checkpointed nothing, or ran the old one's forward.
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    first = wrap(model[0], label="old")
    first[1].turn_off()
    model[0].forward = first[1]  # (put back by a tool's removal of its own hook)
    assert not is_wrapped(model[0])
    second = wrap(model[0], label="new")
    assert second[1]._off is False and second[1]._label == "new" and second[1]._forward is first[1]
    assert is_wrapped(model[0])
    unwrap(model[0], second)
    assert vars(model[0])["forward"] is first[1]


@pytest.mark.parametrize("evaluation", [torch.no_grad, torch.inference_mode])
def test_an_evaluation_pass_inside_the_step_changes_neither_the_plan_nor_its_saved_bytes(evaluation: Any) -> None:
    """A no_grad forward of the same input after the training step (an evaluation inside the profiled step) saves
    nothing and is never re-run: its input is nothing a checkpoint keeps, and every module's figures are those of
    the step without it. It used to be counted as kept, so the
    root's wrap read 196,608 bytes freed (the input's 65,536 with it) and the prediction 131,072 against 65,536
    measured."""
    torch.manual_seed(0)
    model = nn.Sequential(*(layer for _ in range(3) for layer in (nn.Linear(256, 256), nn.Tanh())), nn.Linear(256, 1))
    x = torch.randn(64, 256)  # 65,536 bytes
    figures = {}
    for with_eval in (False, True):
        def step() -> None:
            model(x).sum().backward()
            if with_eval:
                with evaluation():
                    model(x)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with LayerProf(model, metrics=("memory",)) as prof:
                for _ in range(2):
                    step()
                    prof.step()
        plan = prof.checkpoint_plan(0.5, wrap_cost=None)
        result = layerprof.verify_plan(plan, model, step, repeats=1)
        assert result.measured_saved_bytes == result.predicted_saved_bytes == plan.saved_bytes_after
        # (which of the plans of equal bytes is chosen follows the times: the modules' figures are compared)
        figures[with_eval] = {name: (record.checkpoint_freed_bytes, record.checkpoint_kept_bytes)
                              for name, record in prof.records.items()}
    assert figures[True] == figures[False]
    assert prof.records[""].checkpoint_kept_bytes == 0  # the model's input needs no grad: nothing to keep


def test_fsdp2s_own_forward_hooks_are_no_reason_to_warn() -> None:
    """FSDP2's pre- and post-forward hooks (torch.distributed's) run again in a recomputation by design, gathering
    the parameters for it: a plan wrapping a unit's parent does not tell the user to take them off. A hook of the
    user's own still warns."""
    def pre_forward(module: nn.Module, args: Any) -> None:
        return None

    def users(module: nn.Module, args: Any) -> None:
        return None

    pre_forward.__module__ = "torch.distributed.fsdp._fully_shard._fsdp_state"
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 1))
    with LayerProf(model, metrics=("memory",)) as prof:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    plan = prof.checkpoint_plan(0.5, wrap_cost=None)
    assert plan.modules
    for hook, warned in ((pre_forward, False), (users, True)):
        handles = [module.register_forward_pre_hook(hook) for module in model.modules()]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with plan.applied(model):
                pass
        for handle in handles:
            handle.remove()
        assert any("carry forward hooks" in str(w.message) for w in caught) == warned


def test_a_plan_applied_to_a_model_of_other_structure_is_refused_or_warned() -> None:
    """Names alone resolve on more models than the profiled one: a plan made on 4 blocks wrapped 6 blocks' first
    four without a word, and one wrapping a block applied where that block held other layers."""
    model, x = _mlp(depth=4), torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.5, wrap_cost=None, runs=False)
    assert plan.modules and all(name in {"1", "2", "3", "4"} for name in plan.modules)
    # Deeper (blocks 5 and 6 added, the last Linear now '7'): the wrapped blocks are as profiled, the figures not.
    deeper = _mlp(depth=6)
    with pytest.warns(UserWarning, match=r"the plan was made on a model other than this one: this one has 12 "
                                         r"module\(s\) the profiled model had not \('6', '7', '5.0' and 9 more\)"):
        plan.apply(deeper)
    assert all(is_wrapped(deeper.get_submodule(name)) for name in plan.modules)
    plan.remove()
    # A wrapped block that holds another layer (same names above it, same type): refused, nothing wrapped.
    grown = _mlp(depth=4)
    target = plan.modules[0]
    grown.get_submodule(target).append(nn.Identity())
    before = _state(grown)
    with pytest.raises(ValueError, match=re.escape(
            f"model: the plan wraps {target!r}, whose modules in this model are not the profiled model's (it has "
            f"'{target}.5' that the profiled one had not); the plan frees and re-runs what the profiled model's held. "
            "Profile this model and plan on that profile")):
        plan.apply(grown)
    assert _state(grown) == before and not plan.is_applied
    # Classes renamed below a wrapped module (as FSDP2's fully_shard does: FSDPLinear) are the same structure.
    renamed = _mlp(depth=4)
    for name in plan.modules:
        layer = renamed.get_submodule(name)[0]
        layer.__class__ = type("FSDPLinear", (nn.Linear,), {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with plan.applied(renamed):
            assert all(is_wrapped(renamed.get_submodule(name)) for name in plan.modules)


def test_a_run_applied_to_a_sequential_whose_children_differ_is_refused() -> None:
    """A plan wrapping runs of the model's children applied to any Sequential with as many children or more."""
    model, x = _mlp(depth=4), torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.5, wrap_cost=None)
    runs = [name for name in plan.modules if parse_run(name)]
    assert runs, plan.modules
    parent, first, _ = parse_run(runs[0])
    other = copy.deepcopy(model)  # one child of the run nests its layer in a Sequential: same names down to it
    holder = other.get_submodule(parent) if parent else other
    holder[first] = nn.Sequential(holder[first])
    inner = f"{parent}.{first}" if parent else str(first)
    with pytest.raises(ValueError, match=re.escape(f"model: the plan wraps {runs[0]!r}, whose modules in this model "
                                                   f"are not the profiled model's (it has '{inner}.0' that the "
                                                   "profiled one had not)")):
        plan.apply(other)
    assert not any(is_wrapped(module) for module in other.modules())


def test_a_plan_deep_copied_alone_while_applied_is_a_plan_not_applied() -> None:
    """Deep-copied alone while applied, a plan carried copies of the wrapped modules and read applied: apply() refused
    the model it was made for ("already applied") until remove() unwrapped the orphans. (Copied with its model, it
    stays applied to the copy's modules: ``test_a_plan_copied_with_its_model_removes_the_copys_wrappers``.)"""
    model, x = _mlp(depth=3), torch.randn(8, 16)
    prof = _profile(model, lambda: model(x).sum().backward())
    plan = prof.checkpoint_plan(0.5, runs=False)
    expected = _run(model, x)
    with plan.applied(model):
        other = copy.deepcopy(plan)
        assert plan.is_applied and is_wrapped(model.get_submodule(plan.modules[0]))
    fresh = _mlp(depth=3)
    assert not other.is_applied and other.modules == plan.modules
    with other.applied(fresh):
        assert all(is_wrapped(fresh.get_submodule(name)) for name in plan.modules)
        got = _run(fresh, x)
    assert not any(is_wrapped(module) for module in fresh.modules())
    assert torch.equal(got[0], expected[0]) and all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
